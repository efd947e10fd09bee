"""A raw HTTP server on loopback playing scripted bytes, for the router's HTTP client tests.

Each accepted connection runs a script (``Peer`` -> awaitable), so a test decides exactly how
the response is framed, split, delayed or cut off.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from router.proxy.connection import Connection
from router.proxy.keepalive import ConnectionPool
from router.proxy.origin import Origin, request_head

BODY = b'{"model":"m","prompt":"hi","stream":true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
EVENTS = (
    b'data: {"id":"c1","choices":[{"text":"Hel"}]}\n\n',
    b'data: {"id":"c1","choices":[{"text":"lo"}]}\n\n',
    b"data: [DONE]\n\n",
)


@dataclass
class Peer:
    """One accepted connection as a server script sees it; ``n`` counts from 1."""

    n: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    requests: list[bytes]

    async def request(self) -> None:
        """Read one request (head and Content-Length body) and record it."""
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"\r\ncontent-length: *(\d+)\r\n", head, re.IGNORECASE)
        assert length is not None, head
        self.requests.append(head + await self.reader.readexactly(int(length[1])))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def client_gone(self) -> None:
        """Return once the client has closed or reset the connection."""
        while await self.reader.read(65536):
            pass


Script = Callable[[Peer], Awaitable[None]]


class Backend:
    """A raw HTTP server on loopback playing ``script`` on each accepted connection."""

    def __init__(self, script: Script) -> None:
        self.accepted = 0
        self.requests: list[bytes] = []
        self._script = script
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def origin(self) -> Origin:
        assert self._server is not None
        return Origin("http", "127.0.0.1", self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> Backend:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        if self._tasks:
            # Scripts end when their client closes; one still running is a stuck test.
            _, stuck = await asyncio.wait(self._tasks, timeout=2)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._script(Peer(self.accepted, reader, writer, self.requests))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away (or the test is over): nothing left to serve
        finally:
            writer.transport.abort()


def answer_each(response: bytes) -> Script:
    """A script answering every request on its connection with ``response``."""

    async def script(peer: Peer) -> None:
        while True:
            await peer.request()
            await peer.send(response)

    return script


def answer_once(raw: bytes) -> Script:
    """A script that answers one request with ``raw``, then waits for its client to go."""

    async def script(peer: Peer) -> None:
        await peer.request()
        await peer.send(raw)
        await peer.client_gone()

    return script


async def until(predicate: Callable[[], bool], seconds: float = 2.0) -> None:
    """Poll ``predicate`` every millisecond; TimeoutError if it stays false for ``seconds``."""
    async with asyncio.timeout(seconds):
        while not predicate():
            await asyncio.sleep(0.001)


async def start(pool: ConnectionPool, origin: Origin, deadline: float | None = None) -> Connection:
    """Acquire a connection and send one completion request on it."""
    conn = await pool.acquire(origin, 1.0)
    head = request_head(origin, "/v1/completions", {"Content-Type": "application/json"}, len(BODY))
    conn.send(head, BODY, deadline=deadline)
    return conn


def chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n" % (len(data), extension, data)


CHUNKED_CUT = CHUNKED + chunk(EVENTS[0]) + b"40\r\ndata: half"  # cut inside the second chunk
