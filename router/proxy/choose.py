"""The handler's choose step: the request's policy, the policy's plan (timed) and the
attempts it makes, each with the body it sends (router.proxy.handler)."""

from __future__ import annotations

import time
from functools import partial

from policies.base import Policy
from policies.types import RequestInfo
from router.control.auth import Tenant
from router.control.classify import Parsed
from router.control.plan import Attempt, Plan, Refusal, plan
from router.proxy.body import asks_usage, upstream_body
from router.proxy.state import RouterState, Snapshot
from router.proxy.upstream import Target
from router.server.answer import Client
from router.server.errors import RouterError


def header_for(request: Client, name: str, tenant: Tenant | None, setting: str) -> str | None:
    """Header ``name``, unless the caller's key configures ``setting`` and allows no override."""
    if tenant is not None and not tenant.overrides(getattr(tenant.spec, setting)):
        return None
    return request.headers.get(name)


def policy_for(request: Client, snap: Snapshot, tenant: Tenant | None) -> Policy:
    """The header's policy (if honoured), else the API key's, else the default."""
    name = header_for(request, "X-Turnout-Policy", tenant, "policy")
    if name is None or not snap.config.honor_policy_header:
        own = tenant.spec.policy if tenant is not None else None
        return snap.policies[own or snap.config.default_policy]
    policy = snap.policies.get(name.strip())
    if policy is None:
        known = ", ".join(snap.policies)
        raise RouterError(400, f"unknown policy '{name}' (known: {known})", "X-Turnout-Policy")
    return policy


def router_asks_usage(parsed: Parsed) -> bool:
    """A stream whose client did not ask for usage: the router asks, then strips it."""
    info = parsed.info
    return info.stream and not parsed.include_usage and asks_usage(info.endpoint)


def plan_timed(state: RouterState, policy: Policy, info: RequestInfo, max_attempts: int) -> Plan:
    """:func:`router.control.plan.plan`, timed for the policy's decision metric; a refusal is
    raised as the client's error."""
    t0 = time.perf_counter()
    planned = plan(state.pool, policy, info, max_attempts)
    state.metrics.policy.decision(policy.name, time.perf_counter() - t0)
    if isinstance(planned, Refusal):
        raise planned.error()
    return planned


def with_bodies(
    planned: Plan, parsed: Parsed, raw: bytes, path: str, add_usage: bool, band: int
) -> list[Target]:
    """The plan's attempts with the bodies they send to ``path`` on each backend, each made
    when its attempt is (:class:`Target`); ``add_usage``: each body asks for the stream's
    usage (:func:`router_asks_usage`); ``band``: the caller's priority band, which moves the
    ``priority`` field of engines that schedule by it."""
    return [
        Target(
            a.backend,
            a.backend.spec.url + path,
            partial(_body, planned, a, parsed, raw, add_usage, band),
        )
        for a in planned.attempts
    ]


def _body(
    planned: Plan, attempt: Attempt, parsed: Parsed, raw: bytes, add_usage: bool, band: int
) -> bytes:
    return upstream_body(
        raw,
        parsed.doc,
        model=attempt.model,
        priority=planned.priority(attempt.backend, band),
        add_usage=add_usage,
    )
