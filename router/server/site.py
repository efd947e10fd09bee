"""Connection-level limits: how many sockets, how long idle, how much header, slow readers.

aiohttp parses HTTP and enforces header sizes itself; this module plugs in where it cannot
be configured from outside:

- :class:`GuardedHandler` answers HTTP-level rejections (malformed request line, oversized
  or conflicting headers, smuggling shapes) in OpenAI's error JSON rather than text, and
  disconnects a client that has not read any of its answer for ``write_timeout`` seconds.
  The second needs no per-chunk work: asyncio calls ``pause_writing`` when the socket's send
  buffer is full, which starts one timer; ``resume_writing`` stops it. While paused, the
  relay's ``write`` waits, so the router stops reading from the upstream and the upstream's
  TCP window closes: a slow client throttles its engine instead of growing router memory.
- :class:`GuardedSite` caps open connections (the next one gets a 503 and is closed; a run
  of refusals is logged once, :class:`Cap`).
- :func:`single_headers` refuses a request that repeats a header the router acts on (two
  ``Authorization`` or ``X-Turnout-Policy`` values would otherwise be read as the first
  by the router and maybe as the last by something else).

Idle connections, including ones that send part of a request and stop (slowloris), are
closed by aiohttp's keep-alive timer, which runs from the moment a connection opens.

:class:`GuardedHandler` subclasses aiohttp's ``RequestHandler`` and overrides its
``handle_error`` (public in name, not documented as an extension point): the integration
tests' malformed-request corpus notices if an aiohttp upgrade changes it. Its
``eof_received`` answers a half-closed client (aiohttp closes at once) and reads whether the
handler is idle as aiohttp's own keep-alive timer does (its private ``_waiter``):
tests/router/test_wire.py and tests/integration/test_half_close.py notice if that changes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server
from multidict import CIMultiDictProxy

from router.config.model import LimitSettings
from router.server.answer import Answer, Chunked, FlowControl, Serve
from router.server.errors import SERVER, RouterError, error_body, error_response

log = logging.getLogger("router")
_MAX_MESSAGE = 200
# Media types read as JSON: JSON itself, and none declared (see check_media).
_JSON = frozenset({"application/json", "application/octet-stream", ""})
# Encodings the body arrives decoded from: aiohttp's parser decodes these (br and zstd only
# with their modules installed; without, it refuses the request with a 400 itself), and the
# router forwards the decoded body without the header. Compared as aiohttp does: lower-cased.
_DECODED = frozenset({"", "identity", "gzip", "deflate", "br", "zstd"})
# Headers the router reads or rewrites: each may appear at most once.
SINGLE = ("authorization", "content-type", "host", "x-request-class", "x-request-id",
          "x-session-id", "x-turnout-policy")  # fmt: skip


@web.middleware
async def single_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    """400 for a repeated header from :data:`SINGLE` (aiohttp already refuses repeated
    ``Content-Length`` and ``Transfer-Encoding``)."""
    headers = request.headers
    if len(headers) > len(set(map(str.lower, headers))):
        for name in SINGLE:
            if len(headers.getall(name, ())) > 1:
                message = f"header '{name}' given more than once"
                return error_response(RouterError(400, message, name, "duplicate_header"))
    return await handler(request)


async def read_body(request: web.Request, limit: int, limits: LimitSettings) -> bytes:
    """The whole request body, decoded: 415 unless it is declared JSON (or not declared) in
    an encoding aiohttp decodes, 413 past ``limit`` bytes (decoded), 408 when it takes longer
    than ``limits.body_seconds`` to arrive (a client trickling its body holds a handler)."""
    check_media(request.headers)
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    try:
        if request.content.is_eof():  # it came with the head: nothing to wait for, no timer
            return await request.read()
        async with asyncio.timeout(limits.body_seconds):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
    except TimeoutError:
        raise too_slow(limits) from None


def check_media(headers: CIMultiDictProxy[str]) -> None:
    """415 (as vLLM's server answers) for a body declared as anything but JSON, or encoded in
    a way the body did not arrive decoded from. A missing Content-Type, or the generic
    ``application/octet-stream`` that clients send for bytes of no declared type (RFC 9110
    8.3), is let through: the body is then parsed as JSON like any other."""
    media = headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
    if media not in _JSON:
        message = "Content-Type must be application/json"
        raise RouterError(415, message, "Content-Type", "unsupported_media_type")
    encodings = headers.getall("Content-Encoding", ())
    if len(encodings) > 1 or (encodings and encodings[0].lower() not in _DECODED):
        message = "Content-Encoding must be one of: identity, gzip, deflate, br, zstd"
        raise RouterError(415, message, "Content-Encoding", "unsupported_media_type")


def too_slow(limits: LimitSettings) -> RouterError:
    """The 408 for a body that did not arrive within ``limits.body_seconds``."""
    message = f"request body not received within {limits.body_seconds} s"
    return RouterError(408, message, code="request_timeout")


def too_large(limit: int) -> RouterError:
    return RouterError(413, f"request body exceeds {limit} bytes", code="request_too_large")


def handler_options(limits: LimitSettings) -> dict[str, Any]:
    """Keyword arguments for ``web.AppRunner`` that aiohttp passes to each connection.

    ``lingering_time``: after an answer sent before its request's body was read (a 413, a
    408), aiohttp reads and drops the rest so that the client gets the answer rather than a
    reset; for at most ``body_seconds``, as the lean server does, not its own 10 s.
    """
    return {
        "keepalive_timeout": limits.idle_seconds,
        "lingering_time": limits.body_seconds,
        "max_headers": limits.max_headers,
        "max_field_size": limits.max_header_bytes,
        "max_line_size": limits.max_header_bytes,
    }


class OpenConnections:
    """The number of connections one site has open."""

    def __init__(self) -> None:
        self.count = 0


def flow_control(request: BaseRequest) -> FlowControl:
    """The flow control of the connection ``request`` arrived on.

    A connection not served by :class:`GuardedHandler` (none in the router's own server) gets
    one that never pauses.
    """
    protocol = request.protocol
    return protocol.flow if isinstance(protocol, GuardedHandler) else FlowControl()


class AiohttpClient:
    """:class:`router.server.answer.Client` over an aiohttp request."""

    __slots__ = ("_out", "_request")

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._out: web.StreamResponse | None = None

    @property
    def method(self) -> str:
        return self._request.method

    @property
    def path(self) -> str:
        return self._request.path

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        return self._request.headers

    @property
    def flow(self) -> FlowControl:
        return flow_control(self._request)

    async def body(self, limit: int, limits: LimitSettings) -> bytes:
        return await read_body(self._request, limit, limits)

    async def start(self, status: int, headers: Mapping[str, str]) -> Chunked | None:
        self._out = out = web.StreamResponse(status=status, headers=headers)
        await out.prepare(self._request)  # sends the head, and chunked (no length given)
        transport = self._request.transport
        return None if transport is None else _AiohttpChunks(transport, out)

    async def answer(self, serve: Serve) -> web.StreamResponse:
        """Run ``serve`` for this request; what aiohttp is to send (or has sent) for it."""
        answer: Answer | None = await serve(self)
        if answer is None:
            assert self._out is not None
            return self._out
        return answer.response()


class _AiohttpChunks(Chunked):
    """A stream's body under aiohttp's head: written straight to the transport (aiohttp's
    own ``write`` is a coroutine, and the relay writes from ``data_received``), ended by
    aiohttp, which writes the last chunk and then serves the connection's next request."""

    __slots__ = ("_response",)

    def __init__(self, transport: asyncio.Transport, response: web.StreamResponse) -> None:
        super().__init__(transport)
        self._response = response

    async def end(self) -> None:
        await self._response.write_eof()  # its error on a closed transport: a ConnectionResetError


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler with JSON errors and a stalled-reader timeout."""

    __slots__ = ("_open", "_write_timeout", "flow")

    def __init__(
        self, manager: Server, *, opened: OpenConnections, write_timeout: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._open = opened
        self._write_timeout = write_timeout
        self.flow = FlowControl()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._open.count += 1
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._open.count -= 1
        self.flow.stop()
        super().connection_lost(exc)

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio's signature
        # A half-close: the client sends nothing more but may still read (HTTP/1.1 allows
        # it). aiohttp's own closes the connection at once, which cancels the request the
        # client has sent; here that request is answered, and the connection closes after.
        # Idle (waiting for a head, aiohttp's own test in _process_keepalive): close now.
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            return None
        self.close()
        return True

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.transport is not None:
            self.flow.pause(self.transport, self._write_timeout)

    def resume_writing(self) -> None:
        super().resume_writing()
        self.flow.resume()

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The rejection as OpenAI error JSON; the connection is closed after it."""
        if status >= 500:
            log.error("error handling a request", exc_info=exc)
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        text = (message or str(exc or "") or "bad request").splitlines()[0][:_MAX_MESSAGE]
        if status >= 500:
            text = "internal router error"
        resp = web.Response(
            status=status,
            body=error_body(status, text, code="bad_http"),
            content_type="application/json",
            headers={"Server": SERVER},
        )
        resp.force_close()
        return resp


_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nServer: turnout\r\n"
    b"Content-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Length: %d\r\n\r\n%s"
)


