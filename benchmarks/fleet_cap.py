"""A backend's ``max_inflight`` through a fleet: how many requests the backend holds at once.

    python -m benchmarks.fleet_cap [--cap 8] [--seconds 10] [--concurrency 16] [--hold 0.05]

Two routers of two workers each (real processes) share a redis-server this script starts
(``limits.store.redis``) in front of one upstream that holds each request ``--hold`` seconds
and counts the requests it holds at once (benchmarks/counting_upstream.py), configured with
``max_inflight: --cap``. ``--concurrency`` closed-loop clients per router (``--b-clients``
through router b: 0 leaves it idle beside a busy one; each request a fresh connection, so
the kernel spreads them over the workers; an admission queue holds those that find no slot)
hammer all four processes for ``--seconds``, twice (an A/A pair, to show the noise).
Printed per run: the most requests the upstream held at once, the share of its counts
(sampled every 10 ms) above the cap, its mean (how full the fleet kept it) and the answers
per second through each router; and the load average beside them. Run it on another
checkout to compare (the figures in docs/benchmarks.md, Fleet cap).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from benchmarks.counting_upstream import READY
from benchmarks.fleet_limits import _routers
from benchmarks.redis_server import redis_server
from router.server.children import spawn_ready, stop_all

BODY = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                     "max_tokens": 1, "stream": False})  # fmt: skip


async def _run(upstream: str, urls: list[str], seconds: float, conc: list[int]) -> dict[str, Any]:
    served = dict.fromkeys(urls, 0)
    counts: list[int] = []
    stop = asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def client(url: str) -> None:
            while not stop.is_set():
                async with s.post(url + "/v1/chat/completions", data=BODY,
                                  headers={"Content-Type": "application/json"}) as r:  # fmt: skip
                    await r.read()
                    if r.status == 200:
                        served[url] += 1
                    else:
                        await asyncio.sleep(0.01)

        async def sample() -> None:
            while not stop.is_set():
                async with s.get(upstream + "/peak") as r:
                    counts.append(orjson.loads(await r.read())["now"])
                await asyncio.sleep(0.01)

        async with s.post(upstream + "/peak") as r:
            await r.read()
        pairs = zip(urls, conc, strict=True)
        tasks = [asyncio.create_task(client(u)) for u, n in pairs for _ in range(n)]
        tasks.append(asyncio.create_task(sample()))
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        async with s.get(upstream + "/peak") as r:
            peak = orjson.loads(await r.read())["peak"]
    return {"peak": peak, "counts": counts, "served": [served[u] / seconds for u in urls]}


def _config(cap: int, upstream: str, redis_url: str) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": "capped", "engine": "vllm", "url": upstream,
                      "models": ["bench"], "max_inflight": cap}],
        "default_policy": "pinned",
        "policies": {"pinned": {"type": "pinned", "params": {"backend": "capped"}}},
        "health": {"interval": 5.0, "scrape_metrics": False},
        "admission": {"interactive": {"queue_size": 1024, "max_wait": 60}},
        "access_log": {"enabled": False},
        "limits": {"store": {"redis": {"url": redis_url}}},
    }  # fmt: skip


def _row(run: str, got: dict[str, Any], cap: int) -> str:
    counts = got["counts"] or [0]
    over = sum(c > cap for c in counts) / len(counts)
    mean = sum(counts) / len(counts)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    a, b = got["served"]
    return f"{run:5} {got['peak']:>5} {over:>9.1%} {mean:>10.2f} {a:>12.1f} {b:>12.1f} {load:>16}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cap", type=int, default=8, help="the backend's max_inflight")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16, help="clients per router")
    parser.add_argument("--b-clients", type=int, help="router b's (default: --concurrency)")
    parser.add_argument("--hold", type=float, default=0.05, help="seconds a request is held")
    args = parser.parse_args(argv)
    up, upstream = spawn_ready(
        [sys.executable, "-m", "benchmarks.counting_upstream", "--hold", str(args.hold)],
        READY, 30,
    )  # fmt: skip
    b = args.concurrency if args.b_clients is None else args.b_clients
    print(f"max_inflight {args.cap}, 2 routers x 2 workers, {args.concurrency} clients through a, "
          f"{b} through b, each request held {args.hold:g} s, {args.seconds:g} s runs")  # fmt: skip
    print(f"{'run':5} {'peak':>5} {'over cap':>9} {'mean held':>10} "
          f"{'router a /s':>12} {'router b /s':>12} {'load avg':>16}")  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as name, redis_server(Path(name)) as (url, _):
            doc = _config(args.cap, upstream, url)
            b = args.b_clients
            with _routers(doc, Path(name), 2, 2) as urls:
                time.sleep(1.0)  # the first grants asked for
                for run in ("A", "A'"):
                    conc = [args.concurrency, args.concurrency if b is None else b]
                    got = uvloop.run(_run(upstream, urls, args.seconds, conc))
                    print(_row(run, got, args.cap))
    finally:
        stop_all([up])
    print("peak: the most requests the upstream held at once (the cap holds when it is at most "
          "max_inflight); over cap: the share of 10 ms samples above it")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
