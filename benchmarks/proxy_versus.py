"""Turnout against vllm-router (the Rust router) in front of the same upstream, one run.

    python -m benchmarks.proxy_overhead --versus [--rounds 3] [--pin]

Both proxies get one worker (vllm-router: ``TOKIO_WORKER_THREADS=1``) and the same loads,
alternated with a direct run for ``--rounds`` rounds (medians printed, so a burst of other
load on the shared machine hits every side): 64 closed-loop streams paced 5 ms a chunk, at 16
and at 64 chunks a stream, then non-streamed one-chunk answers. Per proxy it prints the CPU
seconds per 1,000 chunks at both lengths (utime+stime from /proc), the fit of cost per chunk
= per-chunk + per-request / chunks over the two lengths, the added TTFT P50 (proxy minus
direct) and the non-streamed requests per CPU second (what one busy core would serve), then
issue 18's targets marked met or missed. Two more rows are benchmarks/proxy_floor.py, the
router's server and upstream sides with none of its request handling, the least any change to
that handling could reach: ``floor`` on aiohttp's server, ``floor-lean`` on the lean server
that serves the router's proxied routes (router/server/wire.py). Without ``vllm-router`` on
the PATH (``pip install vllm-router``) it says so and prints the other rows alone.
"""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

import uvloop

from benchmarks.prefix_routing import start_vllm_router as start_vllm_router_in
from benchmarks.prefix_routing import vllm_router_binary
from benchmarks.proxy_overhead import _cpu_seconds, _load, _pct

LENGTHS = (16, 64)
STREAMS = 64
STREAMS_PER_RUN = 12 * STREAMS  # enough CPU time per run to dwarf the figure's noise
GAP_MS = 5.0
PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Proxy:
    name: str
    url: str
    pid: int


@dataclass(frozen=True)
class Figures:
    """One proxy's medians over the rounds (seconds, except where named)."""

    cpu_per_1k: dict[int, float]
    """CPU s per 1,000 chunks, by stream length."""
    ttft50: float
    """Added TTFT P50 (proxy minus direct), at the shorter length."""
    rps_per_core: float
    """Non-streamed one-chunk requests per CPU second of the proxy."""

    def fit(self) -> tuple[float, float]:
        """(per chunk, per request) in seconds, from cost = a + b / chunks at both lengths."""
        (n1, n2) = LENGTHS
        c1, c2 = self.cpu_per_1k[n1] / 1000, self.cpu_per_1k[n2] / 1000
        per_request = (c1 - c2) / (1 / n1 - 1 / n2)
        return c2 - per_request / n2, per_request


def start_vllm_router(upstream: str, directory: Path) -> tuple[subprocess.Popen[bytes] | None, str]:
    """vllm-router on one tokio worker in front of ``upstream``: (process, URL), or (None, why
    it cannot run)."""
    binary = vllm_router_binary()
    if binary is None:
        return None, "vllm-router is not installed (pip install vllm-router)"
    try:
        return start_vllm_router_in(binary, "round_robin", [upstream], directory,
                                    {"TOKIO_WORKER_THREADS": "1"})  # fmt: skip
    except (OSError, RuntimeError) as exc:
        return None, f"vllm-router did not start: {exc}"


def _streams(url: str, chunks: int) -> tuple[float, int]:
    """TTFT P50 and chunks of one paced run of :data:`STREAMS` closed-loop streams."""
    run = uvloop.run(_load(url + PATH, STREAMS, STREAMS_PER_RUN, chunks, GAP_MS))
    return _pct(run.ttft, 50), run.chunks


def measure(upstream: str, proxies: list[Proxy], rounds: int, requests: int) -> dict[str, Figures]:
    """Every proxy's :class:`Figures`: each load runs direct, then through each proxy in turn."""
    cpu: dict[tuple[str, int], list[float]] = {}
    ttft: dict[str, list[float]] = {}
    rps: dict[str, list[float]] = {}
    for _ in range(rounds):
        for chunks in LENGTHS:
            direct, _ = _streams(upstream, chunks)
            for p in proxies:
                cpu0 = _cpu_seconds(p.pid)
                p50, sent = _streams(p.url, chunks)
                cpu.setdefault((p.name, chunks), []).append(
                    (_cpu_seconds(p.pid) - cpu0) / max(sent, 1) * 1000
                )
                if chunks == LENGTHS[0]:
                    ttft.setdefault(p.name, []).append(p50 - direct)
        for p in proxies:
            cpu0 = _cpu_seconds(p.pid)
            run = uvloop.run(_load(p.url + PATH, 16, requests, 1, 0.0, stream=False))
            used = _cpu_seconds(p.pid) - cpu0
            rps.setdefault(p.name, []).append(len(run.e2e) / used if used > 0 else float("inf"))
    return {
        p.name: Figures(
            {n: statistics.median(cpu[p.name, n]) for n in LENGTHS},
            statistics.median(ttft[p.name]),
            statistics.median(rps[p.name]),
        )
        for p in proxies
    }


def report(figures: dict[str, Figures], why_alone: str | None) -> None:
    """The side-by-side table, the fit and issue 18's targets."""
    n1, n2 = LENGTHS
    print(f"{'proxy':13} {f'CPU s/1k chunks @{n2}':>20} {f'@{n1}':>9} {'per chunk':>10} "
          f"{'per request':>12} {'+TTFT p50':>10} {'non-streamed req/s per core':>28}")  # fmt: skip
    for name, f in figures.items():
        chunk, request = f.fit()
        print(f"{name:13} {f.cpu_per_1k[n2]:>20.4f} {f.cpu_per_1k[n1]:>9.4f} "
              f"{chunk * 1e6:>8.1f}us {request * 1e6:>10.0f}us {f.ttft50 * 1000:>8.2f}ms "
              f"{f.rps_per_core:>28.0f}")  # fmt: skip
    ours = figures["turnout"]
    checks = [
        ("Turnout per-request CPU (us)", ours.fit()[1] * 1e6, 120.0, "<="),
        ("Turnout added TTFT p50 (ms)", ours.ttft50 * 1000, 0.5, "<="),
    ]
    rust = figures.get("vllm-router")
    if rust is None:
        print(f"(vllm-router not compared: {why_alone})")
    else:
        checks += [
            (f"CPU per chunk @{n1} vs vllm-router (x)", ours.cpu_per_1k[n1] / rust.cpu_per_1k[n1],
             1.3, "<="),
            (f"CPU per chunk @{n2} vs vllm-router (x)", ours.cpu_per_1k[n2] / rust.cpu_per_1k[n2],
             1.1, "<="),
            ("non-streamed req/s per core vs vllm-router (x)",
             ours.rps_per_core / rust.rps_per_core, 0.7, ">="),
        ]  # fmt: skip
    print("-- issue 18's targets (one worker each) --")
    for label, value, bound, op in checks:
        met = value <= bound if op == "<=" else value >= bound
        print(f"  [{'met' if met else 'MISSED'}] {label} {value:.2f} {op} {bound:g}")
