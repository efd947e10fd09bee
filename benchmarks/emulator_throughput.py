"""How many streamed chunks per second one emulator process serves (it runs on one core).

Starts ``turnout emulator --profile vllm`` at ``--time-scale`` (default 10: a 64-sequence
decode step lasts about 1.2 ms, so every step is its own wake-up and every chunk its own write, the
realistic worst case), then runs N concurrent streaming completions with a lightweight
aiohttp client that counts SSE events. Prints chunks/s over wall time and per
CPU-second of the emulator process (read from /proc), the figure that does not depend on how
busy the client or the machine is.

    python -m benchmarks.emulator_throughput [--streams 64] [--tokens 2000] [--seconds 10]
                                            [--time-scale 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import aiohttp
import orjson


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _worker(session: aiohttp.ClientSession, url: str, tokens: int, stop: float) -> int:
    body = orjson.dumps({"prompt": "benchmark", "max_tokens": tokens, "ignore_eos": True,
                         "stream": True})  # fmt: skip
    chunks = 0
    while time.perf_counter() < stop:
        async with session.post(url + "/v1/completions", data=body) as resp:
            tail = b""
            async for data in resp.content.iter_any():
                buf = tail + data
                chunks += buf.count(b"data: {")
                tail = buf[-6:]  # a marker split across reads is counted once, with the rest
    return chunks


async def _run(url: str, streams: int, tokens: int, seconds: float, pid: int) -> None:
    conn = aiohttp.TCPConnector(limit=streams)
    async with aiohttp.ClientSession(connector=conn) as session:
        cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
        stop = t0 + seconds
        counts = await asyncio.gather(
            *(_worker(session, url, tokens, stop) for _ in range(streams))
        )
        wall, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
    total = sum(counts)
    print(f"streams={streams} tokens/request={tokens} duration={wall:.1f}s events={total}")
    print(f"chunks/s (wall): {total / wall:,.0f}")
    print(f"emulator CPU: {cpu:.1f}s of {wall:.1f}s ({cpu / wall:.0%} of one core)")
    print(f"chunks per emulator CPU-second (one core): {total / cpu:,.0f}")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--time-scale", type=float, default=10.0)
    args = p.parse_args(argv)
    cmd = [sys.executable, "-m", "turnout", "emulator", "--profile", "vllm", "--port", "0",
           "--time-scale", str(args.time_scale)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        url = line.removeprefix("emulator listening on ")
        if not url.startswith("http://"):
            print(f"emulator did not start: {line!r}", file=sys.stderr)
            return 1
        asyncio.run(_run(url, args.streams, args.tokens, args.seconds, proc.pid))
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
