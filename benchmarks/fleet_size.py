"""Per-request CPU against the fleet's size: every built-in policy, and vllm-router, one run.

    python -m benchmarks.fleet_size [--sizes 2,16,64,256,1024] [--requests 2048] [--rounds 2]
                                    [--no-peer] [--peer-timeout 60] [--peer-requests 256]

One fast upstream (benchmarks/proxy_overhead.py's SSE server, its own process) listens on
one port at N distinct loopback addresses (127.0.0.1, 127.0.0.2, ..., 127.0.4.24), and each
address is one backend: half ``vllm``, half ``deepinfer`` (so ``class-split``, ``pinned`` by
engine and ``adaptive`` have their pools), models configured (no /v1/models polling), probes
every 60 s and no scrape (so the figure is the requests'). A router per size (one worker
each, access log on as in production) runs at once, each warmed up with as many requests per
policy as it has backends (so each backend's connection is open, as in steady serving), and
again with round-robin before every measured run: the router closes a connection idle for
4 s (``limits.upstream_idle_seconds``), and the other routers' runs keep each one idle
for longer than that, so without it the first run of a round would open a connection per backend
(an eighth of the requests at 256 backends, half at 1,024: a measure of connecting, not of
routing). Each round then sends every router, in turn, 32 closed-loop streams of 16 unpaced
chunks, ``--requests`` in all, through each policy (picked by ``X-Turnout-Policy``), and
takes the router process's CPU per request (utime+stime from /proc); medians of ``--rounds``
rounds are printed, so a burst of other load on the machine hits every size alike.
``round-robin A/A`` measures round-robin a second time in each round: the difference between
the two rows is this run's noise. vllm-router (``pip install vllm-router``; one tokio worker
thread) gets the same load with its ``round_robin`` and ``cache_aware`` policies, where it
answers within ``--peer-timeout`` seconds of starting (one run of ``--peer-requests`` after
a warm-up of 64: its ``cache_aware`` costs milliseconds a request from 64 backends up, so
more would take minutes).

Then, per size, the router's resident memory after its runs and the memory per backend
above the smallest size's, and issue 29's targets at 256 backends against 2 (at most 1.2x
for round-robin, pinned and class-split; 1.5x for least-outstanding, cache-aware, adaptive).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import uvloop
import yaml

from benchmarks.prefix_routing import start_vllm_router, vllm_router_binary
from benchmarks.proxy_overhead import _cpu_seconds, _load, _Upstream
from router.server.children import spawn_ready

UPSTREAM_READY = "upstream listening on port "
STREAMS = 32
CHUNKS = 16
PATH = "/v1/chat/completions"
POLICIES = ("round-robin", "pinned", "class-split", "least-outstanding", "cache-aware", "adaptive")
AA = "round-robin A/A"
PEER = ("round_robin", "cache_aware")
FLAT = {"round-robin": 1.2, "pinned": 1.2, "class-split": 1.2}
SCORING = {"least-outstanding": 1.5, "cache-aware": 1.5, "adaptive": 1.5}


def address(i: int) -> str:
    """The ``i``-th loopback address (from 127.0.0.1; 250 per third octet)."""
    return f"127.0.{i // 250}.{i % 250 + 1}"


async def _serve(count: int) -> None:
    """The upstream at ``count`` loopback addresses, one port."""
    loop = asyncio.get_running_loop()
    with socket.socket() as probe:
        probe.bind((address(0), 0))
        port = probe.getsockname()[1]
    servers = [
        await loop.create_server(_Upstream, address(i), port, backlog=1024) for i in range(count)
    ]
    print(f"{UPSTREAM_READY}{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


def _urls(port: str, n: int) -> list[str]:
    return [f"http://{address(i)}:{port}" for i in range(n)]


def _config(urls: Sequence[str], directory: Path) -> Path:
    engines = ("vllm", "deepinfer")
    doc = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [
            {
                "name": f"{engines[i % 2]}-{i}",
                "engine": engines[i % 2],
                "url": url,
                "models": ["bench"],
                "forward_headers": ["X-Bench-Gap-Ms", "X-Bench-Chunks"],
            }
            for i, url in enumerate(urls)
        ],
        "default_policy": "round-robin",
        "policies": {
            "round-robin": {"type": "round-robin"},
            "pinned": {"type": "pinned", "params": {"engine": "vllm"}},
            "class-split": {
                "type": "class-split",
                "params": {"interactive": ["vllm", "deepinfer"], "batch": ["deepinfer", "vllm"]},
            },
            "least-outstanding": {"type": "least-outstanding"},
            "cache-aware": {"type": "cache-aware"},
            "adaptive": {
                "type": "adaptive",
                "params": {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]},
            },
        },
        "health": {"interval": 60.0, "scrape_metrics": False},
    }
    path = directory / f"fleet-{len(urls)}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _cpu_per_request(url: str, pid: int, requests: int, headers: dict[str, str]) -> float:
    """The proxy's CPU seconds per request over ``requests`` closed-loop streams."""
    cpu0 = _cpu_seconds(pid)
    run = uvloop.run(_load(url + PATH, STREAMS, requests, CHUNKS, 0.0, True, headers=headers))
    return (_cpu_seconds(pid) - cpu0) / len(run.e2e)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _warm(url: str, backends: int, policy: str = "round-robin") -> None:
    """As many requests through ``policy`` as there are backends (at least one per stream):
    with round-robin, every backend's connection is open and fresh afterwards."""
    headers = {"X-Turnout-Policy": policy}
    warm = max(backends, STREAMS)
    uvloop.run(_load(url + PATH, STREAMS, warm, CHUNKS, 0.0, True, headers=headers))


