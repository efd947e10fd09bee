"""Keep-alive HTTP/1.1 connections to backends: the client for every proxied request.

Why not aiohttp's client here: it hands each received piece of a body to the awaiting task
through a future (a task wake-up per streamed chunk) and writes each request body from a task
of its own. At 64 paced streams that kept the router's event loop half busy and added about a
millisecond of queueing to every suspension on the way to a first token. Here the response
parser (httptools, i.e. llhttp) runs inside ``data_received`` and hands body bytes to a
synchronous sink in the same callback, and a request leaves in a single write. Health probes,
metric scrapes, ``/v1/models`` and shadow mirrors are off the hot path and keep using aiohttp.

One :class:`Connection` carries one exchange at a time. Its owner sends a request, awaits the
response head, then either reads the whole body (:meth:`Connection.read`) or attaches a sink
(:meth:`Connection.stream`) and awaits :meth:`Connection.finished`; finally it hands the
connection back with :meth:`ConnectionPool.release`, which keeps it only if the response was
read to its end and the backend allows keep-alive. Anything else closes it, which is also how
an abandoned stream frees the engine's slot at once. The pool is router.proxy.keepalive, and a
request's address and head are router.proxy.origin's.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import httptools
from multidict import CIMultiDict

from router.config.backends import ClientTls
from router.proxy.origin import Origin

Sink = Callable[[bytes], None]
MAX_HEAD_BYTES = 64 * 1024
"""The most header bytes a backend's response may carry (aiohttp's client allows 8 KiB a line),
and the most bytes it may send after its head without a byte of body: chunk framing and
trailers. llhttp bounds neither, and httptools joins a header value's pieces by
concatenation (quadratic in its length), so past this the response is a protocol error."""


class UpstreamError(Exception):
    """The exchange failed: connection refused or lost, a malformed answer, or a timeout."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The exchange outlived its deadline."""


class ConnectTimeout(UpstreamTimeout):
    """No connection within the connect timeout: the request never reached the backend."""


