"""A Batch API job beside interactive traffic, against the same lines as a closed loop.

Both phases run the embedded default (its two emulated engines, time-scaled, and its SLOs,
scaled the same way) under ``--policy`` (class-split by default), with an open loop of
streamed interactive chats (Poisson arrivals at ``--rate`` per model second, prompts
500-2,000 tokens, outputs 100-300) for as long as the batch work lasts:

1. batch: ``--lines`` chat lines (prompts 1,000-4,000 tokens, outputs 128-512) uploaded and
   submitted with the official client, polled until the batch completes; the router runs them,
   paced by the interactive TTFT (router.batch.pacing). The in-flight lines are sampled from
   ``/metrics``.
2. closed loop: a fresh router, the same interactive arrivals, and the same lines sent by C
   workers as ``X-Request-Class: batch`` requests, C = the most lines the batch had in flight.

Figures are in model seconds (wall time x time scale)::

    .venv/bin/python -m benchmarks.batch_api [--lines 2000] [--time-scale 5] [--rate 1]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import uvloop

from benchmarks.mixed_workload import (
    DEFAULT_CONFIG,
    Result,
    chat_body,
    config_slos,
    one,
    percentile,
    scaled_config,
    start_router,
    stop,
)

KEY = "batch-bench-key"
_INFLIGHT = re.compile(r"^turnout_batch_inflight_lines (\S+)$", re.M)


@dataclass
class Phase:
    """One phase's figures (model seconds)."""

    name: str
    lines: int
    answered: int
    seconds: float
    output_tokens: int
    peak: int
    mean_inflight: float
    interactive: list[Result]


def batch_lines(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": orjson.loads(
                chat_body(i, rng.randint(1000, 4000), rng.randint(128, 512), stream=False)
            ),
        }
        for i in range(n)
    ]


async def interactive_loop(
    session: aiohttp.ClientSession,
    url: str,
    args: argparse.Namespace,
    done: asyncio.Event,
    out: list[Result],
) -> None:
    """Poisson arrivals of streamed chats until ``done``; waits for those that arrived."""
    rng = random.Random(args.seed)
    scale, t0 = args.time_scale, time.perf_counter()
    headers = {"X-Turnout-Policy": args.policy, "X-Request-Class": "interactive"}
    tasks: list[asyncio.Task[None]] = []

    async def send(i: int) -> None:
        body = chat_body(10**6 + i, rng.randint(500, 2000), rng.randint(100, 300), stream=True)
        out.append(await one(session, url, body, headers, "interactive", scale, t0))

    at, i = t0, 0
    while not done.is_set():
        at += rng.expovariate(args.rate) / scale
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(i)))
        i += 1
    await asyncio.gather(*tasks)


async def sample_inflight(
    session: aiohttp.ClientSession, url: str, done: asyncio.Event, samples: list[int]
) -> None:
    while not done.is_set():
        async with session.get(url + "/metrics") as resp:
            found = _INFLIGHT.search(await resp.text())
        if found is not None:
            samples.append(int(float(found.group(1))))
        await asyncio.sleep(1.0)  # a scrape costs the router CPU: not more often


async def alongside(
    url: str, args: argparse.Namespace, work: Callable[[aiohttp.ClientSession], Awaitable[None]]
) -> list[Result]:
    """Run ``work`` with the interactive open loop beside it; the interactive results."""
    results: list[Result] = []
    done = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        loop = asyncio.create_task(
            interactive_loop(session, url + "/v1/chat/completions", args, done, results)
        )
        try:
            await work(session)
        finally:
            done.set()
            await loop
    return results


async def batch_phase(url: str, rows: list[dict[str, Any]], args: argparse.Namespace) -> Phase:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    samples: list[int] = []
    outcome: dict[str, Any] = {}

    async def work(session: aiohttp.ClientSession) -> None:
        await asyncio.sleep(2.0 / args.time_scale)  # interactive traffic is flowing first
        done = asyncio.Event()
        sampler = asyncio.create_task(sample_inflight(session, url, done, samples))
        f = await client.files.create(file=("lines.jsonl", io.BytesIO(data)), purpose="batch")
        start = time.perf_counter()
        batch = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            await asyncio.sleep(0.1)
            batch = await client.batches.retrieve(batch.id)
        outcome["seconds"] = time.perf_counter() - start
        done.set()
        await sampler
        outcome["batch"] = batch
        if batch.output_file_id is not None:
            text = (await client.files.content(batch.output_file_id)).text
            outcome["ids"] = [orjson.loads(x)["custom_id"] for x in text.splitlines()]

    interactive = await alongside(url, args, work)
    await client.close()
    batch = outcome["batch"]
    ids = outcome.get("ids", [])
    if sorted(ids) != sorted(r["custom_id"] for r in rows):
        print(f"  !! output file: {len(ids)} lines, {len(set(ids))} custom_ids", flush=True)
    usage = batch.model_dump().get("usage") or {}
    return Phase(
        name=f"Batch API ({batch.status})",
        lines=len(rows),
        answered=len(set(ids)),
        seconds=outcome["seconds"] * args.time_scale,
        output_tokens=int(usage.get("output_tokens") or 0),
        peak=max(samples, default=0),
        mean_inflight=statistics.fmean(samples) if samples else 0.0,
        interactive=interactive,
    )


