"""The interactive tail under stragglers: no defence, a first-token deadline, hedging.

    python -m benchmarks.tail [--rate 10] [--duration 40] [--saturate 30] [--saturate-duration 20]
                              [--stall 5] [--stall-rate 0.02] [--seed 0] [--repeat-none]
                              [--simulated-only] [--runs none,deadline,hedge,auto,p95]

Two vLLM emulators (one rank of ``max_num_seqs=4`` each, about 23 requests/s between them,
so that a saturating rate stays within what one Python client sends), each stalling
``--stall-rate`` of its requests ``--stall`` seconds before the first content token
(``faults.first_token_stall``; the headers and the role chunk come at once). One router in
front, round-robin, and per run one of:

- ``none``: no ``tail`` settings;
- ``deadline``: ``first_token_timeout: 1.0``;
- ``hedge``: ``hedge: {after: 0.3, max_fraction: 0.05}``;
- ``auto``: ``first_token_timeout: auto`` (``auto_max: 2``), and ``p95``: ``hedge: {after:
  p95, max_fraction: 0.05}``, only when ``--runs`` names them (it picks the runs, in order;
  the default is ``none,deadline,hedge``).

Open-loop Poisson arrivals of streamed chat requests (the same schedule for every run: a
distinct 40-word prompt each, 32 output tokens), at a moderate ``--rate`` and then at a
saturating one. Printed per run: client-side TTFT P50/P95/P99 (ms, to the first content
event), errors, the extra upstream requests (prompt tokens the engines received beyond those
the answers carried, in requests), the router's hedges and missed deadlines, and
``turnout_hedge_wasted_tokens_total``. ``--repeat-none`` runs ``none`` twice (an A/A pair:
the noise between identical runs).

Under each live row, ``sim`` is the same run in ``replay simulate`` (replay.simulate, in
virtual time, in-process): the same schedule and bodies as a capture file, the same router
config with the two backends as ``emulator:`` blocks of the same settings and seeds. Its
extra requests, hedges, missed deadlines and wasted tokens are what the simulated router
counted (``simulation.tail`` in simulate's report). ``--simulated-only`` prints just those
rows (no processes: a second or so).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from emulator.simulate import percentile
from replay.client import Result
from replay.plan import Plan, PlanOptions
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Source
from router.config.parse import parse_config
from router.server.children import spawn_ready, stop_all
from turnout.common.sse import StreamMeter

MODEL = "deepseek-v4.1-flash"
DEFENCES: dict[str, dict[str, Any]] = {
    "none": {},
    "deadline": {"first_token_timeout": 1.0},
    "hedge": {"hedge": {"after": 0.3, "max_fraction": 0.05}},
    # the deadline and the hedge delay from measured TTFTs (only when --runs names them)
    "auto": {"first_token_timeout": "auto", "auto_max": 2.0},
    "p95": {"hedge": {"after": "p95", "max_fraction": 0.05}},
}
OUTPUT = 32


@dataclass
class Run:
    label: str
    ttfts: list[float] = field(default_factory=list)
    errors: int = 0
    prompt_tokens: int = 0
    upstream_prompt_tokens: float = 0.0
    router: dict[str, float] = field(default_factory=dict)
    extra: float | None = None
    """Extra requests as counted (simulated); None: from the engines' prompt tokens (live)."""

    def row(self) -> str:
        ms = [1e3 * percentile(self.ttfts, q) for q in (50, 95, 99)]
        per = self.prompt_tokens / max(1, len(self.ttfts))
        extra = self.extra
        if extra is None:
            extra = (self.upstream_prompt_tokens - self.prompt_tokens) / per if per else 0.0
        share = 100 * extra / max(1, len(self.ttfts) + self.errors)
        r = self.router
        return (
            f"| {self.label} | {len(self.ttfts)} | {self.errors} | {ms[0]:.0f} | {ms[1]:.0f} | "
            f"{ms[2]:.0f} | {extra:.0f} ({share:.1f}%) | {r['hedges']:.0f} | "
            f"{r['missed']:.0f} | {r['wasted']:.0f} |"
        )


def _engine(stall: float, rate: float) -> dict[str, Any]:
    """Each emulator's profile keys (``--set`` live, ``emulator.set`` simulated)."""
    return {"ranks": 1, "max_num_seqs": 4, "faults.first_token_stall_rate": rate,
            "faults.first_token_stall": stall}  # fmt: skip


def _router(backends: list[dict[str, Any]], tail: dict[str, Any]) -> dict[str, Any]:
    """The router's config over ``backends``, with ``tail`` for the interactive class."""
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": backends,
        "default_policy": "rr",
        "policies": {"rr": {"type": "round-robin"}},
        "health": {"scrape_interval": 0.2},
        "access_log": {"enabled": False},
    }
    if tail:
        doc["tail"] = {"interactive": tail}
    return doc


@contextlib.contextmanager
def _processes(
    stall: float, rate: float, tail: dict[str, Any], seed: int
) -> Iterator[tuple[str, list[str]]]:
    """Two stalling emulators and a router over them; yields the router's and theirs."""
    procs = []
    try:
        urls = []
        for i in range(2):
            argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port",
                    "0", "--seed", str(seed + i)]  # fmt: skip
            for key, value in _engine(stall, rate).items():
                argv += ["--set", f"{key}={value}"]
            proc, url = spawn_ready(argv, "emulator listening on", 30)
            procs.append(proc)
            urls.append(url)
        backends = [{"name": f"e{i}", "engine": "vllm", "url": u} for i, u in enumerate(urls)]
        directory = Path(tempfile.mkdtemp(prefix="tail-bench-"))
        path = directory / "router.yaml"
        path.write_text(yaml.safe_dump(_router(backends, tail)))
        argv = [sys.executable, "-m", "turnout", "serve", "--port", "0", "--config", str(path)]
        router, url = spawn_ready(argv, "turnout listening on", 30)
        procs.append(router)
        yield url, urls
    finally:
        stop_all(procs, 10)


