"""Two hops for a ``pd`` policy: a prefill engine, then a decode engine (vLLM's protocol).

As vLLM's NIXL disaggregated-serving proxy does it: the prefill engine gets the request with
``max_tokens: 1`` (and ``max_completion_tokens: 1`` when given; ``max_output_tokens: 1`` in
the Responses API), ``stream: false``, no ``stream_options``, ``min_tokens`` or
``min_completion_tokens``, and ``kv_transfer_params`` asking it to hold the KV for a remote
decode (:data:`TO_DECODE`). Its answer's ``kv_transfer_params`` say where the blocks are; the
decode engine gets the client's request as the one-hop path would send it plus those params,
and its answer is relayed to the client as any answer is (router.proxy.relay), usage
included. Each hop goes through :func:`~router.proxy.upstream.open_upstream`, so timeouts,
leases, breakers and error answers are the one-hop path's.

Failover per hop: a prefill that fails moves on down the prefill ranking; when every one
failed the request goes whole (one hop) to the policy's co-located ``fallback`` backends, or
without them fails as a one-hop request whose backends all failed does. A prefill engine's
4xx is the client's answer (the request itself is wrong; a decode engine would refuse it
too). A decode that fails before its answer's headers moves on to the next decode engine:
with the same params when the failed one was never reached (its connection failed, so it
cannot have pulled the blocks), else after a fresh prefill (it may have pulled them, which
frees them). A prefill answer without params (an engine without a KV connector) sends the
decode engine the plain request: it prefills itself. When the policy skips the prefill hop
(the decode engine caches enough of the prompt), the request is one hop to it.

The client's own ``kv_transfer_params`` never reach an engine: they would let a client point
a decode engine at any host.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from policies.pd import PdPolicy, PhasePlan
from policies.types import Decision, Endpoint, Outcome
from router.config.model import ClassTimeouts, FailoverSettings
from router.control.admission import Seat
from router.control.classify import Parsed
from router.control.fair import Share
from router.control.plan import Attempt, Plan, Refusal, plan
from router.observe.tracing import RequestTrace
from router.proxy.body import splice_field, upstream_body
from router.proxy.connection import UpstreamError
from router.proxy.state import RouterState
from router.proxy.upstream import Failure, Opened, Target, UpstreamFailed, open_upstream

TO_DECODE: Mapping[str, object] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
"""The prefill hop's ``kv_transfer_params``, as vLLM's proxy sends them."""
KEY = "kv_transfer_params"
_ANSWER_BYTES = 1 << 20  # a prefill's answer: one token and the block list (32k tokens: 12 KB)
_PREFILL_DROPS = ("stream_options", "min_tokens", "min_completion_tokens", KEY)


@dataclass(slots=True)
class Hops:
    """What a ``pd`` request's hops did: its metrics, access line and capture line say it."""

    path: str = "two_hop"
    """``two_hop``; ``skipped`` (no prefill hop); ``fallback`` (every prefill failed: one
    hop to a co-located backend); ``local`` (the prefill answered without params)."""
    prefill_backend: str | None = None
    prefills: int = 0
    """Prefill hops that answered (a fresh one after a decode failed counts again)."""
    prefill_s: float | None = None
    """The last prefill hop, from its send to its answer's end."""
    handoff_s: float | None = None
    """From that answer to the decode hop's send (the router's own part between hops)."""
    decode_sent: float | None = None
    """``time.monotonic()`` when the decode hop that answered was sent."""


@dataclass(frozen=True, slots=True)
class TwoHop:
    """One request's inputs to :func:`open_two_hop`."""

    state: RouterState
    policy: PdPolicy
    parsed: Parsed
    raw: bytes
    url_path: str
    add_usage: bool
    headers: Mapping[str, str]
    timeouts: ClassTimeouts
    failover: FailoverSettings
    on_failover: Callable[[Failure], None]
    trace: RequestTrace
    share: Share
    """The caller's place in the admission queues (router.control.fair)."""
    seat: Seat
    """Its place among its tenant's slots, taken by its first hop (the caller leaves it)."""

    async def take(self, targets: list[Target]) -> Target:
        """The first of ``targets`` with room, waiting in the admission queue as the
        one-hop path does."""
        info = self.parsed.info
        cost = (info.prompt_tokens, info.expected_output_tokens)
        admission = self.state.admission
        return await admission.take(info.request_class, targets, self.share, cost, self.seat)

    def placed(self, backend: str) -> None:
        """A hop goes to ``backend``: the router's other processes learn it (its pool's
        record, router.control.placement)."""
        if self.state.placement is not None:
            self.state.placement.placed(self.policy, backend, self.parsed.info.prefix_blocks)


