"""vLLM's ``/tokenize`` and ``/detokenize``: forwarded to a backend that serves the model.

These generate nothing, so they skip the request path's classification, policy, admission
queue and bookkeeping: a policy must not learn from them, a tokenizer call must not sit among
the latency figures, and a capture must not hold them (replay would send them again). What
they keep: the caller's API key, its model list and its limits (each call counts against its
requests per minute and takes one of its concurrent slots; no tokens are charged, since none
are generated), the body is size-bounded and must be a JSON object whose ``model`` (optional,
as on vLLM, unless the key allows only some models) is one the turnout serves, the backend's
answer is bounded and checked like any other (router.proxy.relay), and failover moves down
the least-loaded healthy backends serving the model.
"""

from __future__ import annotations

import time
from typing import Any

from policies.types import Endpoint, RequestInfo
from router.backends.pool import BackendState
from router.config.model import RouterConfig
from router.control.auth import QuotaHold
from router.control.classify import parse_object
from router.proxy.body import upstream_body
from router.proxy.relay import failed_answer, relay
from router.proxy.state import RouterState
from router.proxy.upstream import Target, UpstreamFailed, UpstreamFault, open_upstream
from router.server.answer import Answer, Client
from router.server.errors import RouterError, error_answer
from router.server.ids import request_id
from turnout.common.sse import StreamMeter

UTILITY_PATHS: dict[Endpoint, str] = {"tokenize": "/tokenize", "detokenize": "/detokenize"}


async def forward(request: Client, state: RouterState, endpoint: Endpoint) -> Answer | None:
    """Answer one ``/tokenize`` or ``/detokenize`` request with a backend's answer."""
    rid = request_id(request.headers.get("X-Request-Id"))
    extra = {"X-Request-Id": rid}
    hold: QuotaHold | None = None
    snap = state.snapshot  # once, as the request path does (router.proxy.handler)
    config = snap.config
    try:
        gate = snap.gate
        tenant = gate.identify(request.headers)
        gate.refuse_early(tenant, tokens=False)  # over quota: not worth reading the body
        raw = await request.body(config.listen.max_body_bytes, config.limits)
        doc = _parse(raw)
        model = doc.get("model")
        if model is None and tenant is not None and tenant.spec.models:
            message = "this API key may use only some models: name one in 'model'"
            raise RouterError(403, message, "model", "model_not_allowed")
        info = RequestInfo(rid, endpoint, model or "", "interactive", max_tokens=0)
        hold = await gate.admit(tenant, info, 0)  # its model list and limits; charged nothing
        return await _forwarded(request, state, config, info, raw, doc, extra)
    except RouterError as exc:
        return error_answer(exc, extra)
    finally:
        if hold is not None:
            hold.release(0)


async def _forwarded(
    request: Client,
    state: RouterState,
    config: RouterConfig,
    info: RequestInfo,
    raw: bytes,
    doc: dict[str, Any],
    extra: dict[str, str],
) -> Answer | None:
    """The call, admitted, sent to the first backend that answers and relayed."""
    model = doc.get("model")
    path = UTILITY_PATHS[info.endpoint]
    targets = [
        Target(b, b.spec.url + path, _body(state, b, raw, doc, model))
        for b in _backends(state, model)
    ]
    try:
        opened = await open_upstream(
            state.connections,
            targets,
            req=info,
            headers=request.headers,
            timeouts=config.timeouts_for("interactive"),
            failover=config.failover,
            on_failover=lambda _: None,
        )
    except UpstreamFailed as exc:
        return failed_answer(exc.last, extra)[0]
    extra["X-Turnout-Backend"] = opened.target.backend.name
    try:
        relayed = await relay(
            request,
            opened,
            extra,
            StreamMeter(time.monotonic()),
            idle=None,
            max_body=config.limits.max_upstream_body_bytes,
        )
    except UpstreamFault as exc:  # the answer must not reach the client as sent
        if exc.failed:
            opened.lease.failed()  # an oversized or broken answer counts toward ejection
        return error_answer(exc, extra)
    finally:
        state.connections.release(opened.conn)
        opened.lease.release()
    if relayed.backend_fault:
        opened.lease.failed()
    return relayed.answer


def _parse(raw: bytes) -> dict[str, Any]:
    doc = parse_object(raw)
    model = doc.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise RouterError(400, "'model' must be a non-empty string", "model", "invalid_type")
    return doc


def _backends(state: RouterState, model: str | None) -> list[BackendState]:
    """Healthy backends serving ``model`` (any model when None), least loaded first."""
    pool = state.pool
    if model is None:
        backends = [b for b in pool.backends if b.healthy]
    else:
        if not pool.known_model(model):
            raise RouterError(404, f"model '{model}' does not exist", "model", "model_not_found")
        backends = list(pool.serving(model))
    if not backends:
        raise RouterError(503, "no healthy backend serves this model", code="no_backend")
    return sorted(backends, key=lambda b: b.inflight)


def _body(
    state: RouterState, backend: BackendState, raw: bytes, doc: dict[str, Any], model: str | None
) -> bytes:
    """The body as ``backend`` gets it: an alias renamed to the backend's own model name."""
    if model is None:
        return raw
    upstream = state.pool.upstream_model(backend, model) or model
    return upstream_body(raw, doc, model=upstream, priority=None, add_usage=False)
