"""How long a large request body stalls the router's event loop, with and without the offload.

The router parses and token-counts a body over 256 KiB in a worker thread
(router.proxy.handler). This runs the router in-process in front of a tiny engine and, while
it serves a few multi-megabyte chat requests, samples how late a 1 ms ticker on the same loop
wakes up: that lateness is what every other stream on the worker waits. Prints the worst and
the 99th-percentile lag with the offload and with it disabled, side by side.

    python -m benchmarks.large_body [--megabytes 5.7] [--requests 5]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import aiohttp
import orjson
import yaml
from aiohttp import web

from router.app import build_app, listen_socket, serve
from router.config.parse import load_config
from router.proxy import handler
from router.proxy.body import OFFLOAD_BYTES

MODEL = "bench"


async def _engine() -> tuple[web.AppRunner, str]:
    async def chat(_: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "usage": None})

    async def ok(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL}]})

    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", ok)
    app.router.add_get("/v1/models", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.SockSite(runner, listen_socket("127.0.0.1", 0))
    await site.start()
    host, port = site._sock.getsockname()[:2]
    return runner, f"http://{host}:{port}"


async def _lags(url: str, body: bytes, requests: int) -> list[float]:
    lags: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    tick = asyncio.create_task(ticker())
    async with aiohttp.ClientSession() as s:
        for _ in range(requests):
            async with s.post(f"{url}/v1/chat/completions", data=io.BytesIO(body)) as resp:
                await resp.read()
                assert resp.status == 200, resp.status
    done.set()
    await tick
    return lags


async def run(megabytes: float, requests: int) -> None:
    engine, engine_url = await _engine()
    words = "lorem ipsum dolor " * int(megabytes * 1e6 / 18)
    body = orjson.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 1}
    )
    doc = {
        "listen": {"host": "127.0.0.1", "port": 0, "max_body_bytes": 256 * 1024 * 1024},
        "backends": [{"name": "e", "engine": "vllm", "url": engine_url, "models": [MODEL]}],
        "default_policy": "rr",
        "policies": {"rr": {"type": "round-robin"}},
        "health": {"scrape_metrics": False},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "router.yaml"
        path.write_text(yaml.safe_dump(doc))
        served = await serve(build_app(load_config(path)), listen_socket("127.0.0.1", 0))
        rows = []
        for label, threshold in (("offloaded", OFFLOAD_BYTES), ("on the loop", 1 << 62)):
            # The handler's own binding of the threshold, replaced for the comparison run.
            with mock.patch.object(handler, "OFFLOAD_BYTES", threshold):
                lags = await _lags(served.url, body, requests)
            p99 = statistics.quantiles(lags, n=100)[98] if len(lags) > 100 else max(lags)
            rows.append((label, max(lags) * 1000, p99 * 1000))
        await served.runner.cleanup()
    await engine.cleanup()
    print(f"{requests} requests of {len(body) / 1e6:.1f} MB; event-loop lag of a 1 ms ticker")
    print(f"{'parsing':<12} {'worst ms':>9} {'p99 ms':>8}")
    for label, worst, p99 in rows:
        print(f"{label:<12} {worst:>9.1f} {p99:>8.1f}")
    print(f"worst-lag ratio (on the loop / offloaded): {rows[1][1] / rows[0][1]:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=5.7)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run(args.megabytes, args.requests))


if __name__ == "__main__":
    main()