def prefill_body(doc: Mapping[str, Any], model: str, endpoint: Endpoint) -> bytes:
    """The prefill hop's body (see the module)."""
    out = {k: v for k, v in doc.items() if k not in _PREFILL_DROPS}
    out["model"] = model
    out["stream"] = False
    if endpoint == "responses":
        out["max_output_tokens"] = 1
    else:
        out["max_tokens"] = 1
        if "max_completion_tokens" in doc:
            out["max_completion_tokens"] = 1
    out[KEY] = dict(TO_DECODE)
    return orjson.dumps(out)


def decode_body(
    raw: bytes, doc: Mapping[str, Any], model: str, add_usage: bool, params: object
) -> bytes:
    """The decode hop's body: the one-hop body plus the prefill's ``params`` (None: none)."""
    if KEY in doc:  # the client's own: dropped (see the module)
        doc = {k: v for k, v in doc.items() if k != KEY}
        raw = orjson.dumps(doc)
    body = upstream_body(raw, doc, model=model, priority=None, add_usage=add_usage)
    if params is None:
        return body
    return splice_field(body, b'"' + KEY.encode() + b'":' + orjson.dumps(params))


def _attempts(req: TwoHop, decision: Decision | None) -> list[Attempt]:
    """``decision``'s ranked backends that serve the request's model, as attempts (the
    prefill and fallback rankings; the decode one is the core plan's own)."""
    if decision is None:
        return []
    pool, model = req.state.pool, req.parsed.info.model
    out = []
    for name in decision.ranked[: req.failover.max_attempts]:
        backend = pool.by_name[name]
        served = pool.upstream_model(backend, model)
        if served is not None:
            out.append(Attempt(backend, served))
    return out


async def open_two_hop(req: TwoHop, hops: Hops) -> Opened:
    """Serve ``req``'s hops up to the answer the client gets (see the module). The decision
    is the core plan's (router.control.plan): its attempts are the decode ranking, its
    ``memo`` the :class:`~policies.pd.PhasePlan` with the rest. Each hop waits for room in
    the admission queue as a one-hop request does."""
    state, info, policy = req.state, req.parsed.info, req.policy
    t = time.monotonic()
    planned = plan(state.pool, policy, info, req.failover.max_attempts)
    state.metrics.policy.decision(policy.name, time.monotonic() - t)
    if isinstance(planned, Refusal):
        raise planned.error()
    phases = planned.decision.memo
    assert isinstance(phases, PhasePlan)  # what PdPolicy.choose decides
    prefill, fallback = _attempts(req, phases.prefill), _attempts(req, phases.fallback)
    if req.trace.recording:
        ranked = [a.backend.name for a in (*prefill, *planned.attempts)]
        req.trace.picked(policy.name, ranked, t, time.monotonic())
    if phases.skipped:
        hops.path = "skipped"
        return await _decode(req, hops, planned, [], None)
    try:
        params = await _prefill(req, hops, phases, prefill)
    except UpstreamFailed:
        if not fallback:
            raise
        hops.path = "fallback"
        doc = req.parsed.doc
        plain = [_target(req, a, decode_body(req.raw, doc, a.model, req.add_usage, None))
                 for a in fallback]  # fmt: skip
        first = await req.take(plain)
        policy.committed(info, planned.decision, first.backend.name)
        req.placed(first.backend.name)
        return await _open(req, [first, *plain])
    if isinstance(params, Opened):
        return params
    if params is None:
        hops.path = "local"
    return await _decode(req, hops, planned, prefill, params)


