"""The request handler: classify -> choose -> connect with failover -> stream -> record.

Choosing (the request's policy, its plan and the attempts' bodies) is router.proxy.choose.
The answer itself is passed on by router.proxy.relay (the per-chunk hot path). Bookkeeping
(metrics, policy feedback, capture) runs synchronously in ``finally`` so a client disconnect,
which cancels the handler, cannot skip it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from functools import partial

from policies.base import reads_prefix
from policies.pd import PdPolicy
from policies.types import Endpoint
from router.control.admission import Seat
from router.control.auth import QuotaHold, Tenant
from router.control.classify import classify
from router.control.fair import NOBODY
from router.observe.outcomes import answer_reason
from router.proxy.body import OFFLOAD_BYTES
from router.proxy.choose import header_for, plan_timed, policy_for, router_asks_usage, with_bodies
from router.proxy.drain import Ticket, shutting_down
from router.proxy.exchange import Exchange
from router.proxy.pd import Hops, TwoHop, open_two_hop
from router.proxy.relay import CLIENT_CLOSED, failed_answer, relay
from router.proxy.state import RouterState
from router.proxy.tail import hold_first_token
from router.proxy.upstream import Failure, Opened, UpstreamFailed, UpstreamFault, open_upstream
from router.server.answer import Answer, Client
from router.server.errors import RouterError, error_answer
from router.server.ids import request_id
from turnout.common.sse import StreamMeter

PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
}
log = logging.getLogger("router")


@dataclass(frozen=True, slots=True)
class RunAs:
    """The tenant a request runs as without identifying its caller by API key: a batch line
    runs as its batch's creator (router.batch.lines)."""

    tenant: Tenant | None