async def closed_phase(
    url: str, rows: list[dict[str, Any]], workers: int, args: argparse.Namespace
) -> Phase:
    headers = {"X-Turnout-Policy": args.policy, "X-Request-Class": "batch"}
    bodies = iter([orjson.dumps(r["body"]) for r in rows])
    results: list[Result] = []
    elapsed: list[float] = []

    async def work(session: aiohttp.ClientSession) -> None:
        await asyncio.sleep(2.0 / args.time_scale)
        start = time.perf_counter()

        async def worker() -> None:
            for body in bodies:  # one shared iterator: each line is sent once
                endpoint = url + "/v1/chat/completions"
                results.append(
                    await one(session, endpoint, body, headers, "batch", args.time_scale, start)
                )

        await asyncio.gather(*(worker() for _ in range(workers)))
        elapsed.append(time.perf_counter() - start)

    interactive = await alongside(url, args, work)
    ok = [r for r in results if r.ok]
    return Phase(
        name=f"closed loop x{workers}",
        lines=len(rows),
        answered=len(ok),
        seconds=elapsed[0] * args.time_scale,
        output_tokens=sum(r.output for r in ok),
        peak=workers,
        mean_inflight=float(workers),
        interactive=interactive,
    )


def report(phases: Sequence[Phase], slo_ttft: float) -> None:
    print(f"\n{'phase':<24} {'lines':>6} {'answered':>8} {'model s':>8} {'lines/s':>8} "
          f"{'out tok/s':>10} {'peak':>5} {'mean':>6} {'inter n':>8} {'P50 TTFT':>9} "
          f"{'P95 TTFT':>9}")  # fmt: skip
    verdicts = []
    for p in phases:
        ttfts = [r.ttft for r in p.interactive if r.ok and r.ttft is not None]
        p95 = percentile(ttfts, 0.95)
        verdicts.append(f"{p.name}: {'within' if p95 <= slo_ttft else 'OVER'}")
        print(f"{p.name:<24} {p.lines:>6} {p.answered:>8} {p.seconds:>8.1f} "
              f"{p.answered / p.seconds:>8.2f} {p.output_tokens / p.seconds:>10.0f} {p.peak:>5} "
              f"{p.mean_inflight:>6.1f} {len(p.interactive):>8} {percentile(ttfts, 0.5):>9.3f} "
              f"{p95:>9.3f}")  # fmt: skip
    print(f"(interactive TTFT SLO: {slo_ttft:g} s; peak/mean: lines in flight)")
    print("interactive P95 TTFT against the SLO: " + "; ".join(verdicts))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=2000)
    p.add_argument("--time-scale", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=1.0, help="interactive req/s (model time)")
    p.add_argument("--policy", default="class-split")
    p.add_argument("--max-concurrency", type=int, default=64, help="the batch window's ceiling")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    slo = config_slos(DEFAULT_CONFIG)["interactive"]
    rows = batch_lines(args.lines, args.seed + 7)
    config = scaled_config(DEFAULT_CONFIG, args.time_scale, args.seed)
    config["default_policy"] = args.policy
    print(f"{args.lines} lines, time scale {args.time_scale:g}, interactive {args.rate:g} req/s, "
          f"policy {args.policy}", flush=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        config["batch"] = {"data_dir": tmp, "max_concurrency": args.max_concurrency}
        # The Batch API's files belong to a key (the interactive loop goes without one).
        config["api_keys"] = [{"name": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]
        proc, url = start_router(config, Path(tmp))
        try:
            batch = uvloop.run(batch_phase(url, rows, args))
        finally:
            stop(proc)
        print(f"  batch done: {batch.seconds:.1f} model s, peak {batch.peak} in flight", flush=True)
        proc, url = start_router(config, Path(tmp))
        try:
            closed = uvloop.run(closed_phase(url, rows, max(1, batch.peak), args))
        finally:
            stop(proc)
    report([batch, closed], slo.ttft_s)
    return 0 if batch.answered == args.lines else 1


if __name__ == "__main__":
    sys.exit(main())
