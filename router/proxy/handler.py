"""The request handler: classify -> choose -> connect with failover -> stream -> record.

The answer itself is passed on by router.proxy.relay (the per-chunk hot path). Bookkeeping
(metrics, policy feedback, capture) runs synchronously in ``finally`` so a client disconnect,
which cancels the handler, cannot skip it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from aiohttp import web

from policies.base import Policy
from policies.types import Endpoint
from router.control.admission import Saturated
from router.control.auth import Lease, Tenant
from router.control.classify import Parsed, classify, parse_body
from router.proxy.body import upstream_body
from router.proxy.exchange import Record, bookkeeping
from router.proxy.relay import CLIENT_CLOSED, relay
from router.proxy.state import RouterState
from router.proxy.upstream import Opened, Target, UpstreamFailed, open_upstream
from router.server.errors import RouterError, error_response
from router.server.site import read_body

PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
log = logging.getLogger("router")


async def handle(
    request: web.Request, state: RouterState, endpoint: Endpoint
) -> web.StreamResponse:
    """Serve one OpenAI request end to end."""
    now = time.monotonic()
    rid = request.headers.get("X-Request-Id") or f"req-{uuid.uuid4().hex}"
    rec = Record(rid, now, time.time(), state.config.default_policy)
    extra = {"X-Request-Id": rid, "X-Switchyard-Policy": rec.policy}
    opened: Opened | None = None
    lease: Lease | None = None
    try:
        tenant = state.gate.identify(request.headers)
        rec.tenant = tenant.capture_id if tenant is not None else None
        policy = _policy(request, state, tenant)
        rec.policy = extra["X-Switchyard-Policy"] = policy.name
        rec.body = await read_body(request, state.config.listen.max_body_bytes, state.config.limits)
        parsed = classify(
            parse_body(rec.body, endpoint),
            endpoint,
            request_id=rid,
            header_class=request.headers.get("X-Request-Class"),
            key_class=tenant.spec.request_class if tenant is not None else None,
            session_key=request.headers.get("X-Session-Id"),
            settings=state.config.classification,
        )
        rec.info = info = parsed.info
        extra["X-Switchyard-Class"] = info.request_class
        lease = state.gate.admit(tenant, info)
        targets = await state.admission.admit(
            info.request_class, lambda: _plan(state, policy, parsed, rec.body, endpoint)
        )
        state.shadows.mirror(policy.name, parsed, rec.body, PATHS, state.client, state.policies)
        opened = await open_upstream(
            state.connections,
            targets,
            req=info,
            headers=request.headers,
            timeouts=state.config.timeouts_for(info.request_class),
            failover=state.config.failover,
            on_failover=lambda name: state.metrics.failover(policy.name, name),
        )
        rec.backend = extra["X-Switchyard-Backend"] = opened.target.backend.name
        rec.failovers = opened.failovers
        strip = _router_asks_usage(parsed)
        idle = state.config.timeouts_for(info.request_class).idle
        return await relay(
            request,
            opened,
            extra,
            rec,
            strip_usage=strip,
            idle=idle,
            on_abort=lambda: state.metrics.stream_aborted(
                rec.policy, extra["X-Switchyard-Backend"], rec.request_class
            ),
        )
    except RouterError as exc:
        rec.status = exc.status
        rec.error = {"message": exc.message, "code": exc.code}
        return error_response(exc, extra)
    except UpstreamFailed as exc:
        rec.failovers = exc.failovers
        rec.backend = extra["X-Switchyard-Backend"] = exc.last.backend
        return _failed(exc, extra, rec)
    except asyncio.CancelledError:  # handler_cancellation: the client went away
        meter = rec.meter
        if meter is not None and meter.done:
            # ...after [DONE] had been passed on: the stream was served whole.
            rec.end = meter.last_event
        else:
            rec.status = CLIENT_CLOSED
        raise
    except Exception:
        rec.status = 500
        if opened is not None:
            raise  # bytes may be out already; aiohttp drops the connection
        log.exception("request %s failed inside the router", rid)
        return error_response(RouterError(500, "internal router error", code="internal"), extra)
    finally:
        if opened is not None and rec.info is not None:
            # Kept for reuse only if read to the end; else closed, which frees the engine's
            # slot at once (a client that went away mid-stream).
            state.connections.release(opened.conn)
            opened.target.backend.finish(rec.info, prefilled=rec.prefilled)
        state.admission.release()  # a slot may have freed up (here or in a failed attempt)
        if lease is not None:
            lease.release(rec.meter)
        bookkeeping(request, state, rec)


def _policy(request: web.Request, state: RouterState, tenant: Tenant | None) -> Policy:
    """The header's policy (if honoured), else the API key's, else the default."""
    name = request.headers.get("X-Switchyard-Policy")
    if name is None or not state.config.honor_policy_header:
        own = tenant.spec.policy if tenant is not None else None
        return state.policies[own or state.config.default_policy]
    policy = state.policies.get(name.strip())
    if policy is None:
        known = ", ".join(state.policies)
        raise RouterError(400, f"unknown policy '{name}' (known: {known})", "X-Switchyard-Policy")
    return policy


def _router_asks_usage(parsed: Parsed) -> bool:
    """A stream whose client did not ask for usage: the router asks, then strips it."""
    info = parsed.info
    return info.stream and not parsed.include_usage and info.endpoint != "embeddings"


def _plan(
    state: RouterState, policy: Policy, parsed: Parsed, raw: bytes, endpoint: Endpoint
) -> list[Target]:
    """The policy's ranked backends as concrete attempts (saturated backends skipped)."""
    info, pool = parsed.info, state.pool
    if not pool.known_model(info.model):
        raise RouterError(404, f"model '{info.model}' does not exist", "model", "model_not_found")
    candidates = pool.candidates(info.model)
    if not candidates:
        raise RouterError(503, "no healthy backend serves this model", code="no_backend")
    t0 = time.perf_counter()
    try:
        decision = policy.choose(info, candidates)
    except Exception:  # an out-of-tree policy's bug must not take the request down silently
        log.exception("policy %s failed to choose", policy.name)
        raise RouterError(500, f"policy '{policy.name}' failed", code="policy_error") from None
    state.metrics.decision(policy.name, time.perf_counter() - t0)
    add_usage = _router_asks_usage(parsed)
    targets: list[Target] = []
    saturated = False
    for name in decision.ranked:
        backend = pool.by_name[name]
        model = pool.upstream_model(backend, info.model)
        if model is None:
            continue
        if backend.spec.max_inflight is not None and backend.inflight >= backend.spec.max_inflight:
            saturated = True
            continue
        # Only engines that schedule by priority get the field (others may reject it).
        priority = decision.priority if backend.spec.priority_capable else None
        body = upstream_body(raw, parsed.doc, model=model, priority=priority, add_usage=add_usage)
        targets.append(Target(backend, backend.spec.url + PATHS[endpoint], body))
    if not targets:
        if saturated:
            raise Saturated()
        raise RouterError(503, f"policy '{policy.name}' found no backend", code="no_backend")
    return targets


def _failed(exc: UpstreamFailed, extra: dict[str, str], rec: Record) -> web.Response:
    """Every attempt failed: pass the last answer through, or say 502/504."""
    last = exc.last
    rec.end = time.monotonic()
    if last.status is not None:
        rec.status = last.status
        rec.error = {"message": last.message, "code": "upstream_error"}
        return web.Response(
            status=last.status,
            body=last.body or b"",
            headers={**extra, "Content-Type": last.content_type or "application/json"},
        )
    status = 504 if last.timeout else 502
    code = "upstream_timeout" if last.timeout else "upstream_unreachable"
    err = RouterError(status, last.message, code=code)
    rec.status = status
    rec.error = {"message": last.message, "code": code}
    return error_response(err, extra)
