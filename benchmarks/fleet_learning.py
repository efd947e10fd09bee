"""What ``adaptive`` pays to learn a slow engine, through one worker and through a fleet
(issue 29 item 3).

    python -m benchmarks.fleet_learning [--requests 160] [--concurrency 4] [--frontend-ms 150]

Two emulated engines (real processes): ``quick``, the low-TTFT pool by config and by its
prior, whose front end holds every request about ``--frontend-ms`` (the interactive TTFT
target is a third of it), and ``bulk``, the high-throughput pool, which answers at once.
Until a router process has learned that ``quick`` is slow it sends interactive requests
there; each request it sends there is the price of learning. ``--requests`` interactive
streams go out from ``--concurrency`` closed-loop clients, each request on a fresh
connection (so the kernel spreads them over a router's workers), dealt in turn to the
routers of the setup:

- ``1 x 1``: one router of one worker, and ``1 x 1 A/A`` the same again (the noise);
- ``2 x 2 shared``: two routers of two workers sharing a redis-server this script starts:
  every process learns from every request;
- ``2 x 2 no Redis``: the same without Redis: workers learn from their router's, each
  router on its own.

Printed per setup: requests sent to ``quick``, and the clients' P50/P95 time per request
(four tokens, so about the time to first token). Before the
lessons were shared each of the four processes paid the single worker's price.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from benchmarks.fleet_limits import _routers
from benchmarks.redis_server import redis_server
from router.server.children import spawn_ready, stop_all

MODEL = "deepseek-v4.1-flash"


def _config(quick: str, bulk: str, target_s: float, redis: str | None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [
            {"name": "quick", "engine": "vllm", "url": quick},
            {"name": "bulk", "engine": "deepinfer", "url": bulk},
        ],
        "default_policy": "adaptive",
        "policies": {
            "adaptive": {
                "type": "adaptive",
                "params": {
                    "low_ttft": ["vllm"],
                    "high_throughput": ["deepinfer"],
                    "slo": {"interactive": {"ttft_s": target_s, "tpot_s": 1.0}},
                    "prefill_rate_prior": {"vllm": 1_000_000, "deepinfer": 10_000},
                },
            }
        },
    }
    if redis is not None:
        doc["limits"] = {"store": {"redis": {"url": redis}}}
    return doc


async def _one(url: str) -> tuple[str, float]:
    """One interactive stream on a fresh connection: its backend and duration (four tokens:
    about its time to first token, which is where the engines differ)."""
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}],
                         "max_tokens": 4, "stream": True})  # fmt: skip
    headers = {"Content-Type": "application/json", "X-Request-Class": "interactive"}
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.monotonic()
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
            await r.read()
            return r.headers.get("X-Turnout-Backend", "?"), time.monotonic() - t0


async def _run(urls: list[str], requests: int, concurrency: int) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    turn = iter(range(requests))

    async def client() -> None:
        for i in turn:
            out.append(await _one(urls[i % len(urls)]))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return out


def _row(name: str, results: list[tuple[str, float]]) -> str:
    to_quick = sum(backend == "quick" for backend, _ in results)
    took = sorted(t for _, t in results)
    p95 = took[min(len(took) - 1, int(0.95 * len(took)))]
    p50 = statistics.median(took)
    return f"| {name} | {to_quick} | {p50 * 1000:.0f} | {p95 * 1000:.0f} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=160, help="interactive streams per setup")
    ap.add_argument("--concurrency", type=int, default=4, help="closed-loop clients")
    ap.add_argument("--frontend-ms", type=float, default=150.0, help="quick's front-end hold")
    args = ap.parse_args(argv)
    target = args.frontend_ms / 3000
    emulators = []
    try:
        for profile, extra in (("vllm", ["--set", f"frontend_ms={args.frontend_ms}"]),
                               ("deepinfer", ["--time-scale", "20"])):  # fmt: skip
            argv_e = [sys.executable, "-m", "turnout", "emulator", "--profile", profile,
                      "--port", "0", *extra]  # fmt: skip
            proc, url = spawn_ready(argv_e, "emulator listening on", 60)
            emulators.append((proc, url.rstrip("/")))
        quick, bulk = (url for _, url in emulators)
        print(f"{args.requests} interactive streams of 4 tokens, {args.concurrency} clients, "
              f"fresh connections; quick holds ~{args.frontend_ms:g} ms, the TTFT target is "
              f"{target * 1000:.0f} ms")  # fmt: skip
        print("| setup | sent to quick | e2e P50 (ms) | e2e P95 (ms) |\n|---|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            setups: list[tuple[str, int, int, bool]] = [
                ("1 x 1", 1, 1, False),
                ("1 x 1 A/A", 1, 1, False),
                ("2 x 2 shared", 2, 2, True),
                ("2 x 2 no Redis", 2, 2, False),
            ]
            with redis_server(work) as (redis_url, _):
                for name, count, workers, shared in setups:
                    doc = _config(quick, bulk, target, redis_url if shared else None)
                    with _routers(doc, work, count, workers) as urls:
                        time.sleep(0.5)  # subscribed to the channel
                        results = uvloop.run(_run(urls, args.requests, args.concurrency))
                    print(_row(name, results), flush=True)
    finally:
        stop_all([proc for proc, _ in emulators])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
