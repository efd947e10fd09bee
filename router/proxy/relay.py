"""Passing an upstream answer to the client: whole if JSON, chunk by chunk if SSE.

The streaming hot path is :class:`Forward`, which the upstream connection calls from its
``data_received``: note the time, let the meter scan the bytes, hand them to the client's
answer, which frames them (router.server.answer.Chunks). No task wakes up, nothing is logged
or re-encoded per chunk. Back-pressure runs the other way: when the client's socket buffer
fills, reading from the backend pauses until it drains (the engine then holds the tokens, as
it would for a slow direct client).

What a backend sends is bounded and checked: an SSE event over the meter's size limit aborts
the upstream (the client's stream ends with an error event after the whole events before it),
a non-streamed body over ``max_body`` gets the client a 502, and both count as the backend's
failure; a non-2xx answer that is not OpenAI error JSON is replaced (see
:func:`router.proxy.upstream.replacement_error`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from multidict import CIMultiDict

from router.observe.outcomes import Reason
from router.proxy.body import OFFLOAD_BYTES
from router.proxy.connection import BodyTooLarge, Connection, ProtocolError, UpstreamError
from router.proxy.drain import CODE, ShuttingDown, shutting_down
from router.proxy.headers import downstream_headers
from router.proxy.upstream import (
    Failure,
    Opened,
    UpstreamFault,
    replacement_error,
)
from router.server.answer import Answer, Chunks, Client
from router.server.errors import error_answer, sse_error_event
from turnout.common.sse import StreamMeter

CLIENT_CLOSED = 499  # nginx's code for "client closed the connection"; metrics only


class Forward:
    """The sink for one SSE stream: meter, then write to the client's answer.

    When the meter gives up on the stream (an event over its size limit), the upstream
    connection is aborted at once: the meter keeps nothing more, so nothing more can be sent.
    """

    __slots__ = ("_conn", "_meter", "_on_first_content", "_write", "last")

    def __init__(
        self,
        out: Chunks,
        meter: StreamMeter,
        on_first_content: Callable[[], None],
        conn: Connection,
    ) -> None:
        self._write = out.write
        self._meter = meter
        self._on_first_content: Callable[[], None] | None = on_first_content
        self._conn: Connection | None = conn
        self.last = time.monotonic()
        """When the upstream last sent anything (read by :class:`IdleWatch`)."""

    def __call__(self, data: bytes) -> None:
        now = self.last = time.monotonic()
        meter = self._meter
        out = meter.feed(data, now)
        if self._on_first_content is not None and meter.first_content is not None:
            self._on_first_content()
            self._on_first_content = None
        if out:
            self._write(out)  # whole events only, also when the meter has just given up
        if meter.failure is not None and self._conn is not None:
            self._conn.abort(UpstreamError(meter.failure))
            self._conn = None


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
        self._loop = conn.loop
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

    answer: Answer | None
    """The whole answer to send; None once a stream went out through the client."""
    status: int
    """The status the client got (:data:`CLIENT_CLOSED` when it left mid-answer)."""
    end: float | None
    """When the answer ended (None if the client left first)."""
    error: Mapping[str, str] | None = None
    """Why a stream broke off after bytes reached the client (it got an SSE error event):
    ``message`` and ``code``."""
    backend_fault: bool = False
    """The backend is to blame: it sent nothing for the idle timeout, or broke the protocol."""
    protocol_error: str | None = None
    """How the backend broke HTTP's framing limits, if it did (the connection said)."""


