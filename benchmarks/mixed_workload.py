"""Mixed interactive + batch traffic through the embedded default, once per policy.

``--grid`` (issue 17): the whole grid in virtual time through ``replay simulate``'s loop
(benchmarks/mixed_sim.py) at the shipped time scale, batch workers x interactive rate x run
length, each cell's round-robin, class-split and adaptive figures, adaptive's TTFT
prediction error and the verdict; then a live spot check of three cells against the real
embedded default at its shipped time scale (``--live-time-scale`` speeds it up, at the
cost of the wall-clock jitter of a loaded machine growing with it), with the error read
from the router's /metrics::

    .venv/bin/python -m benchmarks.mixed_workload --grid [--live-time-scale 1]

Without ``--grid``, the live comparison of every policy at two load levels:

For each interactive load level and each policy a fresh embedded default is started (the
router and its two emulated engines, ``vllm`` and ``deepinfer``, time-scaled so the whole
benchmark takes a few minutes), then, for ``--duration`` model seconds:

* interactive: open loop, Poisson arrivals at ``--light`` / ``--heavy`` requests per model
  second, streaming chat, prompts 500-2,000 tokens, outputs 100-300;
* batch: a closed loop of ``--batch-concurrency`` workers, non-streamed chat marked
  ``X-Request-Class: batch``, prompts 6,000-8,192 tokens, outputs 512-1,024.

Every figure is in model seconds (wall time x time scale). The router's time-based settings
(SLOs, prefill and TPOT priors, scrape interval) are scaled the same way, so the policies
see the time-scaled engines as they would see real ones. Batch throughput counts output
tokens of batch requests finished within the window. SLO attainment uses the adaptive
policy's configured per-class SLOs (a non-streamed response's TTFT is its whole latency)::

    .venv/bin/python -m benchmarks.mixed_workload [--time-scale 5] [--duration 120]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
import yaml

from benchmarks.mixed_sim import COMPARED, HEADER, Cell, Figures, row, run_cell
from policies.types import Outcome, Slo
from router.config.parse import load_document, parse_config
from router.server.children import spawn_ready, stop_all
from turnout.common.sse import StreamMeter

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "config" / "router.yaml"
POLICIES = ("vllm-only", "deepinfer-only", "round-robin", "least-outstanding", "class-split",
            "adaptive")  # fmt: skip
MODEL = "deepseek-v4.1-flash"
# Chat template cost under turnout/common/tokens.py: one message (4) plus the reply opener (2).
TEMPLATE_TOKENS = 6
TARGETS = {"light": 1.15, "heavy": 1.05}
"""Batch throughput that adaptive must reach, as a multiple of class-split's."""
P95_RATIO = 0.6


@dataclass
class Result:
    """One finished (or failed) request, in model seconds."""

    cls: str
    ok: bool
    ttft: float | None
    tpot: float | None
    e2e: float
    output: int
    end: float
    backend: str


@dataclass
class Run:
    policy: str
    results: list[Result] = field(default_factory=list)


def chat_body(i: int, prompt: int, output: int, *, stream: bool) -> bytes:
    """A chat request of exactly ``prompt`` tokens (the shared rule) and ``output`` tokens."""
    words = " ".join(["w"] * (prompt - TEMPLATE_TOKENS - 1))
    doc: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"q{i} {words}"}],
        "max_tokens": output,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        doc["stream_options"] = {"include_usage": True}
    return orjson.dumps(doc)


async def one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    cls: str,
    scale: float,
    t0: float,
) -> Result:
    start = time.perf_counter()
    meter = StreamMeter(start)
    backend, status, streamed = "none", 0, False
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            status, backend = resp.status, resp.headers.get("X-Turnout-Backend", "none")
            streamed = resp.headers.get("Content-Type", "").startswith("text/event-stream")
            if streamed:
                async for data in resp.content.iter_any():
                    meter.feed(data, time.perf_counter())
            else:
                meter.feed_body(await resp.read(), time.perf_counter())
    except (aiohttp.ClientError, TimeoutError):
        pass
    end = time.perf_counter()
    fig = meter.figures(end)
    # A whole (non-streamed) response has no per-token timing: its pace is E2E / tokens.
    tpot = fig.tpot if streamed else None
    ok = status == 200 and fig.error is None and bool(fig.completion_tokens)
    return Result(
        cls=cls,
        ok=ok,
        ttft=None if fig.ttft is None else fig.ttft * scale,
        tpot=None if tpot is None else tpot * scale,
        e2e=(end - start) * scale,
        output=fig.completion_tokens or 0,
        end=(end - t0) * scale,
        backend=backend,
    )