class Cap:
    """The most connections a site holds open, and the refusals past it.

    A run of refusals is logged when it begins and when it ends (a connection accepted with
    more than a tenth of the cap free again), not once a connection: a crowd of clients would
    otherwise flood the log at the moment the router is least able to afford it.
    """

    __slots__ = ("_on_refused", "_resume", "limit", "refused")

    def __init__(self, limit: int, on_refused: Callable[[], None] = lambda: None) -> None:
        self.limit = limit
        self._resume = limit - 1 - limit // 10
        self._on_refused = on_refused
        self.refused = 0
        """Connections refused in the current run (0: none is under way)."""

    def full(self, open_now: int) -> bool:
        """Whether a new connection, with ``open_now`` open, is to be refused."""
        if open_now < self.limit:
            if self.refused and open_now <= self._resume:
                log.info(
                    "accepting connections again: %d open, %d refused since the limit of %d "
                    "was reached",
                    open_now,
                    self.refused,
                    self.limit,
                )
                self.refused = 0
            return False
        if not self.refused:
            log.warning(
                "connection limit of %d reached: new connections get 503 until some close",
                self.limit,
            )
        self.refused += 1
        self._on_refused()
        return True


class _Refuse(asyncio.Protocol):
    """The answer for a connection beyond ``max_connections``: 503, then close."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        body = error_body(503, "the router has too many open connections", code="overloaded")
        transport.write(_FULL % (len(body), body))  # type: ignore[attr-defined]
        transport.close()


class GuardedSite(web.SockSite):
    """A ``SockSite`` whose connections are :class:`GuardedHandler`, at most a set number."""

    __slots__ = ("_limits", "_options", "cap", "opened")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        limits: LimitSettings,
        options: dict[str, Any],
        *,
        backlog: int,
        opened: OpenConnections | None = None,
        cap: Cap | None = None,
    ) -> None:
        """``cap``: the connection cap (default: ``limits.max_connections``)."""
        super().__init__(runner, sock, backlog=backlog)
        self._limits = limits
        self._options = options
        self.opened = opened if opened is not None else OpenConnections()
        self.cap = cap if cap is not None else Cap(limits.max_connections)

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        opened, full = self.opened, self.cap.full

        def connection() -> asyncio.BaseProtocol:
            return _Refuse() if full(opened.count) else self.connection()

        self._server = await loop.create_server(connection, sock=self._sock, backlog=self._backlog)

    def connection(self) -> asyncio.Protocol:
        """The protocol of a new connection (within the cap)."""
        return self.guarded()

    def guarded(self) -> GuardedHandler:
        """aiohttp's handler for a connection, guarded."""
        server = self._runner.server
        assert server is not None
        return GuardedHandler(
            server,
            loop=asyncio.get_running_loop(),
            opened=self.opened,
            write_timeout=self._limits.write_timeout,
            **self._options,
        )
