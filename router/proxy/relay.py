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
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from common.sse import StreamMeter
from router.proxy.connection import Connection, UpstreamError
from router.proxy.upstream import Opened
from router.server.errors import RouterError, sse_error_event
from router.server.site import flow_control

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


@dataclass(frozen=True, slots=True)
class Relayed:
    """What the relay saw; the handler writes it into the request's record."""

    response: web.StreamResponse
    status: int
    """The status the client got (:data:`CLIENT_CLOSED` when it left mid-answer)."""
    end: float | None
    """When the answer ended (None if the client left first)."""
    error: str | None = None
    """Why a stream broke off after bytes reached the client (it got an SSE error event)."""
    stalled: bool = False
    """The upstream sent nothing for the idle timeout (the backend's fault)."""


async def relay(
    request: web.Request,
    opened: Opened,
    headers: CIMultiDict[str],
    meter: StreamMeter,
    *,
    idle: float | None,
) -> Relayed:
    """Answer the client with the upstream's response, feeding ``meter`` as bytes pass.

    The first content of a stream marks the backend's lease prefilled (the TTFT predictor
    wants to know at once); everything else is returned for the handler to record.
    """
    conn, head = opened.conn, opened.head
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
        end = time.monotonic()
        meter.feed_body(body, end)
        answer = web.Response(status=head.status, body=body, headers=headers)
        return Relayed(answer, head.status, end)
    out = web.StreamResponse(status=head.status, headers=headers)
    await out.prepare(request)  # aiohttp writes the head now; the chunks below are ours
    transport = request.transport
    if transport is None:  # the client left while the head was being written
        return Relayed(out, CLIENT_CLOSED, None)
    forward = Forward(transport, meter, opened.lease.prefilled)
    watch = IdleWatch(conn, forward, idle) if idle else None
    flow = flow_control(request)
    flow.attach(conn.pause, conn.resume)
    broken: str | None = None
    try:
        conn.stream(forward)
        try:
            await conn.finished()
        except UpstreamError as exc:
            broken = str(exc)
        end = time.monotonic()
        tail = meter.flush()  # an unterminated last event held back while stripping usage
        if tail:
            forward.write(tail)
        if broken is None and not meter.done:
            broken = "upstream stream ended before [DONE]"
        if broken is not None:
            # Bytes already reached the client, so no retry: end its stream with an error.
            forward.write(sse_error_event(broken))
        await out.write_eof()
    except ConnectionResetError:
        return Relayed(out, CLIENT_CLOSED, None)
    finally:
        flow.detach()
        if watch is not None:
            watch.cancel()
    return Relayed(out, head.status, end, broken, stalled=watch is not None and watch.fired)
