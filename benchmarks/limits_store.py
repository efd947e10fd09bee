"""What keeping API keys' limits costs a request: none, in the router's memory, in Redis.

    python -m benchmarks.limits_store [--requests 3000] [--concurrency 32] [--rounds 3]

One tiny upstream (benchmarks/proxy_overhead.py's, answering each non-streamed chat request
with one JSON body at once) behind four routers of one worker each, all given the same API
key: ``none`` (the key has no limits: the gate reserves nothing), ``local`` (the key's
requests, tokens and concurrency limited, kept in the router's own memory), ``redis`` (the
same limits in a redis-server this script starts: one Lua script per request, settlements
batched in the background) and ``none-again``, a second ``none`` router: the A/A pair shows
the noise. Limits are set high enough that nothing is refused. Routers take turns for
``--rounds`` rounds and the medians are printed: the router's CPU per request (and, for
``redis``, redis-server's), and P50/P99 request latency, each also as the difference from
``none``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import uvloop
import yaml

from benchmarks.proxy_overhead import UPSTREAM_READY, _cpu_seconds, _load, _pct, _router_config
from benchmarks.redis_server import redis_server
from router.server.children import spawn_ready

KEY = "sk-bench-limits"
LIMITS = {"requests_per_minute": 10**8, "tokens_per_minute": 10**10, "max_concurrency": 10**5}
KINDS = ("none", "local", "redis", "none-again")


def _config(upstream: str, tmp: Path, kind: str, redis_url: str) -> Path:
    doc = yaml.safe_load(_router_config(upstream, tmp, access_log=False).read_text())
    key: dict[str, object] = {"name": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}
    if kind in ("local", "redis"):
        key.update(LIMITS)
    doc["api_keys"] = [key]
    doc["require_api_key"] = True
    if kind == "redis":
        doc["limits"] = {"store": {"redis": {"url": redis_url}}}
    path = tmp / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000, help="requests per router per round")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    exe = sys.executable
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as name, contextlib.ExitStack() as stack:
        tmp = Path(name)
        try:
            up, upstream = spawn_ready(
                [exe, "-m", "benchmarks.proxy_overhead", "--upstream-server"], UPSTREAM_READY, 30
            )
            redis_url, redis_pid = stack.enter_context(redis_server(tmp))
            procs.append(up)
            routers: dict[str, tuple[int, str]] = {}
            for kind in KINDS:
                cfg = _config(upstream, tmp, kind, redis_url)
                proc, url = spawn_ready(
                    [exe, "-m", "turnout", "serve", "--config", str(cfg)],
                    "turnout listening on ",
                    30,
                )
                procs.append(proc)
                routers[kind] = (proc.pid, url + "/v1/chat/completions")
            rows: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in KINDS}
            for _ in range(args.rounds):
                for kind, (pid, url) in routers.items():
                    uvloop.run(_load(url, args.concurrency, 200, 1, 0.0, stream=False, auth=KEY))
                    cpu0, r0 = _cpu_seconds(pid), _cpu_seconds(redis_pid)
                    run = uvloop.run(
                        _load(url, args.concurrency, args.requests, 1, 0.0, stream=False, auth=KEY)
                    )
                    n = len(run.e2e)
                    rows[kind].append(
                        (
                            (_cpu_seconds(pid) - cpu0) / n * 1e6,
                            (_cpu_seconds(redis_pid) - r0) / n * 1e6,
                            _pct(run.e2e, 50) * 1e3,
                            _pct(run.e2e, 99) * 1e3,
                        )
                    )
            _report(rows, args)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
    return 0


def _report(
    rows: dict[str, list[tuple[float, float, float, float]]], args: argparse.Namespace
) -> None:
    print(
        f"{args.requests} non-streamed requests per router per round, {args.concurrency} at a "
        f"time, median of {args.rounds} rounds, 1 router worker each, {os.cpu_count()} CPUs"
    )
    print(
        f"{'limits':11} {'router CPU µs/req':>18} {'Δ':>7} {'redis CPU µs/req':>17} "
        f"{'P50 ms':>7} {'Δ':>6} {'P99 ms':>7} {'Δ':>6}"
    )
    medians = {k: [statistics.median(col) for col in zip(*v, strict=True)] for k, v in rows.items()}
    base = medians["none"]
    for kind, (cpu, rcpu, p50, p99) in medians.items():
        print(
            f"{kind:11} {cpu:>18.1f} {cpu - base[0]:>+7.1f} {rcpu:>17.1f} "
            f"{p50:>7.2f} {p50 - base[2]:>+6.2f} {p99:>7.2f} {p99 - base[3]:>+6.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
