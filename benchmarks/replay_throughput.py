"""Replayer timing at scale: sustained request rate, send lag, and memory over a big file.

A deliberately trivial target (a raw asyncio HTTP server in its own process that answers
every request with the same short SSE stream) takes the server out of the picture. The
script writes capture files at a fixed arrival rate, replays each with the real ``replay``
CLI in its own process, and prints per run: requests, completed, achieved request rate, send
lag P50/P99 and the replayer's peak RSS. Two file sizes at the same rate show whether memory
stays flat as the file grows (it is streamed, never loaded whole)::

    .venv/bin/python -m benchmarks.replay_throughput                 # 1,000 req/s, 10k and 100k
    .venv/bin/python -m benchmarks.replay_throughput --rate 1500 --sizes 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import uvloop

from router.server.children import spawn_ready
from turnout.common.capture import CaptureRecord, dump_line

_EVENTS = b"".join(
    b'data: {"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}\n\n'
    for _ in range(4)
) + (
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":4}}\n\n'
    b"data: [DONE]\n\n"
)
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"content-length: " + str(len(_EVENTS)).encode() + b"\r\n\r\n" + _EVENTS
)


class _Answer(asyncio.Protocol):
    """Keep-alive HTTP/1.1: for every complete request (headers + body), one canned reply."""

    def __init__(self) -> None:
        self._buf = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].lower()
            length = 0
            i = head.find(b"content-length:")
            if i >= 0:
                j = head.find(b"\r\n", i)
                length = int(head[i + 15 : j if j >= 0 else len(head)])
            if len(buf) < end + 4 + length:
                break
            buf = buf[end + 4 + length :]
            assert self._transport is not None
            self._transport.write(_RESPONSE)
        self._buf = buf


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    print(f"target listening on http://127.0.0.1:{port}", flush=True)
    await server.serve_forever()


def write_capture(path: Path, n: int, rate: float) -> None:
    """``n`` small streamed chat requests arriving at a steady ``rate`` per second."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    with path.open("wb") as f:
        for i in range(n):
            f.write(
                dump_line(
                    CaptureRecord(
                        f"r{i}", "/v1/chat/completions", body, t_offset_ms=i * 1000.0 / rate
                    )
                )
            )


def replay_once(capture: Path, target: str, out: Path) -> tuple[dict[str, float], float, float]:
    """Run the replay CLI; return its overall metrics, wall time and peak RSS (MiB)."""
    argv = [
        sys.executable,
        "-m",
        "turnout",
        "replay",
        str(capture),
        "--target",
        target,
        "--out",
        str(out),
    ]
    start = time.monotonic()
    proc = subprocess.Popen([*argv, "--no-progress"], stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    if proc.returncode:
        raise RuntimeError(f"replay exited {proc.returncode}")
    metrics = json.loads(out.read_text())["runs"][0]["overall"]
    return metrics, wall, usage.ru_maxrss / 1024.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=1000.0, help="arrivals per second")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        uvloop.run(_serve())
        return 0
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # children inherit it
    argv = [sys.executable, "-m", "benchmarks.replay_throughput", "--serve"]
    target_proc, target = spawn_ready(argv, "target listening on", 20)
    print(f"replay vs a trivial SSE target, arrivals at {a.rate:,.0f} req/s")
    cols = ("requests", "completed", "req/s", "lag p50 ms", "lag p99 ms", "peak RSS MiB", "wall s")
    print(" ".join(f"{c:>12}" for c in cols))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in a.sizes:
                cap = Path(tmp) / f"cap-{n}.jsonl"
                write_capture(cap, n, a.rate)
                m, wall, rss = replay_once(cap, target, Path(tmp) / "r.json")
                row = (n, m["completed"], m["request_throughput"], m["send_lag_p50_ms"],
                       m["send_lag_p99_ms"], rss, wall)  # fmt: skip
                print(" ".join(f"{v:12,.2f}" if isinstance(v, float) else f"{v:12,d}" for v in row))
    finally:
        target_proc.terminate()
        target_proc.wait(10)
        if target_proc.stdout is not None:
            target_proc.stdout.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
