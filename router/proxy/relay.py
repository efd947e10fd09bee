"""Passing an upstream answer to the client: whole if JSON, chunk by chunk if SSE.

The streaming hot path is :class:`Forward`, which the upstream connection calls from its
``data_received``: note the time, let the meter scan the bytes, write them to the client as
one HTTP chunk. No task wakes up, nothing is logged or re-encoded per chunk. Back-pressure
runs the other way: when the client's socket buffer fills, reading from the backend pauses
until it drains (the engine then holds the tokens, as it would for a slow direct client).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from common.sse import StreamMeter
from router.proxy.connection import Connection, UpstreamError
from router.proxy.exchange import Record
from router.proxy.upstream import Opened, downstream_headers
from router.server.errors import RouterError, sse_error_event
from router.server.site import GuardedHandler

CLIENT_CLOSED = 499  # nginx's code for "client closed the connection"; metrics only


class Forward:
    """The sink for one SSE stream: meter, then write to the client as an HTTP chunk."""

    __slots__ = ("_meter", "_on_first_content", "_transport", "last")

    def __init__(
        self,
        transport: asyncio.Transport,
        meter: StreamMeter,
        on_first_content: Callable[[], None],
    ) -> None:
        self._transport = transport
        self._meter = meter
        self._on_first_content: Callable[[], None] | None = on_first_content
        self.last = time.monotonic()
        """When the upstream last sent anything (read by :class:`IdleWatch`)."""

    def __call__(self, data: bytes) -> None:
        now = self.last = time.monotonic()
        out = self._meter.feed(data, now)
        if self._on_first_content is not None and self._meter.first_content is not None:
            self._on_first_content()
            self._on_first_content = None
        if out:
            self.write(out)

    def write(self, data: bytes) -> None:
        """Write ``data`` as one chunk of the client's chunked response."""
        if not self._transport.is_closing():
            self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))


class IdleWatch:
    """Aborts a stream whose upstream sent nothing for ``idle`` seconds.

    It reads :attr:`Forward.last` instead of being re-armed per chunk, so there is one timer
    per idle period rather than one per chunk.
    """

    __slots__ = ("_conn", "_forward", "_handle", "_idle", "_loop", "fired")

    def __init__(self, conn: Connection, forward: Forward, idle: float) -> None:
        self.fired = False
        self._conn = conn
        self._forward = forward
        self._idle = idle
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(idle, self._check)

    def _check(self) -> None:
        left = self._forward.last + self._idle - time.monotonic()
        if left > 0:
            self._handle = self._loop.call_later(left, self._check)
            return
        self.fired = True
        self._conn.abort(UpstreamError(f"upstream sent nothing for {self._idle:g} s"))

    def cancel(self) -> None:
        self._handle.cancel()


async def relay(
    request: web.Request,
    opened: Opened,
    extra: dict[str, str],
    rec: Record,
    *,
    strip_usage: bool,
    idle: float | None,
    on_abort: Callable[[], None],
) -> web.StreamResponse:
    """Answer the client with the upstream's response; ``on_abort`` counts a broken stream."""
    conn, head = opened.conn, opened.head
    headers = downstream_headers(head.headers, extra)
    rec.status = head.status
    if not head.headers.get("Content-Type", "").startswith("text/event-stream"):
        try:
            body = await conn.read()
        except UpstreamError as exc:  # nothing has reached the client yet: say so properly
            timeout = isinstance(exc, TimeoutError)
            raise RouterError(
                504 if timeout else 502,
                f"upstream answer broke off: {exc}",
                code="upstream_timeout" if timeout else "upstream_error",
            ) from None
        rec.end = time.monotonic()
        rec.meter = StreamMeter(rec.arrival)
        rec.meter.feed_body(body, rec.end)
        return web.Response(status=head.status, body=body, headers=headers)
    out = web.StreamResponse(status=head.status, headers=headers)
    await out.prepare(request)  # aiohttp writes the head now; the chunks below are ours
    transport = request.transport
    if transport is None:  # the client left while the head was being written
        rec.status = CLIENT_CLOSED
        return out
    # TPOT comes from the usage figures, so the meter stops looking for content after the
    # first token (see common/sse.py).
    meter = rec.meter = StreamMeter(rec.arrival, strip_usage=strip_usage, track_gaps=False)
    backend, info = opened.target.backend, rec.info

    def first_content() -> None:
        rec.prefilled = True
        if info is not None:
            backend.prefilled(info)

    forward = Forward(transport, meter, first_content)
    watch = IdleWatch(conn, forward, idle) if idle else None
    protocol = request.protocol
    if isinstance(protocol, GuardedHandler):  # the router's server always runs this one
        protocol.on_writable = lambda writable: conn.resume() if writable else conn.pause()
        if protocol.writing_paused:
            conn.pause()
    broken: str | None = None
    try:
        conn.stream(forward)
        try:
            await conn.finished()
        except UpstreamError as exc:
            broken = str(exc)
        rec.end = time.monotonic()
        tail = meter.flush()  # an unterminated last event held back while stripping usage
        if tail:
            forward.write(tail)
        if watch is not None and watch.fired:
            backend.request_failed()  # a stalled engine counts toward ejection
        if broken is not None or not meter.done:
            # Bytes already reached the client, so no retry: end its stream with an error.
            message = broken or "upstream stream ended before [DONE]"
            rec.error = {"message": message, "code": "upstream_error"}
            on_abort()
            forward.write(sse_error_event(message))
        await out.write_eof()
    except ConnectionResetError:
        rec.status = CLIENT_CLOSED
    finally:
        if isinstance(protocol, GuardedHandler):
            protocol.on_writable = None
        if watch is not None:
            watch.cancel()
    return out