def _target(req: TwoHop, attempt: Attempt, body: bytes) -> Target:
    return Target(attempt.backend, attempt.backend.spec.url + req.url_path, body)


async def _open(req: TwoHop, targets: list[Target]) -> Opened:
    return await open_upstream(
        req.state.connections,
        targets,
        req=req.parsed.info,
        headers=req.headers,
        timeouts=req.timeouts,
        failover=req.failover,
        on_failover=req.on_failover,
        admission=req.state.admission,
        trace=req.trace,
    )


async def _prefill(
    req: TwoHop, hops: Hops, phases: PhasePlan, attempts: list[Attempt]
) -> Opened | dict[str, Any] | None:
    """The prefill hop down ``attempts``: the decode engine's params (None: the answer had
    none), or the prefill engine's own 4xx answer for the client. Raises
    :class:`UpstreamFailed` when every prefill engine failed."""
    info, doc = req.parsed.info, req.parsed.doc
    left = [_target(req, a, prefill_body(doc, a.model, info.endpoint)) for a in attempts]
    if not left:  # no prefill engine is healthy: the fallback's turn
        raise UpstreamFailed(Failure("none", "no prefill backend is healthy"), 0)
    first = await req.take(left)
    req.policy.prefill_committed(info, phases, first.backend.name)
    req.placed(first.backend.name)
    left.insert(0, first)
    while True:
        t0 = time.monotonic()
        opened = await _open(req, left)
        backend = opened.target.backend.name
        if opened.head.status >= 300:
            return opened
        try:
            raw = await opened.conn.read(_ANSWER_BYTES, truncate=False)
            answer = orjson.loads(raw)
        except (UpstreamError, orjson.JSONDecodeError) as exc:  # includes BodyTooLarge
            opened.lease.failed()
            failure = Failure(backend, f"backend {backend} broke its prefill answer: {exc}")
            left = left[left.index(opened.target) + 1 :]
            if not left:
                raise UpstreamFailed(failure, opened.failovers) from None
            req.on_failover(failure)
            continue
        finally:
            req.state.connections.release(opened.conn)
            opened.lease.release()
        hops.prefill_backend, hops.prefills = backend, hops.prefills + 1
        hops.prefill_s = time.monotonic() - t0
        req.policy.prefilled(info, backend, Outcome(opened.head.status, True))
        params = answer.get(KEY) if isinstance(answer, dict) else None
        return params if isinstance(params, dict) else None


def _reached(failure: Failure) -> bool:
    """Whether a failed decode attempt may have reached its engine (and pulled the KV): only
    a failed connection shows it did not."""
    return failure.status is not None or failure.timeout or failure.kind is not None


async def _decode(
    req: TwoHop,
    hops: Hops,
    planned: Plan,
    prefill: list[Attempt],
    params: dict[str, Any] | None,
) -> Opened:
    """The decode hop down the plan's attempts (see the module for when it prefills
    afresh)."""
    info, doc = req.parsed.info, req.parsed.doc
    phases = planned.decision.memo
    assert isinstance(phases, PhasePlan)
    ready = time.monotonic()
    models = {id(a.backend): a.model for a in planned.attempts}
    left = [_target(req, a, b"") for a in planned.attempts]  # bodies once params are known
    first = await req.take(left)
    req.policy.committed(info, planned.decision, first.backend.name)
    req.placed(first.backend.name)
    left.insert(0, first)
    attempts = 0
    while True:
        target = left.pop(0)
        body = decode_body(req.raw, doc, models[id(target.backend)], req.add_usage, params)
        hops.decode_sent = time.monotonic()
        hops.handoff_s = hops.decode_sent - ready
        try:
            opened = await _open(req, [Target(target.backend, target.url, body)])
            return replace(opened, failovers=attempts)
        except UpstreamFailed as exc:
            attempts += 1
            if not left or attempts >= req.failover.max_attempts:
                raise UpstreamFailed(exc.last, attempts - 1) from None
            req.on_failover(exc.last)
            if params is not None and _reached(exc.last):
                fresh = await _prefill(req, hops, phases, prefill)
                if isinstance(fresh, Opened):
                    return fresh
                params = fresh
                ready = time.monotonic()