async def workload(url: str, policy: str, rate: float, args: argparse.Namespace) -> Run:
    """Drive one router for ``args.duration`` model seconds; collect every request."""
    scale, duration = args.time_scale, args.duration
    # Separate streams: the interactive arrivals are the same for every policy, however the
    # batch loop's pace (which depends on the policy) consumes its own draws.
    rng, batch_rng = random.Random(args.seed), random.Random(args.seed + 1)
    run = Run(policy)
    endpoint = url + "/v1/chat/completions"
    policy_header = {"X-Turnout-Policy": policy}
    batch_headers = {**policy_header, "X-Request-Class": "batch"}
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        t0 = time.perf_counter()
        stop = t0 + duration / scale
        counter = iter(range(10**9))

        async def batch_worker() -> None:
            while time.perf_counter() < stop:
                body = chat_body(
                    next(counter),
                    batch_rng.randint(6000, 8192),
                    batch_rng.randint(512, 1024),
                    stream=False,
                )
                run.results.append(
                    await one(session, endpoint, body, batch_headers, "batch", scale, t0)
                )

        async def interactive(body: bytes) -> None:
            run.results.append(
                await one(session, endpoint, body, policy_header, "interactive", scale, t0)
            )

        workers = [asyncio.create_task(batch_worker()) for _ in range(args.batch_concurrency)]
        arrivals: list[asyncio.Task[None]] = []
        at = t0
        while True:  # absolute schedule: a late wake-up does not shift later arrivals
            at += rng.expovariate(rate) / scale
            if at >= stop:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            body = chat_body(
                next(counter), rng.randint(500, 2000), rng.randint(100, 300), stream=True
            )
            arrivals.append(asyncio.create_task(interactive(body)))
        await asyncio.sleep(max(0.0, stop - time.perf_counter()))
        # Interactive requests that arrived in the window finish; batch ones still open are
        # cut (their tokens fall outside the window anyway).
        await asyncio.wait_for(asyncio.gather(*arrivals), timeout=120)
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    return run


def scaled_config(base: Path, scale: float, seed: int) -> dict[str, Any]:
    """The embedded default with time-scaled engines and time-scaled router settings."""
    doc: dict[str, Any] = yaml.safe_load(base.read_text(encoding="utf-8"))
    doc["listen"]["port"] = 0
    for b in doc["backends"]:
        b["emulator"]["time_scale"] = scale
        b["emulator"]["seed"] = seed
    health = doc.setdefault("health", {})
    for key in ("scrape_interval", "scrape_stale_after"):
        health[key] = health.get(key, 1.0) / scale
    for spec in doc["policies"].values():
        if spec["type"] != "adaptive":
            continue
        params = spec["params"]
        for slo in params.get("slo", {}).values():
            for k in ("ttft_s", "tpot_s"):
                if k in slo:
                    slo[k] = slo[k] / scale
        for key, factor in (("prefill_rate_prior", scale), ("tpot_prior_s", 1 / scale)):
            prior = params.get(key)
            if isinstance(prior, dict):
                params[key] = {k: v * factor for k, v in prior.items()}
            elif prior is not None:
                params[key] = prior * factor
    return doc


def config_slos(base: Path) -> dict[str, Slo]:
    """The adaptive policy's per-class SLOs in the unscaled config (model seconds)."""
    doc = yaml.safe_load(base.read_text(encoding="utf-8"))
    adaptive = next(s for s in doc["policies"].values() if s["type"] == "adaptive")
    return {cls: Slo(v["ttft_s"], v["tpot_s"]) for cls, v in adaptive["params"]["slo"].items()}


def start_router(config: Mapping[str, Any], directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    path = directory / "router.yaml"
    path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path), "--port", "0"]
    return spawn_ready(argv, "turnout listening on", 60)


def stop(proc: subprocess.Popen[bytes]) -> None:
    stop_all([proc], 20)


