"""One key's limits through a fleet, and fair shares in one class's queue (issue 29 item 5).

    python -m benchmarks.fleet_limits tokens [--seconds 40] [--tpm 60000] [--concurrency 8]
    python -m benchmarks.fleet_limits fairness [--heavy 24] [--light 40] [--workers 1] [--reserve 1]

``tokens``: two routers of two workers each (real processes) share their limits through a
redis-server this script starts, in front of one fast upstream (benchmarks/proxy_overhead.py's,
one JSON answer at once, its usage ``8 + max_tokens``). One API key with ``--tpm`` tokens a
minute is hammered through all four processes (``--concurrency`` closed-loop clients per
router, each request a fresh connection so the kernel spreads them over the workers, each
asking ``max_tokens`` 100). The token bucket starts full, so the first minute may admit a
bucket more than the rate; after it has drained the admitted rate must be the limit's. The
script prints the tokens admitted (the answers' usage) per second against the limit's rate,
over the whole run and over the part after the first drain, and the same for one router
of one worker (the reference a single bucket gives). A minute is long on a shared machine:
``--seconds`` scales the run down, the rate measured is per second and compared to the
limit over 60.

``fairness``: one router (``--workers``, default 1) in front of one emulated vLLM replica with
``max_inflight`` 4 and ``admission.batch.reserve`` ``--reserve`` (0: no slot kept), so
requests wait in the router's batch queue. A light tenant sends
``--light`` streamed requests, one every 0.25 s, alone, then again while a heavy tenant
keeps ``--heavy`` batch requests open in a closed loop. Printed: the light tenant's TTFT
P50/P95 alone and beside the flood, their ratio, and how many of its requests were refused
(none may be: it stays within its quota); and, as the peer without fair shares, the same
requests sent under the heavy tenant's own key (first come, first served behind its flood).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop
import yaml

from benchmarks.proxy_overhead import UPSTREAM_READY
from benchmarks.redis_server import redis_server
from router.server.children import spawn_ready, stop_all

HEAVY, LIGHT = "sk-heavy-tenant", "sk-light-tenant"
MODEL = "deepseek-v4.1-flash"


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@contextmanager
def _routers(doc: dict[str, Any], tmp: Path, count: int, workers: int) -> Iterator[list[str]]:
    procs, urls = [], []
    try:
        for i in range(count):
            path = tmp / f"router-{i}.yaml"
            path.write_text(yaml.safe_dump(doc))
            argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path), "--port", "0",
                    "--workers", str(workers)]  # fmt: skip
            proc, url = spawn_ready(argv, "turnout listening on", 60)
            procs.append(proc)
            urls.append(url)
        yield urls
    finally:
        stop_all(procs, 20)


async def _hammer(urls: list[str], seconds: float, conc: int) -> list[tuple[float, int]]:
    """(time since start, tokens) of every admitted request."""
    body = orjson.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 100, "stream": False})  # fmt: skip
    headers = {"Authorization": f"Bearer {HEAVY}", "Content-Type": "application/json",
               "X-Bench-Chunks": "100"}  # fmt: skip
    out: list[tuple[float, int]] = []
    start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=0, force_close=True)  # a fresh connection each
    async with aiohttp.ClientSession(connector=connector) as s:

        async def client(url: str) -> None:
            while (now := time.monotonic() - start) < seconds:
                async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                    data = await r.read()
                    if r.status == 200:
                        usage = orjson.loads(data)["usage"]
                        out.append((now, usage["prompt_tokens"] + usage["completion_tokens"]))
                    elif r.status == 429:
                        await asyncio.sleep(0.01)  # the client backs off a little

        await asyncio.gather(*(client(u) for u in urls for _ in range(conc)))
    return out


def tokens(args: argparse.Namespace) -> None:
    rate = args.tpm / 60
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        up, upstream = spawn_ready(
            [sys.executable, "-m", "benchmarks.proxy_overhead", "--upstream-server"],
            UPSTREAM_READY, 30,
        )  # fmt: skip
        try:
            doc: dict[str, Any] = {
                "listen": {"host": "127.0.0.1", "port": 0},
                "backends": [{"name": "fast", "engine": "vllm", "url": upstream,
                              "models": ["bench"], "forward_headers": ["X-Bench-Chunks"]}],
                "default_policy": "pinned",
                "policies": {"pinned": {"type": "pinned", "params": {"backend": "fast"}}},
                "health": {"interval": 5.0, "scrape_metrics": False},
                "access_log": {"enabled": False},
                "require_api_key": True,
                "api_keys": [{"name": "k", "sha256": _digest(HEAVY),
                              "tokens_per_minute": args.tpm}],
            }  # fmt: skip
            print(f"one key at {args.tpm} tokens/min ({rate:.0f}/s), {args.seconds:g} s runs, "
                  f"{args.concurrency} clients per router, 108 tokens a request")  # fmt: skip
            print(f"{'fleet':24} {'admitted':>9} {'per s':>7} {'x limit':>8} "
                  f"{'after drain per s':>18} {'x limit':>8}")  # fmt: skip
            runs = [("1 router x 1 worker", 1, 1, None), ("2 routers x 2 workers", 2, 2, "redis")]
            for label, count, workers, store in runs:
                with redis_server(tmp) as (redis_url, _):
                    if store is not None:
                        doc["limits"] = {"store": {"redis": {"url": redis_url}}}
                    with _routers(doc, tmp, count, workers) as urls:
                        got = uvloop.run(_hammer(urls, args.seconds, args.concurrency))
                total = sum(t for _, t in got)
                drained = _drained(got, args.tpm, args.seconds / 2)
                after = sum(t for at, t in got if at >= drained)
                steady = after / (args.seconds - drained)
                print(f"{label:24} {total:>9} {total / args.seconds:>7.0f} "
                      f"{total / (args.tpm + rate * args.seconds):>8.3f} {steady:>18.0f} "
                      f"{steady / rate:>8.3f}")  # fmt: skip
            print(
                "x limit: admitted over what one bucket allows in the run (its fill plus the "
                "rate); after drain: the rate once the initial fill is spent, over the limit's"
            )
        finally:
            stop_all([up])


def _drained(got: list[tuple[float, int]], capacity: int, default: float) -> float:
    """When the admitted tokens first add up to the bucket's capacity: its fill is spent."""
    total = 0
    for at, t in sorted(got):
        total += t
        if total >= capacity:
            return at
    return default