class ProtocolError(UpstreamError):
    """A response that breaks HTTP (its head, or what follows its body); ``kind`` names the
    break for ``turnout_upstream_protocol_errors_total``."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


# The headers that would give an interim (1xx) response content, which HTTP forbids it.
_FRAMING = frozenset({"content-length", "transfer-encoding"})


class BodyTooLarge(UpstreamError):
    """A response body past the reader's limit (the connection is closed)."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """A response's status line and headers."""

    status: int
    headers: CIMultiDict[str]


class Connection(asyncio.Protocol):
    """One keep-alive connection to a backend; see the module docstring for the protocol."""

    def __init__(self, origin: Origin, tls: ClientTls | None) -> None:
        self.origin = origin
        self.tls = tls
        self.idle_since = 0.0
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._error: UpstreamError | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._head: asyncio.Future[ResponseHead] | None = None
        self.exchanges = 0
        """Requests sent on this connection so far (more than one: it came from the pool)."""
        self._new_exchange()

    def _new_exchange(self) -> None:
        """Forget the previous response (only a reusable connection gets here)."""
        self._headers: list[tuple[str, str]] = []
        self._head_bytes = 0
        """Bytes received while the head is incomplete; -1 once it is complete."""
        self._bodiless = 0
        """Bytes received since the head in segments that held no body (framing, trailers)."""
        self._done: asyncio.Future[None] | None = None
        self._pending: list[bytes] = []
        """Body pieces the parser handed over while one received segment was parsed."""
        self._body = bytearray()
        """Body received but not yet read or streamed. One buffer rather than a list of
        pieces: a backend sending one-byte chunks costs no object per byte, and a large body's
        memory goes back to the system as a whole once it is dropped."""
        self._sink: Sink | None = None
        self.answered = False
        """The response's first byte has arrived."""
        self._complete = False
        self._keep_alive = False
        self._body_to_eof = False
        self._interim = False

    # -- the owner's side -------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the connection runs on."""
        return self._loop

    @property
    def reusable(self) -> bool:
        """The last response was read to its end and the backend keeps the connection."""
        return (
            self._keep_alive
            and self._error is None
            and self._transport is not None
            and not self._transport.is_closing()
        )

    def send(self, head: bytes, body: bytes, *, deadline: float | None = None) -> None:
        """Start an exchange: one write of head and body. ``deadline`` bounds all of it (s)."""
        if self._transport is None:  # lost between acquire() and now
            raise UpstreamError("backend closed the connection (closed)")
        self._new_exchange()
        self.exchanges += 1
        self._parser = httptools.HttpResponseParser(self)
        self._head = self._loop.create_future()
        if deadline is not None:
            self._deadline = self._loop.call_later(deadline, self._expire, deadline)
        self._transport.writelines((head, body))

    async def head(self) -> ResponseHead:
        """The response's status and headers, once they have arrived."""
        assert self._head is not None
        return await self._head

    async def read(self, limit: int | None = None, *, truncate: bool = True) -> bytes:
        """The whole body. Past ``limit`` bytes the connection is closed and the first
        ``limit`` are returned, or with ``truncate=False`` :class:`BodyTooLarge` is raised."""
        # Truncating, ``limit`` bytes are enough; else one more tells the body is too long.
        enough = limit if limit is None or truncate else limit + 1
        while not self._complete and (enough is None or len(self._body) < enough):
            if self._error is not None:
                raise self._error
            self._done = self._loop.create_future()
            await self._done
        if self._error is not None and not self._complete:
            raise self._error
        buf, self._body = self._body, bytearray()
        if limit is not None and len(buf) > limit:
            self.abort()
            if not truncate:
                raise BodyTooLarge(f"body over {limit} bytes")
            del buf[limit:]
        return bytes(buf)

    def buffered(self, start: int = 0) -> bytes:
        """The body received and not yet read or streamed, from byte ``start``; it stays
        buffered (a held stream is scanned before it is passed on: router.proxy.tail)."""
        return bytes(self._body[start:])

    @property
    def over(self) -> bool:
        """The response has ended, or the exchange failed."""
        return self._complete or self._error is not None

    async def more(self) -> None:
        """Wait until more body is buffered, the body ends or the exchange fails."""
        if not self.over:
            self._done = self._loop.create_future()
            await self._done

    def stream(self, sink: Sink) -> None:
        """From now on hand every received body piece to ``sink``, inside ``data_received``."""
        self._sink = sink
        if self._body:
            data, self._body = bytes(self._body), bytearray()
            sink(data)

    async def finished(self) -> None:
        """Wait for a streamed body's end; raises :class:`UpstreamError` if it broke."""
        while not self._complete and self._error is None:
            self._done = self._loop.create_future()
            await self._done
        if self._error is not None and not self._complete:
            raise self._error

    def pause(self) -> None:
        """Stop reading from the backend (the client is not keeping up)."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def abort(self, error: UpstreamError | None = None) -> None:
        """Drop the connection now (the backend sees the disconnect and frees its slot)."""
        if error is not None:
            self._fail(error)
        if self._transport is not None:
            self._transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Without it, small writes wait for delayed ACKs (~40 ms a first token).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        if parser is None or self._complete:
            # Bytes nobody asked for: the connection's framing can no longer be trusted.
            self.abort(UpstreamError("backend sent data outside a response"))
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            mine = exc.__context__  # what one of the callbacks below raised, if any
            if not isinstance(mine, UpstreamError):
                mine = UpstreamError(f"malformed response from backend: {exc}")
            if self._complete:  # what broke came after the response: that is still whole
                self._hand_over()
            self.abort(mine)
            return
        if self._head_bytes >= 0:  # the head is still incomplete after this segment
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:  # llhttp sets no bound of its own
                self.abort(UpstreamError(f"response head exceeds {MAX_HEAD_BYTES} bytes"))
                return
        elif self._pending:
            self._bodiless = 0
        elif not self._complete:
            # Trailers come after the last body byte: so they are bounded, and also a run of
            # chunk framing (an endless chunk extension) that carries nothing.
            self._bodiless += len(data)
            if self._bodiless > MAX_HEAD_BYTES:
                message = f"response trailers or chunk framing exceed {MAX_HEAD_BYTES} bytes"
                self.abort(ProtocolError(message, "trailers_too_large"))
                return
        if self._pending:
            self._hand_over()

    def eof_received(self) -> bool | None:
        if self._body_to_eof and not self._complete:
            self._finish()  # a body without length or chunking ends with the connection
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if not self._complete:
            reason = reason_of(exc) if exc is not None else "closed"
            self._fail(UpstreamError(f"backend closed the connection ({reason})"))
        self._transport = None

    # -- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_bytes < 0:
            return  # a trailer: nothing reads them, so nothing keeps them
        self._headers.append((name.decode("latin-1"), value.decode("utf-8", "surrogateescape")))

    def on_message_begin(self) -> None:
        if self._complete:
            # A second response in the segment that ended the first: nobody asked for it.
            raise UpstreamError("backend sent data outside a response")
        self.answered = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None and self._head is not None
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:  # llhttp takes any three digits
            raise ProtocolError(f"status {status} is not an HTTP status", "bad_status")
        if status < 200:  # an interim answer (103 Early Hints...): the real one follows
            # It ends with its head (RFC 9110 15.2): llhttp would read a body that a length
            # gives any 1xx from 104 up, and hand it over as the answer's. 101 switches to
            # another protocol, which the router never asks for.
            if status == 101:
                raise ProtocolError("a switch of protocols nobody asked for (101)", "bad_interim")
            if any(name.lower() in _FRAMING for name, _ in self._headers):
                raise ProtocolError(f"an interim answer ({status}) with content", "bad_interim")
            self._interim = True
            self._headers = []
            return
        self._head_bytes = -1
        headers: CIMultiDict[str] = CIMultiDict(self._headers)
        chunked = any("chunked" in v.lower() for v in headers.getall("Transfer-Encoding", ()))
        self._body_to_eof = not chunked and "Content-Length" not in headers
        if not self._head.done():
            self._head.set_result(ResponseHead(status, headers))

    def on_body(self, body: bytes) -> None:
        self._pending.append(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        # Asked now: once the message is complete the parser resets and answers False.
        self._keep_alive = self._parser is not None and self._parser.should_keep_alive()
        self._finish()

    # -- internals --------------------------------------------------------------------------

    def _hand_over(self) -> None:
        """Pass on the body pieces of the segment just parsed: to the sink as one write
        (however many chunks the segment held), else into the buffer :meth:`read` takes."""
        pending = self._pending
        self._pending = []
        sink = self._sink
        if sink is not None:
            sink(pending[0] if len(pending) == 1 else b"".join(pending))
            return
        body = self._body
        for piece in pending:
            body += piece
        if self._done is not None:
            self._wake()  # a read() is waiting for more

    def _finish(self) -> None:
        self._complete = True
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._wake()

    def _wake(self) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None and not self._complete:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: nobody may be awaiting it any more
        done = self._done
        if done is not None and not done.done():
            done.set_result(None)

    def _expire(self, seconds: float) -> None:
        self._deadline = None
        self.abort(UpstreamTimeout(f"no complete answer within {seconds:g} s"))


def reason_of(exc: BaseException) -> str:
    """What went wrong, in a word: the exception's class, or for TLS OpenSSL's reason code
    (``CERTIFICATE_VERIFY_FAILED``), which names no host, certificate or key."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc.__class__.__name__}"
    return exc.__class__.__name__
