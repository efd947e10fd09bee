"""A throwaway redis-server for tests: loopback only, nothing saved to disk.

Debian's ``redis-server`` package (``.ci/run`` installs it) puts the binary on PATH; without
it the tests that need a server are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A server on a fixed loopback port, which a test may stop and start again."""

    def __init__(self, binary: str) -> None:
        self._binary = binary
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [self._binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        self._proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start listening")

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None


@contextlib.contextmanager
def start_redis() -> Iterator[RedisServer]:
    """A running server for the block."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (Debian's redis-server package)")
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
