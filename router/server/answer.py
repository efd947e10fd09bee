"""The request path's view of the client, whichever HTTP server took the request.

Proxied requests arrive through one of two servers: the lean HTTP/1.1 protocol
(router.server.wire), which takes every request of the usual shape on the public port, and
aiohttp, which serves the rest (other routes, requests of an unusual shape: see
router.server.wire; router.server.site.AiohttpClient). Batch lines arrive through no server:
the executor runs them in-process (router.batch.lines.LineRequest). The request path
(router.proxy) reads the request and streams its answer through :class:`Client` and returns
an :class:`Answer` for whatever it did not stream, so it has one body whoever runs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDictProxy

from router.config.model import LimitSettings


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole answer: status, headers (the server adds framing, ``Server`` and ``Date``)
    and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def response(self) -> web.Response:
        """The answer as aiohttp sends it."""
        return web.Response(status=self.status, body=self.body, headers=self.headers)


class FlowControl:
    """The client socket's writability, for a producer that writes straight to its transport,
    and the timeout for a client that reads none of it.

    A stream relayed as it arrives (router.proxy.relay) attaches its pause and resume
    callbacks; they are called when the client's socket buffer fills and drains. The
    connection's protocol reports both (:meth:`pause`, :meth:`resume`), and while the buffer
    stays full a timer runs that aborts the connection: no per-chunk work, one timer a pause.
    """

    __slots__ = ("_pause", "_resume", "_stall", "paused")

    def __init__(self) -> None:
        self.paused = False
        self._pause: Callable[[], None] | None = None
        self._resume: Callable[[], None] | None = None
        self._stall: asyncio.TimerHandle | None = None

    def attach(self, pause: Callable[[], None], resume: Callable[[], None]) -> None:
        """Route writability changes to ``pause``/``resume`` (paused now: ``pause`` at once)."""
        self._pause, self._resume = pause, resume
        if self.paused:
            pause()

    def detach(self) -> None:
        self._pause = self._resume = None

    def pause(self, transport: asyncio.WriteTransport, timeout: float) -> None:
        """The socket's buffer is full: pause the producer, and abort the connection if the
        client reads nothing more for ``timeout`` seconds (abort, not close: close would wait
        to flush the very buffer nobody reads)."""
        self.paused = True
        self._stall = asyncio.get_running_loop().call_later(timeout, transport.abort)
        if self._pause is not None:
            self._pause()

    def resume(self) -> None:
        """The socket's buffer has drained: the producer goes on."""
        self.stop()
        self.paused = False
        if self._resume is not None:
            self._resume()

    def stop(self) -> None:
        """Stop the stalled-reader timer (the connection is gone or changes hands)."""
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None


class Chunked:
    """:class:`Chunks` written straight to the client connection's transport, as both servers
    answer a stream: one ``write`` a chunk, framed in the one copy the frame needs."""

    __slots__ = ("_transport",)

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))

    async def end(self) -> None:
        if self._transport.is_closing():
            raise ConnectionResetError("the client has gone")
        self._transport.write(b"0\r\n\r\n")


class Client(Protocol):
    """One request as the request path sees it, and the connection its answer goes out on."""

    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def headers(self) -> CIMultiDictProxy[str]: ...
    @property
    def flow(self) -> FlowControl:
        """The client socket's writability."""
        ...

    async def body(self, limit: int, limits: LimitSettings) -> bytes:
        """The whole body: 415 unless declared JSON, 413 past ``limit`` bytes, 408 when it
        takes longer than ``limits.body_seconds`` (raised as router.server.errors.RouterError)."""
        ...

    async def start(self, status: int, headers: Mapping[str, str]) -> Chunks | None:
        """Send a chunked answer's head; the answer to write its body to, or None if the
        client has gone."""
        ...


class Chunks(Protocol):
    """A chunked answer whose head is out: the server's per-request response object.

    It owns the HTTP framing, so the request path hands it bytes and never sees a transport
    or the server behind it. Both calls come from any context: :meth:`write` is called from
    the upstream connection's ``data_received`` (router.proxy.relay), so it writes at once
    and never waits (back-pressure goes through :class:`FlowControl`).
    """

    def write(self, data: bytes) -> None:
        """Send ``data`` (not empty) as one piece of the body; nothing once the client has
        gone."""
        ...

    async def end(self) -> None:
        """End the answer; raises ``ConnectionResetError`` if the client has gone."""
        ...


Serve = Callable[[Client], Coroutine[Any, Any, Answer | None]]
"""A route of the request path: its :class:`Answer`, or None once it streamed one."""