@dataclass(frozen=True)
class ClassFigures:
    n: int
    failed: int
    p50_ttft: float
    p95_ttft: float
    mean_tpot: float
    tokens_per_s: float
    attainment: float
    on_vllm: int


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summarize(run: Run, cls: str, slo: Slo, duration: float) -> ClassFigures:
    rs = [r for r in run.results if r.cls == cls]
    ok = [r for r in rs if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [r.tpot if r.tpot is not None else r.e2e / r.output for r in ok]
    in_window = sum(r.output for r in ok if r.end <= duration)
    met = sum(
        slo.met(Outcome(200 if r.ok else 500, r.ok, 0, r.output, r.ttft, r.e2e, r.tpot)) for r in rs
    )
    return ClassFigures(
        n=len(rs),
        failed=len(rs) - len(ok),
        p50_ttft=percentile(ttfts, 0.5),
        p95_ttft=percentile(ttfts, 0.95),
        mean_tpot=statistics.fmean(tpots) if tpots else float("nan"),
        tokens_per_s=in_window / duration,
        attainment=met / len(rs) if rs else float("nan"),
        on_vllm=sum(1 for r in rs if r.backend == "vllm"),
    )


def print_level(level: str, rate: float, figs: Mapping[str, Mapping[str, ClassFigures]]) -> None:
    print(f"\n== {level} interactive load: {rate:g} req/s ==", flush=True)
    print(f"{'policy':<18} {'class':<12} {'n':>5} {'fail':>4} {'P50 TTFT':>9} {'P95 TTFT':>9} "
          f"{'mean TPOT':>10} {'out tok/s':>10} {'SLO att':>8} {'on vllm':>8}")  # fmt: skip
    for policy, by_class in figs.items():
        for cls, f in by_class.items():
            print(f"{policy:<18} {cls:<12} {f.n:>5} {f.failed:>4} {f.p50_ttft:>9.3f} "
                  f"{f.p95_ttft:>9.3f} {f.mean_tpot:>10.4f} {f.tokens_per_s:>10.0f} "
                  f"{f.attainment:>8.2f} {f.on_vllm:>8}")  # fmt: skip


def print_targets(
    level: str, figs: Mapping[str, Mapping[str, ClassFigures]], slo: Mapping[str, Slo]
) -> bool:
    """Adaptive against its targets, with class-split beside it; True when all are met."""
    need = {"adaptive", "round-robin", "class-split"}
    if not need <= figs.keys():
        return True
    a, rr, cs = figs["adaptive"], figs["round-robin"], figs["class-split"]
    p95_ratio = a["interactive"].p95_ttft / rr["interactive"].p95_ttft
    batch_ratio = a["batch"].tokens_per_s / cs["batch"].tokens_per_s
    cs_ratio = cs["interactive"].p95_ttft / rr["interactive"].p95_ttft
    failed = sum(f.failed for f in a.values())
    checks = [
        (f"adaptive interactive P95 TTFT {a['interactive'].p95_ttft:.3f} s = "
         f"{p95_ratio:.2f} x round-robin's (target <= {P95_RATIO}); "
         f"class-split: {cs['interactive'].p95_ttft:.3f} s = {cs_ratio:.2f} x",
         p95_ratio <= P95_RATIO),
        (f"adaptive batch {a['batch'].tokens_per_s:.0f} tok/s = {batch_ratio:.2f} x "
         f"class-split's {cs['batch'].tokens_per_s:.0f} (target >= {TARGETS[level]})",
         batch_ratio >= TARGETS[level]),
        (f"adaptive failed requests: {failed} (target 0)", failed == 0),
    ]  # fmt: skip
    within = a["interactive"].p95_ttft <= slo["interactive"].ttft_s
    slo_text = f"adaptive interactive P95 TTFT within the SLO of {slo['interactive'].ttft_s:g} s"
    if level == "light":  # the issue sets this target at light load only
        checks.insert(1, (slo_text, within))
    print(f"-- targets at {level} load --")
    for text, ok in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {text}")
    if level != "light":
        print(f"  [info] {slo_text}: {'yes' if within else 'no'} (a target at light load only)")
    return all(ok for _, ok in checks)


_ERROR = re.compile(
    r'^turnout_policy_ttft_prediction_error_ratio\{backend="([^"]+)",policy="adaptive"\} (\S+)$',
    re.M,
)


def live_cell(config: Mapping[str, Any], cell: Cell, slo: Slo, args: argparse.Namespace) -> str:
    """One cell against the real embedded default, each policy on a fresh router."""
    run_args = argparse.Namespace(
        time_scale=args.live_time_scale,
        duration=cell.duration,
        seed=args.seed,
        batch_concurrency=cell.workers,
    )
    figs: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for policy in COMPARED:
            proc, url = start_router(config, Path(tmp))
            try:
                run = uvloop.run(workload(url, policy, cell.rate, run_args))
                text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
            finally:
                stop(proc)
            i = summarize(run, "interactive", slo, cell.duration)
            b = summarize(run, "batch", slo, cell.duration)
            mape = {m[1]: float(m[2]) for m in _ERROR.finditer(text) if m[2] != "NaN"}
            figs[policy] = Figures(i.p95_ttft, i.attainment, b.tokens_per_s, b.on_vllm, b.n, mape)
    return row(cell, figs, slo.ttft_s, "  (live)")


def grid(args: argparse.Namespace) -> int:
    """The virtual-time grid, then the live spot check; 0 when no cell misses."""
    base = parse_config(load_document(str(args.config)))
    slo = config_slos(args.config)["interactive"]
    print(f"virtual time, shipped time scale; interactive SLO TTFT {slo.ttft_s:g} s; P95 TTFT "
          "in s, batch output tok/s; x cs: adaptive's batch over class-split's")  # fmt: skip
    print(HEADER, flush=True)
    lines = []
    for duration in args.durations:
        for workers in args.workers:
            for rate in args.rates:
                cell = Cell(workers, rate, duration, args.seed)
                figs = {p: run_cell(base, p, cell, slo) for p in COMPARED}
                lines.append(row(cell, figs, slo.ttft_s))
                print(lines[-1], flush=True)
    if args.live_cells:
        config = scaled_config(args.config, args.live_time_scale, args.seed)
        print(f"live spot check, time scale {args.live_time_scale:g}:")
        for spec in args.live_cells:
            workers, rate, duration = spec.split(":")
            cell = Cell(int(workers), float(rate), float(duration), args.seed)
            lines.append(live_cell(config, cell, slo, args))
            print(lines[-1], flush=True)
    missed = [line for line in lines if "DOMINATED" in line or "MISSED" in line or "MAPE" in line]
    print(f"{len(missed)} of {len(lines)} cells miss")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--time-scale", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=120.0, help="model seconds per run")
    p.add_argument("--light", type=float, default=1.0, help="interactive req/s (model time)")
    p.add_argument("--heavy", type=float, default=5.0, help="interactive req/s (model time)")
    p.add_argument("--batch-concurrency", type=int, default=32)
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument("--levels", nargs="+", default=["light", "heavy"], choices=["light", "heavy"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grid", action="store_true", help="issue 17's grid (see the docstring)")
    p.add_argument("--workers", nargs="+", type=int, default=[4, 12, 32, 64])
    p.add_argument("--rates", nargs="+", type=float, default=[0.5, 2.0, 8.0])
    p.add_argument("--durations", nargs="+", type=float, default=[60.0, 300.0])
    p.add_argument("--live-time-scale", type=float, default=1.0)
    p.add_argument(
        "--live-cells",
        nargs="*",
        default=["12:2:60", "32:0.5:60", "64:8:60"],
        metavar="WORKERS:RATE:SECONDS",
    )
    args = p.parse_args(argv)
    if args.grid:
        return grid(args)
    slo = config_slos(args.config)
    config = scaled_config(args.config, args.time_scale, args.seed)
    print(f"time scale {args.time_scale:g}, {args.duration:g} model s per run, batch closed "
          f"loop x{args.batch_concurrency}; SLOs: " + ", ".join(
              f"{c} TTFT {s.ttft_s:g} s / TPOT {s.tpot_s:g} s" for c, s in slo.items()),
          flush=True)  # fmt: skip
    all_met = True
    with tempfile.TemporaryDirectory() as tmp:
        for level in args.levels:
            rate = args.light if level == "light" else args.heavy
            figs: dict[str, dict[str, ClassFigures]] = {}
            for policy in args.policies:
                proc, url = start_router(config, Path(tmp))
                try:
                    run = uvloop.run(workload(url, policy, rate, args))
                finally:
                    stop(proc)
                figs[policy] = {
                    cls: summarize(run, cls, slo[cls], args.duration)
                    for cls in ("interactive", "batch")
                }
                i, b = figs[policy]["interactive"], figs[policy]["batch"]
                print(f"  {level} {policy}: interactive P95 TTFT {i.p95_ttft:.3f} s, "
                      f"batch {b.tokens_per_s:.0f} tok/s", flush=True)  # fmt: skip
            print_level(level, rate, figs)
            all_met = print_targets(level, figs, slo) and all_met
    return 0 if all_met else 1


if __name__ == "__main__":
    sys.exit(main())