def _simulated(
    schedule: list[float], stall: float, rate: float, tail: dict[str, Any], seed: int
) -> Run:
    """The same run in ``replay simulate``, in virtual time (see the module)."""
    backends = [
        {"name": f"e{i}", "engine": "vllm",
         "emulator": {"profile": "vllm", "seed": seed + i, "set": _engine(stall, rate)}}
        for i in range(2)
    ]  # fmt: skip
    rows = [
        {"custom_id": f"r-{i}", "url": "/v1/chat/completions", "body": _body(i),
         "t_offset_ms": at * 1e3}
        for i, at in enumerate(schedule)
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tail-sim-") as directory:
        trace = Path(directory) / "trace.jsonl"
        trace.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
        world = World(parse_config(_router(backends, tail)), {})
        results: list[Result] = []
        sim = Simulation(world, world.policies["rr"], "rr", lambda i, r, t: results.append(r))
        sim.run(Plan(Source(str(trace), model=world.model()), PlanOptions()))
    run = Run("sim")
    for r in results:
        if r.ok and r.ttft is not None:
            run.ttfts.append(r.ttft)
        else:
            run.errors += 1
    c = sim.tails.counts
    run.router = {"hedges": c.hedges, "missed": c.missed, "wasted": c.wasted_tokens}
    run.extra = c.extra
    return run


def _body(i: int) -> dict[str, Any]:
    words = " ".join(f"w{(i * 7 + k) % 997}" for k in range(40))
    return {
        "model": MODEL, "messages": [{"role": "user", "content": f"r{i} {words}"}],
        "max_tokens": OUTPUT, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


def _schedule(rate: float, duration: float, seed: int) -> list[float]:
    """Poisson arrival times (seconds), the same for every run, live or simulated."""
    rng, at, out = random.Random(seed), 0.0, []
    while at < duration:
        out.append(at)
        at += rng.expovariate(rate)
    return out


async def _one(session: aiohttp.ClientSession, url: str, i: int, run: Run) -> None:
    start = time.perf_counter()
    meter = StreamMeter(start)
    try:
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(_body(i))) as resp:
            if resp.status != 200:
                run.errors += 1
                await resp.read()
                return
            async for data in resp.content.iter_any():
                meter.feed(data, time.perf_counter())
    except aiohttp.ClientError:
        run.errors += 1
        return
    if meter.first_content is None or not meter.done:
        run.errors += 1
        return
    run.ttfts.append(meter.first_content - start)
    run.prompt_tokens += meter.prompt_tokens or 0


async def _metrics(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


def _sum(text: str, name: str) -> float:
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


async def _load(url: str, engines: list[str], schedule: list[float], run: Run) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        tasks = []
        for i, at in enumerate(schedule):  # against the absolute start: no drift
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, i, run)))
        await asyncio.gather(*tasks)
        text = await _metrics(session, url)
        run.router = {
            "hedges": _sum(text, "turnout_hedges_total"),
            "missed": _sum(text, "turnout_first_token_deadlines_missed_total"),
            "wasted": _sum(text, "turnout_hedge_wasted_tokens_total"),
        }
        for e in engines:
            run.upstream_prompt_tokens += _sum(
                await _metrics(session, e), "vllm:prompt_tokens_total"
            )


HEADER = (
    "| run | answered | errors | P50 TTFT ms | P95 | P99 | extra requests | hedges | "
    "missed deadlines | hedge-wasted tokens |\n|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=float, default=10.0, help="moderate load, requests/s")
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--saturate", type=float, default=30.0, help="saturating load, requests/s")
    p.add_argument("--saturate-duration", type=float, default=20.0)
    p.add_argument("--stall", type=float, default=5.0)
    p.add_argument("--stall-rate", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat-none", action="store_true", help="an A/A pair of `none` runs")
    p.add_argument("--simulated-only", action="store_true", help="no live runs")
    p.add_argument("--runs", default="none,deadline,hedge", help="of: " + ",".join(DEFENCES))
    args = p.parse_args(argv)
    runs = args.runs.split(",")
    if not runs or any(r not in DEFENCES for r in runs):
        p.error(f"--runs takes names of: {', '.join(DEFENCES)}")
    for load, rate, duration in (("moderate", args.rate, args.duration),
                                 ("saturated", args.saturate, args.saturate_duration)):  # fmt: skip
        print(f"\n{load}: {rate:g} requests/s for {duration:g} s, {args.stall_rate:.0%} of "
              f"requests stalling {args.stall:g} s before the first token\n")  # fmt: skip
        print(HEADER, flush=True)
        schedule = _schedule(rate, duration, args.seed)
        pair = args.repeat_none and not args.simulated_only
        labels = [x for r in runs for x in ([r, r] if pair and r == "none" else [r])]
        for i, label in enumerate(labels):
            tail = DEFENCES[label]
            if not args.simulated_only:
                run = Run(label)
                with _processes(args.stall, args.stall_rate, tail, args.seed) as (url, engines):
                    asyncio.run(_load(url, engines, schedule, run))
                print(run.row(), flush=True)
            if i + 1 < len(labels) and labels[i + 1] == label:
                continue  # the A/A pair's first: one simulated row for both
            sim = _simulated(schedule, args.stall, args.stall_rate, tail, args.seed)
            sim.label = f"{label} (sim)"
            print(sim.row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
