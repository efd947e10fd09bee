"""The public B200 run's benchmark shape against each emulator profile, over real HTTP.

100 streaming completions at concurrency 16, 8,192 prompt tokens and 1,024 forced output
tokens each, closed loop (a new request the moment one finishes), exactly as the published
run. Each profile runs in its own emulator process at ``--time-scale`` (default 2, so both
finish in under two minutes); measured times are multiplied back by the scale and printed
beside the published figures with their ratio. The client is aiohttp plus the project's SSE
meter (the test suite checks the same targets with the official openai client instead).

    python -m benchmarks.calibrate_emulator [--time-scale 2] [--profiles vllm deepinfer]
                                            [--url URL --profiles NAME]   # a running emulator
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import aiohttp
import orjson

from emulator.calibration import MIN_P95_TTFT_RATIO, SHAPE, compare, p95_ttft_ratio, table
from emulator.simulate import figures
from router.server.children import stop_all
from turnout.common.sse import StreamMeter


@contextlib.contextmanager
def emulator(profile: str, time_scale: float) -> Iterator[str]:
    """Run ``python -m turnout emulator`` on a free loopback port; yield its URL."""
    cmd = [sys.executable, "-m", "turnout", "emulator", "--profile", profile, "--port", "0",
           "--time-scale", str(time_scale)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("emulator listening on "):
            raise RuntimeError(f"emulator {profile} did not start: {line!r}")
        yield line.removeprefix("emulator listening on ")
    finally:
        stop_all([proc], 10)


def _body(i: int) -> bytes:
    """A distinct prompt of exactly ``prompt_tokens`` tokens under the shared rule."""
    words = " ".join(["token"] * (SHAPE["prompt_tokens"] - 1))
    return orjson.dumps({
        "prompt": f"r{i} {words}", "max_tokens": SHAPE["output_tokens"], "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    })  # fmt: skip


async def _one(session: aiohttp.ClientSession, url: str, i: int) -> StreamMeter:
    start = time.perf_counter()
    meter = StreamMeter(start, keep_itl=True)
    async with session.post(url + "/v1/completions", data=_body(i)) as resp:
        resp.raise_for_status()
        async for data in resp.content.iter_any():
            meter.feed(data, time.perf_counter())
    return meter


async def run_shape(url: str, time_scale: float) -> dict[str, float]:
    """Closed-loop run of the public shape; figures in model time (real × scale)."""
    meters: list[StreamMeter] = []
    pending = iter(range(SHAPE["requests"]))
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    conn = aiohttp.TCPConnector(limit=SHAPE["concurrency"])
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:

        async def worker() -> None:
            for i in pending:
                meters.append(await _one(session, url, i))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(SHAPE["concurrency"])))
        duration = time.perf_counter() - t0
    got = [m.figures() for m in meters]
    ok = [f for f in got if f.ttft is not None and f.e2e is not None and f.done]
    x = time_scale
    return figures(
        [f.ttft * x for f in ok],  # type: ignore[operator]
        [g * x for f in ok for g in f.itls or []],
        [f.e2e * x for f in ok],  # type: ignore[operator]
        sum(f.completion_tokens or 0 for f in ok),
        duration * x,
    )


def calibrate(name: str, url: str, time_scale: float) -> dict[str, float]:
    """Run the shape against ``url`` (profile ``name``) and print the comparison table."""
    t0 = time.monotonic()
    figs = asyncio.run(run_shape(url, time_scale))
    done = int(figs["completed"])
    print(f"\n{name}: {done}/{SHAPE['requests']} requests, {time.monotonic() - t0:.0f}s wall "
          f"at time scale {time_scale:g}")  # fmt: skip
    print(table(name, compare(name, figs)), flush=True)
    return figs


def verdict(results: dict[str, dict[str, float]]) -> bool:
    """Print the tail ratio; True if every figure is within its tolerance."""
    ok = all(r.ok for name, figs in results.items() for r in compare(name, figs))
    if {"vllm", "deepinfer"} <= results.keys():
        ratio = p95_ttft_ratio(results["deepinfer"], results["vllm"])
        ok &= ratio >= MIN_P95_TTFT_RATIO
        print(f"\nP95 TTFT deepinfer / vllm: {ratio:.2f} (published 1.97, required "
              f">= {MIN_P95_TTFT_RATIO})")  # fmt: skip
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the calibration and print measured vs published; exit 1 if out of tolerance."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--time-scale", type=float, default=2.0)
    p.add_argument("--profiles", nargs="+", default=["vllm", "deepinfer"])
    p.add_argument("--url", help="benchmark this running emulator (one profile)")
    args = p.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    for name in args.profiles:
        if args.url:
            results[name] = calibrate(name, args.url, args.time_scale)
        else:
            with emulator(name, args.time_scale) as url:
                results[name] = calibrate(name, url, args.time_scale)
    return 0 if verdict(results) else 1


if __name__ == "__main__":
    sys.exit(main())
