"""The interactive tail under stragglers: no defence, a first-token deadline, hedging.

    python -m benchmarks.tail [--rate 10] [--duration 40] [--saturate 30] [--saturate-duration 20]
                              [--stall 5] [--stall-rate 0.02] [--seed 0] [--repeat-none]

Two vLLM emulators (one rank of ``max_num_seqs=4`` each, about 23 requests/s between them,
so that a saturating rate stays within what one Python client sends), each stalling
``--stall-rate`` of its requests ``--stall`` seconds before the first content token
(``faults.first_token_stall``; the headers and the role chunk come at once). One router in
front, round-robin, and per run one of:

- ``none``: no ``tail`` settings;
- ``deadline``: ``first_token_timeout: 1.0``;
- ``hedge``: ``hedge: {after: 0.3, max_fraction: 0.05}``.

Open-loop Poisson arrivals of streamed chat requests (the same schedule for every run: a
distinct 40-word prompt each, 32 output tokens), at a moderate ``--rate`` and then at a
saturating one. Printed per run: client-side TTFT P50/P95/P99 (ms, to the first content
event), errors, the extra upstream requests (prompt tokens the engines received beyond those
the answers carried, in requests), the router's hedges and missed deadlines, and
``turnout_hedge_wasted_tokens_total``. ``--repeat-none`` runs ``none`` twice (an A/A pair:
the noise between identical runs).
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
from router.server.children import spawn_ready, stop_all
from turnout.common.sse import StreamMeter

MODEL = "deepseek-v4.1-flash"
DEFENCES: dict[str, dict[str, Any]] = {
    "none": {},
    "deadline": {"first_token_timeout": 1.0},
    "hedge": {"hedge": {"after": 0.3, "max_fraction": 0.05}},
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

    def row(self) -> str:
        ms = [1e3 * percentile(self.ttfts, q) for q in (50, 95, 99)]
        per = self.prompt_tokens / max(1, len(self.ttfts))
        extra = (self.upstream_prompt_tokens - self.prompt_tokens) / per if per else 0.0
        share = 100 * extra / max(1, len(self.ttfts) + self.errors)
        r = self.router
        return (
            f"| {self.label} | {len(self.ttfts)} | {self.errors} | {ms[0]:.0f} | {ms[1]:.0f} | "
            f"{ms[2]:.0f} | {extra:.0f} ({share:.1f}%) | {r['hedges']:.0f} | "
            f"{r['missed']:.0f} | {r['wasted']:.0f} |"
        )


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
                    "0", "--seed", str(seed + i), "--set", "ranks=1", "--set", "max_num_seqs=4",
                    "--set", f"faults.first_token_stall_rate={rate}",
                    "--set", f"faults.first_token_stall={stall}"]  # fmt: skip
            proc, url = spawn_ready(argv, "emulator listening on", 30)
            procs.append(proc)
            urls.append(url)
        doc: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "backends": [{"name": f"e{i}", "engine": "vllm", "url": u} for i, u in enumerate(urls)],
            "default_policy": "rr",
            "policies": {"rr": {"type": "round-robin"}},
            "health": {"scrape_interval": 0.2},
            "access_log": {"enabled": False},
        }
        if tail:
            doc["tail"] = {"interactive": tail}
        directory = Path(tempfile.mkdtemp(prefix="tail-bench-"))
        path = directory / "router.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv = [sys.executable, "-m", "turnout", "serve", "--port", "0", "--config", str(path)]
        router, url = spawn_ready(argv, "turnout listening on", 30)
        procs.append(router)
        yield url, urls
    finally:
        stop_all(procs, 10)


def _body(i: int) -> bytes:
    words = " ".join(f"w{(i * 7 + k) % 997}" for k in range(40))
    return orjson.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": f"r{i} {words}"}],
        "max_tokens": OUTPUT, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })  # fmt: skip


async def _one(session: aiohttp.ClientSession, url: str, i: int, run: Run) -> None:
    start = time.perf_counter()
    meter = StreamMeter(start)
    try:
        async with session.post(url + "/v1/chat/completions", data=_body(i)) as resp:
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


async def _load(url: str, engines: list[str], rate: float, duration: float, seed: int,
                run: Run) -> None:  # fmt: skip
    rng = random.Random(seed)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        t0 = time.perf_counter()
        at, i, tasks = 0.0, 0, []
        while at < duration:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, i, run)))
            i += 1
            at += rng.expovariate(rate)
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
    args = p.parse_args(argv)
    for load, rate, duration in (("moderate", args.rate, args.duration),
                                 ("saturated", args.saturate, args.saturate_duration)):  # fmt: skip
        print(f"\n{load}: {rate:g} requests/s for {duration:g} s, {args.stall_rate:.0%} of "
              f"requests stalling {args.stall:g} s before the first token\n")  # fmt: skip
        print(HEADER, flush=True)
        labels = ["none", "none"] if args.repeat_none else ["none"]
        for label in [*labels, "deadline", "hedge"]:
            run = Run(label)
            with _processes(args.stall, args.stall_rate, DEFENCES[label], args.seed) as (
                url,
                engines,
            ):
                asyncio.run(_load(url, engines, rate, duration, args.seed, run))
            print(run.row(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