async def relay(
    client: Client,
    opened: Opened,
    extra: Mapping[str, str],
    meter: StreamMeter,
    *,
    idle: float | None,
    max_body: int,
) -> Relayed:
    """Answer the client with the upstream's response, feeding ``meter`` as bytes pass.

    ``extra``: the router's own response headers. The first content of a stream marks the
    backend's lease prefilled (the TTFT predictor wants to know at once); everything else is
    returned for the handler to record. Raises :class:`UpstreamFault` for a non-streamed
    answer that the client must not get as sent (nothing of it has reached the client).
    """
    conn, head = opened.conn, opened.head
    headers = downstream_headers(head.headers, extra)
    if not head.headers.get("Content-Type", "").startswith("text/event-stream"):
        return await _whole(opened, headers, meter, max_body)
    out = await client.start(head.status, headers)
    if out is None:  # the client left while the head was being written
        return Relayed(None, CLIENT_CLOSED, None)
    forward = Forward(out, meter, opened.lease.prefilled, conn)
    watch = IdleWatch(conn, forward, idle) if idle else None
    flow = client.flow
    flow.attach(conn.pause, conn.resume)
    broken: str | None = None
    protocol: str | None = None
    code, status = "upstream_error", 502
    try:
        conn.stream(forward)
        try:
            await conn.finished()
        except ShuttingDown as exc:  # the drain's deadline
            broken, code, status = str(exc), CODE, 503
        except UpstreamError as exc:
            broken = str(exc)
            if isinstance(exc, ProtocolError):
                code, protocol = "upstream_protocol_error", exc.kind
        end = time.monotonic()
        if meter.failure is not None:  # also when the answer had ended in that last segment
            broken, code = meter.failure, "upstream_protocol_error"
        elif broken is None and not meter.done:
            broken = "upstream stream ended before its last event ([DONE], response.completed)"
        elif meter.done:
            # The client has its whole answer, to the last event: what broke after it (trailers
            # past their bound, the drain's deadline) is counted, but ends the stream cleanly.
            broken = None
        if broken is None:
            tail = meter.flush()  # an unterminated last event (after [DONE])
            if tail:
                out.write(tail)
        else:
            # Bytes already reached the client, so no retry: end its stream with an error,
            # after whole events only (a held-back partial one is not sent).
            out.write(sse_error_event(broken, code, status))
        await out.end()
    except ConnectionResetError:
        if meter.done:  # it left after the last event had been passed on: served whole
            return Relayed(None, head.status, time.monotonic())
        return Relayed(None, CLIENT_CLOSED, None)
    finally:
        flow.detach()
        if watch is not None:
            watch.cancel()
    fault = meter.failure is not None or protocol is not None or (watch is not None and watch.fired)
    error = None if broken is None else {"message": broken, "code": code}
    return Relayed(None, head.status, end, error, backend_fault=fault, protocol_error=protocol)


async def _whole(
    opened: Opened, headers: CIMultiDict[str], meter: StreamMeter, limit: int
) -> Relayed:
    """A non-streamed answer, read whole (at most ``limit`` bytes) and passed on."""
    conn, head, backend = opened.conn, opened.head, opened.target.backend.name
    try:
        body = await conn.read(limit, truncate=False)
    except ShuttingDown:
        raise shutting_down() from None
    except BodyTooLarge:
        raise UpstreamFault(
            502,
            f"backend {backend} answered with a body over {limit} bytes",
            code="upstream_body_too_large",
            kind="body_too_large",
            reason="upstream_broken",
        ) from None
    except ProtocolError as exc:
        raise UpstreamFault(
            502,
            f"backend {backend} broke HTTP: {exc}",
            code="upstream_protocol_error",
            kind=exc.kind,
            reason="upstream_broken",
        ) from None
    except UpstreamError as exc:  # nothing has reached the client yet: say so properly
        timeout = isinstance(exc, TimeoutError)
        raise UpstreamFault(
            504 if timeout else 502,
            f"upstream answer broke off: {exc}",
            code="upstream_timeout" if timeout else "upstream_error",
            reason="upstream_timeout" if timeout else "upstream_broken",
        ) from None
    if not 200 <= head.status < 300:
        fault = replacement_error(head.status, body, backend)
        if fault is not None:
            raise fault
    end = time.monotonic()
    if len(body) > OFFLOAD_BYTES:
        await asyncio.to_thread(meter.feed_body, body, end)
    else:
        meter.feed_body(body, end)
    return Relayed(Answer(head.status, headers, body), head.status, end)


def failed_answer(last: Failure, extra: Mapping[str, str]) -> tuple[Answer, UpstreamFault | None]:
    """The client's answer when every attempt failed (``last`` the final one), and the error
    it carries if the router made one.

    The last backend's answer as is if it is OpenAI error JSON; else an OpenAI error with its
    status (:func:`router.proxy.upstream.replacement_error`); 502 or 504 if none answered
    properly (502 ``upstream_protocol_error`` when its answer broke the protocol).
    """
    fault: UpstreamFault | None
    if last.kind is not None:
        fault = UpstreamFault(
            502,
            last.message,
            code="upstream_protocol_error",
            kind=last.kind,
            reason="upstream_broken",
        )
    elif last.status is None:
        timeout = last.timeout
        reason: Reason = "upstream_timeout" if timeout else "upstream_unreachable"
        fault = UpstreamFault(504 if timeout else 502, last.message, code=reason, reason=reason)
    else:
        fault = replacement_error(last.status, last.body or b"", last.backend)
        if fault is None:
            headers = {**extra, "Content-Type": "application/json"}
            return Answer(last.status, headers, last.body or b""), None
    return error_answer(fault, dict(extra)), fault
