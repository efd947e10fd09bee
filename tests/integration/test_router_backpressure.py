"""Back-pressure through the router: a client that stops reading stops the engine's stream.

The upstream here is a raw socket server that writes an SSE stream as fast as its socket
takes it and counts what it got out. Through a router whose client never reads, that count
must plateau at roughly the sockets' buffers: the router pauses reading from the upstream
while the client's buffer is full instead of reading everything into its own memory.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

from tests.router.harness import base_config, get, start_router, write_config

MODEL = "bp-model"
TOTAL = 256 * 1024 * 1024  # what the upstream would send if nothing held it back
LIMIT = 64 * 1024 * 1024  # far above what the sockets between upstream and client can hold
_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 16000 + b'"}}]}\n\n'
_CHUNK = b"%x\r\n%s\r\n" % (len(_EVENT), _EVENT)


class _FloodingUpstream:
    """Answers GETs with small JSON, every POST with an endless fast SSE stream."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self.sent = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            buf = b""
            while not self._stop.is_set():
                while b"\r\n\r\n" not in buf:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                if head.startswith(b"POST"):
                    self._flood(conn)
                    return
                doc = json.dumps({"object": "list", "data": [{"id": MODEL}]}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc)
                )

    def _flood(self, conn: socket.socket) -> None:
        conn.settimeout(None)  # blocks while held back; fails once the router drops it
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            while self.sent < TOTAL and not self._stop.is_set():
                conn.sendall(_CHUNK)
                self.sent += len(_CHUNK)


def _plateau(up: _FloodingUpstream) -> int:
    """What the upstream got out once it has sent nothing more for a second."""
    deadline = time.monotonic() + 20
    last, since = up.sent, time.monotonic()
    while time.monotonic() - since < 1.0:
        assert up.sent < LIMIT, f"the router kept reading: {up.sent} bytes"
        assert time.monotonic() < deadline, f"never held back ({up.sent} bytes out)"
        time.sleep(0.05)
        if up.sent != last:
            last, since = up.sent, time.monotonic()
    return last


@contextlib.contextmanager
def _upstream() -> Iterator[_FloodingUpstream]:
    up = _FloodingUpstream()
    try:
        yield up
    finally:
        up.close()


def test_a_client_that_does_not_read_holds_the_upstream_back(tmp_path: Path) -> None:
    with _upstream() as up:
        doc = base_config([("flood", "vllm", up.url)])
        doc["health"] = {"interval": 5.0, "scrape_metrics": False}
        doc["limits"] = {"write_timeout": 30.0}
        with start_router(write_config(tmp_path, doc)) as router:
            body = json.dumps(
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
            ).encode()
            parts = urlsplit(router.url)
            assert parts.hostname is not None and parts.port is not None
            client = socket.create_connection((parts.hostname, parts.port), timeout=5)
            try:
                client.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body)
                )
                held = _plateau(up)
                # Sockets' buffers on both sides of the router hold a few MB at most.
                assert held < LIMIT, held
                # Reading again resumes the flow: the client gets more than was buffered.
                client.settimeout(5)
                got = 0
                deadline = time.monotonic() + 10
                while got < held + 8 * 1024 * 1024 and time.monotonic() < deadline:
                    data = client.recv(1 << 20)
                    assert data, "router closed the stream"
                    got += len(data)
                assert got >= held + 8 * 1024 * 1024, (got, held)
            finally:
                client.close()
            assert get(router.url + "/health").status == 200