async def _light(url: str, count: int, gap: float, key: str = LIGHT) -> tuple[list[float], int]:
    """The light tenant's streamed requests, one every ``gap`` s: their TTFTs, and refusals."""
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 8, "stream": True})  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    ttfts: list[float] = []
    refused = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

        async def one() -> None:
            nonlocal refused
            t0 = time.monotonic()
            async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                if r.status != 200:
                    refused += 1
                    await r.read()
                    return
                async for chunk in r.content.iter_any():
                    if b"content" in chunk:
                        ttfts.append(time.monotonic() - t0)
                        break
                await r.read()

        tasks = []
        for _ in range(count):
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(gap)
        await asyncio.gather(*tasks)
    return ttfts, refused


async def _flood(url: str, conc: int, stop: asyncio.Event) -> int:
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x " * 400}],
                         "max_tokens": 64, "stream": False})  # fmt: skip
    headers = {"Authorization": f"Bearer {HEAVY}", "Content-Type": "application/json"}
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

        async def client() -> None:
            nonlocal done
            while not stop.is_set():
                async with s.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                    await r.read()
                    done += r.status == 200
                    if r.status != 200:
                        await asyncio.sleep(0.05)

        await asyncio.gather(*(client() for _ in range(conc)))
    return done


async def _beside(
    url: str, args: argparse.Namespace, key: str = LIGHT
) -> tuple[list[float], int, int]:
    stop = asyncio.Event()
    flood = asyncio.create_task(_flood(url, args.heavy, stop))
    await asyncio.sleep(2.0)  # the queue fills
    ttfts, refused = await _light(url, args.light, 0.25, key)
    stop.set()
    return ttfts, refused, await flood


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def fairness(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        argv = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port", "0",
                "--time-scale", str(args.time_scale)]  # fmt: skip
        emu, emu_url = spawn_ready(argv, "emulator listening on", 30)
        try:
            doc: dict[str, Any] = {
                "listen": {"host": "127.0.0.1", "port": 0},
                "backends": [{"name": "vllm", "engine": "vllm", "url": emu_url, "max_inflight": 4}],
                "default_policy": "pinned",
                "policies": {"pinned": {"type": "pinned", "params": {"backend": "vllm"}}},
                "access_log": {"enabled": False},
                "require_api_key": True,
                "admission": {"batch": {"queue_size": 256, "max_wait": 60,
                                        "reserve": args.reserve}},
                "api_keys": [
                    {"name": "heavy", "sha256": _digest(HEAVY), "class": "batch"},
                    {"name": "light", "sha256": _digest(LIGHT), "class": "batch",
                     "requests_per_minute": 600},
                ],
            }  # fmt: skip
            with _routers(doc, tmp, 1, args.workers) as (url,):
                alone, refused_alone = uvloop.run(_light(url, args.light, 0.25))
                again, _ = uvloop.run(_light(url, args.light, 0.25))
                beside, refused, flooded = uvloop.run(_beside(url, args))
                # The same light requests sent as the heavy tenant: first come, first served.
                fifo, refused_fifo, _ = uvloop.run(_beside(url, args, HEAVY))
        finally:
            stop_all([emu])
    print(f"light tenant: {args.light} streamed requests 0.25 s apart; heavy: {args.heavy} "
          f"closed-loop batch requests (400-word prompts, 64 tokens); one vLLM replica "
          f"(time scale {args.time_scale:g}) at max_inflight 4; "
          f"1 router x {args.workers} workers, batch reserve {args.reserve}")  # fmt: skip
    print(f"{'light tenant':22} {'TTFT P50 ms':>12} {'TTFT P95 ms':>12} {'refused':>8}")
    rows = (("alone", alone, refused_alone), ("alone again (A/A)", again, 0),
            ("beside the flood", beside, refused),
            ("as the heavy tenant", fifo, refused_fifo))  # fmt: skip
    for label, ttfts, no in rows:
        print(
            f"{label:22} {_pct(ttfts, 0.5) * 1e3:>12.1f} {_pct(ttfts, 0.95) * 1e3:>12.1f} {no:>8}"
        )
    print(
        f"P95 beside / alone: {_pct(beside, 0.95) / _pct(alone, 0.95):.2f} (target <= 1.5); "
        f"heavy requests served meanwhile: {flooded}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--seconds", type=float, default=40.0)
    t.add_argument("--tpm", type=int, default=60_000)
    t.add_argument("--concurrency", type=int, default=8, help="clients per router")
    f = sub.add_parser("fairness")
    f.add_argument("--heavy", type=int, default=24)
    f.add_argument("--light", type=int, default=40)
    f.add_argument("--time-scale", type=float, default=2.0)
    f.add_argument("--workers", type=int, default=1)
    f.add_argument("--reserve", type=int, default=1, help="admission.batch.reserve")
    args = ap.parse_args(argv)
    tokens(args) if args.what == "tokens" else fairness(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