def _start(urls: Sequence[str], tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A router in front of ``urls``, each backend's connection opened by every policy."""
    cfg = _config(urls, tmp)
    argv = [sys.executable, "-m", "turnout", "serve", "--config", str(cfg)]
    proc, url = spawn_ready(argv, "turnout listening on ", 120)
    for name in POLICIES:
        _warm(url, len(urls), name)
    return proc, url


def _turnout(
    sizes: Sequence[int], port: str, args: argparse.Namespace, tmp: Path
) -> tuple[dict[int, dict[str, float]], dict[int, int]]:
    """Per size, the median CPU per request by policy (and the A/A row), and the router's
    RSS in KiB. Every size's router runs at once and each round measures them all in turn,
    so a burst of other load on the machine hits every size alike."""
    routers = {n: _start(_urls(port, n), tmp) for n in sizes}
    try:
        samples: dict[int, dict[str, list[float]]] = {
            n: {name: [] for name in (*POLICIES, AA)} for n in sizes
        }
        for _ in range(args.rounds):
            for n, (proc, url) in routers.items():
                for name, runs in samples[n].items():
                    _warm(url, n)  # connections idle past the pool's limit are reopened here
                    headers = {"X-Turnout-Policy": "round-robin" if name == AA else name}
                    runs.append(_cpu_per_request(url, proc.pid, args.requests, headers))
        medians = {
            n: {name: statistics.median(runs) for name, runs in by.items()}
            for n, by in samples.items()
        }
        return medians, {n: _rss_kib(proc.pid) for n, (proc, _) in routers.items()}
    finally:
        for proc, _ in routers.values():
            proc.terminate()
        for proc, _ in routers.values():
            proc.wait(20)


def _peer(binary: str, urls: Sequence[str], args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    """vllm-router's CPU per request by policy, or why there is none."""
    out: dict[str, str] = {}
    for policy in PEER:
        try:
            proc, url = start_vllm_router(
                binary, policy, urls, tmp, {"TOKIO_WORKER_THREADS": "1"}, args.peer_timeout
            )
        except RuntimeError:
            out[policy] = f"not ready in {args.peer_timeout:g} s"
            continue
        try:
            uvloop.run(_load(url + PATH, STREAMS, 2 * STREAMS, CHUNKS, 0.0, True))
            cpu = _cpu_per_request(url, proc.pid, args.peer_requests, {})
            out[policy] = f"{cpu * 1e6:,.0f}"
        finally:
            proc.terminate()
            proc.wait(20)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sizes", default="2,16,64,256,1024", help="backend counts")
    ap.add_argument("--requests", type=int, default=2048, help="requests per measured run")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per size; medians printed")
    ap.add_argument("--no-peer", action="store_true", help="leave vllm-router out")
    ap.add_argument("--peer-timeout", type=float, default=60.0, help="seconds vllm-router gets")
    ap.add_argument(
        "--peer-requests",
        type=int,
        default=256,
        help="requests of vllm-router's one measured run per policy (its cache_aware takes\n"
        "milliseconds a request at 64 backends and more above)",
    )
    ap.add_argument("--upstream-server", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.upstream_server:
        uvloop.run(_serve(args.upstream_server))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    binary = None if args.no_peer else vllm_router_binary()
    argv_up = [sys.executable, "-m", "benchmarks.fleet_size", "--upstream-server", str(max(sizes))]
    up, port = spawn_ready(argv_up, UPSTREAM_READY, 120)
    print(f"{STREAMS} closed-loop streams of {CHUNKS} unpaced chunks, {args.requests} requests "
          f"a run, median of {args.rounds} rounds, 1 router worker, {os.cpu_count()} CPUs; "
          "CPU per request in microseconds", flush=True)  # fmt: skip
    if binary is None and not args.no_peer:
        print("(vllm-router is not on the PATH: pip install vllm-router; its columns are empty)")
    columns = [*POLICIES, AA, *(f"vllm-router {p}" for p in PEER)]
    print("| backends | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            figures, memory = _turnout(sizes, port, args, Path(tmp))
            for n in sizes:
                peer = _peer(binary, _urls(port, n), args, Path(tmp)) if binary else {}
                cells = [f"{figures[n][name] * 1e6:,.0f}" for name in (*POLICIES, AA)]
                cells += [peer.get(p, "") for p in PEER]
                print(f"| {n:,} | " + " | ".join(cells) + " |", flush=True)
    finally:
        up.terminate()
        up.wait(20)
    base = sizes[0]
    print("\n| backends | router RSS (MiB) | per backend above the smallest (KiB) |")
    print("|---|---|---|")
    for n in sizes:
        per = (memory[n] - memory[base]) / (n - base) if n != base else 0.0
        print(f"| {n:,} | {memory[n] / 1024:.1f} | {per:.1f} |" if n != base
              else f"| {n:,} | {memory[n] / 1024:.1f} | |")  # fmt: skip
    if 2 in figures and 256 in figures:
        print("\nissue 29 targets, CPU per request at 256 backends / at 2:")
        for name, bound in {**FLAT, **SCORING}.items():
            ratio = figures[256][name] / figures[2][name]
            verdict = "met" if ratio <= bound else "MISSED"
            print(f"  {name:18} {ratio:5.2f}x  (target <= {bound}x)  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
