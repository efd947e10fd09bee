"""A throwaway redis-server for the benchmarks that share limits or placements through one:
Debian's redis-server package, on loopback, nothing saved."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from router.server.children import stop_all


@contextmanager
def redis_server(directory: Path) -> Iterator[tuple[str, int]]:
    """A running server for the block (its files, if any, in ``directory``): its URL and
    its pid."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (Debian's redis-server package)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir",
            str(directory)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        stop_all([proc])
