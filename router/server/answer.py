"""The request path's view of the client, whichever HTTP server took the request.

Proxied requests arrive through one of two servers: the lean HTTP/1.1 protocol
(router.server.wire), which takes every request of the usual shape on the public port, and
aiohttp, which serves the rest (other routes, requests of an unusual shape: see
router.server.wire) and the batch lines' loopback site (router.server.site.AiohttpClient).
The request path (router.proxy) reads the request and streams its answer through
:class:`Client` and returns an :class:`Answer` for whatever it did not stream, so it has one
body whichever server runs it.
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

    A stream relayed straight to the transport (router.proxy.relay) attaches its pause and
    resume callbacks; they are called when the client's socket buffer fills and drains. The
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

    async def start(self, status: int, headers: Mapping[str, str]) -> asyncio.Transport | None:
        """Send a chunked answer's head; the transport to write its chunks to, or None if
        the client has gone."""
        ...

    async def end(self) -> None:
        """End the chunked answer; raises ``ConnectionResetError`` if the client has gone."""
        ...


Serve = Callable[[Client], Coroutine[Any, Any, Answer | None]]
"""A route of the request path: its :class:`Answer`, or None once it streamed one."""