async def handle(
    request: Client, state: RouterState, endpoint: Endpoint, run_as: RunAs | None = None
) -> Answer | None:
    """Serve one OpenAI request end to end; the only writer of its :class:`Exchange`.
    Returns the answer, or None once it was streamed to ``request``."""
    now = time.monotonic()
    snap = state.snapshot  # once: a reload meanwhile is the next request's (router.reload)
    config = snap.config
    headers = request.headers
    rid = request_id(headers.get("X-Request-Id"))
    default = snap.policies[config.default_policy]
    ex = Exchange(rid, request.path, headers, now, time.time(), default)
    ex.trace = trace = state.tracing.begin(headers, request.method, request.path, rid, now)
    extra = {"X-Request-Id": rid, "X-Turnout-Policy": default.name}
    opened: Opened | None = None
    hold: QuotaHold | None = None
    ticket: Ticket | None = None
    seat = Seat()
    try:
        ticket = state.drain.enter()
        tenant = run_as.tenant if run_as is not None else snap.gate.identify(headers)
        ex.tenant = tenant.capture_id if tenant is not None else None
        ex.policy = policy = policy_for(request, snap, tenant)
        extra["X-Turnout-Policy"] = policy.name
        snap.gate.refuse_early(tenant)  # over quota: not worth reading the body
        limits = config.limits
        ex.body = await request.body(config.listen.max_body_bytes, limits)
        understand = partial(
            classify,
            ex.body,
            endpoint,
            request_id=rid,
            header_class=header_for(request, "X-Request-Class", tenant, "request_class"),
            key_class=tenant.spec.request_class if tenant is not None else None,
            session_key=headers.get("X-Session-Id"),
            settings=config.classification,
            prefix=reads_prefix(policy),
        )
        # In a thread, the event loop still gets its turns (every switch interval) meanwhile.
        big = len(ex.body) > OFFLOAD_BYTES
        t = time.monotonic()
        parsed = await asyncio.to_thread(understand) if big else understand()
        ex.info = info = parsed.info
        trace.classified(info, t, time.monotonic())
        extra["X-Turnout-Class"] = info.request_class
        # Within the configured bounds: a backend must not set what its answers cost.
        context = limits.context_tokens(state.pool.context_tokens(info.model))
        hold = await snap.gate.admit(tenant, info, context)
        add_usage = router_asks_usage(parsed)
        timeouts = config.timeouts_for(info.request_class)
        on_failover = partial(_failed_over, state, policy.name)
        share = tenant.share if tenant is not None else NOBODY
        if isinstance(policy, PdPolicy):  # a prefill hop, then a decode hop: router.proxy.pd
            state.shadows.mirror(policy.name, parsed, ex.body, PATHS, state.session, snap.policies)
            ex.sent, ex.hops = True, Hops()
            two = TwoHop(state, policy, parsed, ex.body, PATHS[endpoint], add_usage, headers,
                         timeouts, config.failover, on_failover, trace, share, seat)  # fmt: skip
            opened = await open_two_hop(two, ex.hops)
        else:
            t = time.monotonic()
            if state.placement is not None:  # the other workers' latest spills count here
                state.placement.catch_up(policy)
            planned = plan_timed(state, policy, info, config.failover.max_attempts)
            targets = with_bodies(planned, parsed, ex.body, PATHS[endpoint], add_usage, share.band)
            cost = (info.prompt_tokens, info.expected_output_tokens)
            first = await state.admission.take(info.request_class, targets, share, cost, seat)
            policy.committed(info, planned.decision, first.backend.name)
            if state.placement is not None:
                state.placement.placed(policy, first.backend.name, info.prefix_blocks)
                state.placement.committed(policy, info.request_id)
            targets.insert(0, first)
            if trace.recording:
                ranked = [target.backend.name for target in targets]
                trace.picked(policy.name, ranked, t, time.monotonic())
            state.shadows.mirror(policy.name, parsed, ex.body, PATHS, state.session, snap.policies)
            ex.sent = True
            tail = config.tail.get(info.request_class) if info.stream else None
            sent = time.monotonic()
            opening = partial(
                open_upstream,
                state.connections,
                req=info,
                headers=headers,
                timeouts=timeouts,
                failover=config.failover,
                on_failover=on_failover,
                trace=trace,
                confirm=tail is None,
            )
            opened = await opening(targets, admission=state.admission)
            if tail is not None:  # held until its first token (router.proxy.tail)
                opened = await hold_first_token(
                    state, config, tail, opening, policy.name, info, opened, sent, targets
                )
        ticket.conn = opened.conn  # from here the drain cuts by aborting the upstream
        ex.backend = extra["X-Turnout-Backend"] = opened.target.backend.name
        ex.failovers = opened.failovers
        extra["X-Turnout-Attempts"] = str(opened.failovers + 1)
        # TPOT comes from the usage figures, so the meter stops looking for content after the
        # first token (see turnout/common/sse.py).
        ex.meter = StreamMeter(
            now,
            strip_usage=add_usage,
            track_gaps=False,
            max_event_size=limits.max_upstream_event_bytes,
            choices=info.choices,
        )
        relayed = await relay(
            request,
            opened,
            extra,
            ex.meter,
            idle=timeouts.idle,
            max_body=limits.max_upstream_body_bytes,
        )
        ex.status, ex.end, ex.protocol_error = relayed.status, relayed.end, relayed.protocol_error
        if relayed.backend_fault:
            opened.lease.failed()  # a stalled or misbehaving engine counts toward ejection
        if relayed.error is not None:
            ex.error = relayed.error
            ex.reason = "shutting_down" if ticket.cut else "upstream_broken"
            state.metrics.stream_aborted(policy.name, ex.backend, info.request_class)
        return relayed.answer
    except UpstreamFault as exc:  # from relay: the answer must not reach the client as sent
        ex.refused(exc)
        ex.protocol_error = exc.kind
        if exc.failed and opened is not None:
            opened.lease.failed()
        return error_answer(exc, extra)
    except RouterError as exc:
        ex.refused(exc)
        return error_answer(exc, extra)
    except UpstreamFailed as exc:
        ex.failovers = exc.failovers
        ex.backend = extra["X-Turnout-Backend"] = exc.last.backend
        extra["X-Turnout-Attempts"] = str(exc.failovers + 1)
        return _failed(exc, extra, ex)
    except asyncio.CancelledError:  # handler_cancellation: the client went away
        if ticket is not None and ticket.cut:  # ...or the drain's deadline, before any answer
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            refusal = shutting_down()
            ex.refused(refusal)
            return error_answer(refusal, extra)
        meter = ex.meter
        if meter is not None and meter.done:
            # ...after [DONE] had been passed on: the stream was served whole.
            ex.status, ex.end = opened.head.status if opened else 200, meter.last_event
        else:
            ex.status = CLIENT_CLOSED
        raise
    except Exception:
        ex.status, ex.reason = 500, "internal"
        if opened is not None:
            raise  # bytes may be out already; the server drops the connection
        log.exception("request %s failed inside the router", rid)
        return error_answer(RouterError(500, "internal router error", code="internal"), extra)
    finally:
        if ticket is not None:
            state.drain.leave(ticket)
        if opened is not None:
            # Kept for reuse only if read to the end; else closed, which frees the engine's
            # slot at once (a client that went away mid-stream).
            state.connections.release(opened.conn)
            opened.lease.release()
        state.admission.leave(seat)  # a slot may have freed up (here or in a failed attempt)
        if hold is not None:
            hold.release(ex.settlement(hold.charged, opened.head.status if opened else None))
        ex.finish(state, snap)


def _failed_over(state: RouterState, policy: str, failure: Failure) -> None:
    """An attempt failed and the request moves on: count it (and its protocol error, which
    the request's record, of the last attempt only, does not hold)."""
    state.metrics.failover(policy, failure.backend)
    if failure.kind is not None:
        state.metrics.protocol_errors(failure.backend, failure.kind)


def _failed(exc: UpstreamFailed, extra: dict[str, str], ex: Exchange) -> Answer:
    """Every attempt failed: record it and answer as :func:`failed_answer` says."""
    last = exc.last
    ex.end = time.monotonic()
    response, fault = failed_answer(last, extra)
    ex.status = response.status
    code = fault.code if fault is not None and last.status is None else "upstream_error"
    # upstream_timeout, _unreachable or _broken when none answered properly, else the
    # engine's error
    ex.reason = fault.reason if fault is not None else answer_reason(response.status)
    ex.error = {"message": last.message, "code": code}
    if fault is not None:
        ex.protocol_error = fault.kind
    return response
