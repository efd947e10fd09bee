"""The lean HTTP/1.1 server for the proxied routes: framing only, the request path elsewhere.

aiohttp's server side costs about as much per request as all of the router's own request
handling (issue 18: a bare aiohttp relay spends ~125 µs of CPU a request). Here one
``asyncio.Protocol`` per connection parses with httptools (llhttp, as the upstream side does:
router.proxy.connection), runs the route's handler as a task with a
:class:`~router.server.request.Request` as its :class:`router.server.answer.Client`, and writes
the answer's bytes itself. Its site and the open connections it keeps are router.server.lean's.

It takes only requests of the usual shape: ``POST`` to one of its routes over HTTP/1.1, with
a body framed by ``Content-Length`` within the body limit, no ``Transfer-Encoding``,
``Content-Encoding``, ``Expect`` or ``Upgrade``, no header repeated, and a head of at most
``limits.max_header_bytes`` and ``limits.max_headers``. Anything else (another route, a chunked or
compressed body, a malformed or oversized head, a smuggling shape) is handed, with the bytes
received of it, to aiohttp's connection handler, which then serves the rest of that
connection exactly as it serves every connection without this module: its parser refuses
what it refuses, with the same OpenAI error JSON (router.server.site.GuardedHandler).

What it guarantees itself:

- a head must be complete within ``limits.idle_seconds`` of the connection opening or the
  previous answer ending, else the connection is closed (idle crowds, slowloris);
- the body's limits (415, 413, 408) are those of router.server.site.read_body;
- a client that reads none of its answer for ``limits.write_timeout`` is disconnected, and
  meanwhile the relay stops reading its upstream (:class:`FlowControl`);
- a client that goes away cancels its request's task, which closes the upstream request;
- a half-close (see :meth:`Wire.eof_received`) before the answer has begun is answered;
- an answer sent before the request was read whole (a 401, a 408) says ``Connection: close``,
  and the connection closes once the rest of the request has been read (at most
  ``body_seconds`` more), so the client is not reset before it reads the answer;
- pipelining: a request that arrives while the previous one is answered waits unparsed
  (reading pauses past one head's worth) and is served next; one that arrives in the very
  segment that ended the previous one cannot be told apart from it, so that previous one's
  answer says ``Connection: close`` and the client sends the next again (RFC 9112 9.3.2).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import TYPE_CHECKING

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from router.config.model import LimitSettings
from router.server.answer import Answer, Chunked, FlowControl, Serve
from router.server.errors import SERVER
from router.server.request import Request

if TYPE_CHECKING:
    from router.server.lean import Connections

log = logging.getLogger("router")
# Headers whose presence sends a request to aiohttp (see the module docstring).
_UNUSUAL = frozenset({b"transfer-encoding", b"content-encoding", b"expect", b"upgrade"})
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
HALF_CLOSE_SECONDS = 1.0
"""How soon after its request a client's end of sending is a half-close (it sends them
together); later, the client has given up, and goes (see :meth:`Wire.eof_received`)."""


class _HandOver(Exception):
    """Raised from a parser callback: the request is one for aiohttp."""


class _Pipelined(Exception):
    """Raised from a parser callback: a request began in the segment that ended another."""


def _head(status: int, headers: Mapping[str, str], framing: bytes, date: bytes) -> bytes:
    """An answer's head; refuses header text that would split it (as aiohttp's writer does)."""
    text = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    if text.count("\n") != len(headers) or text.count("\r") != len(headers):
        raise ValueError("a header name or value contains CR or LF")
    return b"HTTP/1.1 %d %s\r\n%bServer: %s\r\nDate: %s\r\n%b\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        text.encode("utf-8", "surrogateescape"),
        SERVER.encode(),
        date,
        framing,
    )


class Wire(asyncio.Protocol):
    """One client connection served by the lean server (see the module docstring)."""

    def __init__(
        self,
        routes: Mapping[bytes, Serve],
        limits: LimitSettings,
        max_body: int,
        connections: Connections,
        fallback: Callable[[], asyncio.Protocol],
    ) -> None:
        self._routes = routes
        self._limits = limits
        self._max_body = max_body
        self._connections = connections
        self._fallback = fallback
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self.flow = FlowControl()
        self._timer: asyncio.TimerHandle | None = None
        """The head's deadline while one is awaited; the rest of an early-answered request's
        while it is read."""
        self._task: asyncio.Task[Answer | None] | None = None
        self._request: Request | None = None
        self._raw: bytearray | None = bytearray()
        """The bytes of the request being parsed, until it is known to be one for here."""
        self._waiting = bytearray()
        """Bytes that arrived after the current request, parsed once it is answered."""
        self._url = bytearray()
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._message_done = False
        self._segment_done = False
        self._close_after = False
        self._paused_reading = False
        self._eof = False
        """The client half-closed: it sends nothing more (but may read its answers)."""
        self._answering = False
        """The answer of the request in hand has begun (its head is out)."""
        self._sent_at = 0.0
        """When the request in hand arrived whole (the event loop's clock)."""

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        self._connections.count += 1
        self._connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.count -= 1
        self._connections.discard(self)
        self._cancel_timer()
        self.flow.stop()
        self._transport = None
        if self._task is not None:
            self._task.cancel()  # the client went away: the upstream request is closed

    def data_received(self, data: bytes) -> None:
        if self._task is not None and self._message_done:
            self._waiting += data  # the next request: parsed once this one is answered
            if len(self._waiting) > self._limits.max_header_bytes and self._transport:
                self._transport.pause_reading()
                self._paused_reading = True
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        """The client shut its sending side. Right after a request it sent whole, before the
        answer has begun, that is a half-close (HTTP/1.1 lets it read on): that request (and
        any pipelined behind it) is answered, then the connection closes; a client that had
        in fact closed is seen gone at the first write that fails. Otherwise the client has
        gone (a close looks the same): close now, which cancels a request in hand."""
        if (
            self._task is None
            or not self._message_done
            or self._answering
            or self._loop.time() - self._sent_at > HALF_CLOSE_SECONDS
        ):
            return None
        self._eof = True
        return True

    def pause_writing(self) -> None:
        if self._transport is not None:
            self.flow.pause(self._transport, self._limits.write_timeout)

    def resume_writing(self) -> None:
        self.flow.resume()

    # -- the site's side --------------------------------------------------------------------

    def close_if_idle(self) -> None:
        """Close now if no request is being served (the drain has begun)."""
        if self._task is None and self._transport is not None:
            self._transport.close()

    def abort(self) -> asyncio.Task[Answer | None] | None:
        """Drop the connection; the task of its open request, if any (now cancelled)."""
        task = self._task
        if self._transport is not None:
            self._transport.abort()
        return task

    # -- the request path's side (through Request) ------------------------------------------

    def start(self, status: int, headers: Mapping[str, str]) -> Chunked | None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return None
        framing = self._framing(b"Transfer-Encoding: chunked\r\n")
        transport.write(_head(status, headers, framing, self._connections.date.now()))
        self._answering = True
        return Chunked(transport)

    # -- parsing ----------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._raw is not None:
            self._raw += data
        self._segment_done = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Pipelined):
                self._close_after = True  # the rest of the segment is dropped: see above
            elif self._raw is not None:  # not one for here: aiohttp serves it, or says why not
                self._hand_over()
            elif self._transport is not None:
                self._transport.abort()  # a Content-Length body cannot break; but be safe
            return
        if self._raw is not None and len(self._raw) > self._limits.max_header_bytes:
            self._hand_over()  # a head this big: aiohttp applies its limits to it

    def on_message_begin(self) -> None:
        if self._segment_done or self._task is not None:
            raise _Pipelined()
        self._url.clear()
        self._headers = []
        self._head_size = 0
        self._message_done = False

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > self._limits.max_header_bytes:
            raise _HandOver()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))  # checked once the head is complete
        self._head_size += len(name) + len(value)

    def on_headers_complete(self) -> None:
        parser = self._parser
        path, _, _ = bytes(self._url).partition(b"?")
        serve = self._routes.get(path)
        if serve is None or parser.get_method() != b"POST" or parser.get_http_version() != "1.1":
            raise _HandOver()
        raw, limits = self._headers, self._limits
        names = {n.lower() for n, _ in raw}
        # Past the limits, with a header repeated (aiohttp refuses a repeated Content-Length
        # or router.server.site.SINGLE header) or an unusual one, the request is aiohttp's.
        if (
            len(raw) > limits.max_headers
            or len(self._url) + self._head_size > limits.max_header_bytes
            or len(names) < len(raw)
            or not names.isdisjoint(_UNUSUAL)
        ):
            raise _HandOver()
        headers = CIMultiDictProxy(
            CIMultiDict(
                [(n.decode("latin-1"), v.decode("utf-8", "surrogateescape")) for n, v in raw]
            )
        )
        length = int(headers.get("Content-Length", "0"))  # digits: llhttp checked them
        if length > self._max_body:
            raise _HandOver()  # aiohttp's 413, and it reads the rest before closing
        self._raw = None  # from here the request is this server's
        self._cancel_timer()
        self._request = request = Request(self, path.decode(), headers, length)
        self._task = task = self._loop.create_task(serve(request))
        task.add_done_callback(self._answered)

    def on_body(self, body: bytes) -> None:
        if self._request is not None:
            self._request.received(body)

    def on_message_complete(self) -> None:
        self._message_done = self._segment_done = True
        self._sent_at = self._loop.time()
        if not self._parser.should_keep_alive():
            self._close_after = True
        if self._request is not None:
            self._request.completed()
        if self._task is None:  # answered early: the rest of the request is read, now close
            self._close()

    # -- answering --------------------------------------------------------------------------

    def _answered(self, task: asyncio.Task[Answer | None]) -> None:
        """The request's task ended: write its answer (unless streamed), then go on."""
        self._task = None
        self._request = None
        self._answering = False
        transport = self._transport
        if task.cancelled() or transport is None:
            return
        exc = task.exception()
        if exc is not None:  # bytes may be out already: the connection cannot go on
            log.error("error handling a request", exc_info=exc)
            transport.abort()
            return
        early = not self._message_done
        if early:
            self._close_after = True
        answer = task.result()
        if answer is not None and not transport.is_closing():
            framing = self._framing(b"Content-Length: %d\r\n" % len(answer.body))
            head = _head(answer.status, answer.headers, framing, self._connections.date.now())
            transport.writelines((head, answer.body))  # one send for both
        if early:  # read the rest of the request (bounded), then close: see the docstring
            self._timer = self._loop.call_later(self._limits.body_seconds, self._close)
            return
        if self._close_after or self._connections.closing:
            self._close()
            return
        self._raw = bytearray()
        self._await_head()
        waiting, self._waiting = self._waiting, bytearray()
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        if waiting:
            self._feed(bytes(waiting))
        if self._eof and self._task is None:
            self._cancel_timer()
            self._close()  # half-closed, and nothing more came whole

    def _framing(self, framing: bytes) -> bytes:
        if (
            self._close_after
            or not self._message_done
            or self._connections.closing
            or (self._eof and not self._waiting)
        ):
            return framing + b"Connection: close\r\n"
        return framing

    # -- connection -------------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Give the connection, with the bytes of the request begun, to aiohttp's handler."""
        transport, raw = self._transport, self._raw
        self._cancel_timer()
        self.flow.stop()
        if transport is None or raw is None or self.flow.paused:
            if transport is not None:
                transport.abort()  # (a client not reading its last answer: nothing to save)
            return
        self._connections.count -= 1  # aiohttp's handler counts itself
        self._connections.discard(self)
        self._transport = None
        handler = self._fallback()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        if self._paused_reading:
            transport.resume_reading()
        handler.data_received(bytes(raw))

    def _await_head(self) -> None:
        self._timer = self._loop.call_later(self._limits.idle_seconds, self._close)

    def _close(self) -> None:
        self._timer = None
        if self._transport is not None:
            self._transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
