"""How fast the capture writer turns large requests into lines, alone (no router, no flood).

    python -m benchmarks.capture_writer [--lines 20] [--megabytes 8] [--router-root PATH]

For each redaction mode, a writer (router.observe.capture) with its sink process is given
``--lines`` finished chat requests of ``--megabytes`` MiB each (a lorem-ipsum prompt) at
once, and the time until the sink has written them all is printed as lines per second. The
writer runs in a child process from ``--router-root`` (e.g. an older commit exported with
``git archive``), so figures of two versions sit side by side; the requests it is given
answer both the old and the new writer's questions.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_CHILD = """
import asyncio, os, sys, tempfile, time
from router.config.model import CaptureSettings
from router.observe.capture import CaptureWriter
from turnout.common.capture import CaptureRecord, Response

mode, lines, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = "lorem ipsum dolor sit amet "
body = {"model": "m", "messages": [{"role": "user", "content": (words * (size // 27))[:size]}]}
raw = str(body).encode()


class Finished:
    def __init__(self, rid):
        self.request_id = rid
        self.capture_bytes = len(raw)

    def capture_record(self, t0):
        return CaptureRecord(self.request_id, "/v1/chat/completions", body, resp=Response(404))


async def main():
    path = os.path.join(tempfile.mkdtemp(), "capture.jsonl")
    known = CaptureSettings.__dataclass_fields__
    unbounded = {"queue_bytes": 1 << 40} if "queue_bytes" in known else {}
    settings = CaptureSettings(path=path, redaction=mode, **unbounded)
    writer = CaptureWriter(settings, on_drop=print, on_degraded=print)
    await writer.start()
    start = time.perf_counter()
    for i in range(lines):
        writer.record(Finished(f"r{i}"))
    await writer.aclose()
    took = time.perf_counter() - start
    written = open(path, "rb").read().count(b"\\n")
    print(f"{mode:5} {written} lines in {took:.2f} s: {written / took:.2f} lines/s")


asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.capture_writer")
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--megabytes", type=float, default=8.0, help="MiB a request")
    parser.add_argument("--router-root", type=Path, default=ROOT, help="checkout to run")
    args = parser.parse_args()
    root = args.router_root.resolve()
    print(f"writer from {root}: {args.lines} requests of {args.megabytes:g} MiB")
    for mode in ("none", "hash", "drop"):
        argv = [sys.executable, "-c", _CHILD, mode, str(args.lines),
                str(int(args.megabytes * (1 << 20)))]  # fmt: skip
        subprocess.run(argv, cwd=root, check=True)


if __name__ == "__main__":
    main()
