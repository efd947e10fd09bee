"""Planning one request: the policy's ranking as the attempts the router would make, or why
it makes none, as a value.

:func:`plan` is the one routing decision of the router: the live handler and ``replay
simulate`` both call it, over the same :class:`~router.backends.pool.Pool`, so a simulated
verdict is the router's own. It does no I/O, reads no clock and raises nothing; it leaves
the pool and the policy as they were (what a policy learns from the choice waits for its
``committed``, called by whoever sends the request). Whether an attempt's backend has room
is :func:`first_free`'s question, asked by admission (router.control.admission) when the
request is to go, not here: a request whose backends are all full waits for one of them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from policies.base import Policy
from policies.types import Decision, RequestInfo
from router.backends.pool import BackendState, Pool
from router.control.fair import engine_priority
from router.server.errors import RouterError

log = logging.getLogger("router")


@dataclass(frozen=True, slots=True)
class Attempt:
    """One backend of the ranking, and the model name it knows the request's model by."""

    backend: BackendState
    model: str


class OnBackend(Protocol):
    """Anything aimed at one backend (an :class:`Attempt`, an upstream target)."""

    @property
    def backend(self) -> BackendState: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The backends to try, best first (the head serves, the tail is failover), and the
    decision they come from (handed back to the policy's ``committed``)."""

    decision: Decision
    attempts: tuple[Attempt, ...]

    def priority(self, backend: BackendState, band: int = 0) -> int | None:
        """The ``priority`` field of the body ``backend`` gets, for a caller of ``band``
        (router.control.fair.engine_priority): only engines that schedule by priority get
        one (others may reject it)."""
        if not backend.spec.priority_capable:
            return None
        return engine_priority(self.decision.priority, band)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why no backend is tried: the error the client gets."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None

    def error(self) -> RouterError:
        return RouterError(self.status, self.message, self.param, self.code)


def plan(
    pool: Pool, policy: Policy, info: RequestInfo, max_attempts: int | None = None
) -> Plan | Refusal:
    """``policy``'s ranking of ``pool``'s candidates for ``info``, as attempts on the
    backends that serve its model (full ones included: see the module), at most
    ``max_attempts`` of them: no more than failover makes, since a body is made per attempt
    and a policy may rank the whole fleet."""
    candidates = pool.candidates(info.model)
    if not candidates:  # only now the question of which: a second pass over the backends
        if not pool.known_model(info.model):
            return Refusal(404, f"model '{info.model}' does not exist", "model", "model_not_found")
        return Refusal(503, "no healthy backend serves this model", code="no_backend")
    try:
        decision = policy.choose(info, candidates)
    except Exception:  # an out-of-tree policy's bug must not take the request down silently
        log.exception("policy %s failed to choose", policy.name)
        return Refusal(500, f"policy '{policy.name}' failed", code="policy_error")
    attempts: list[Attempt] = []
    for name in decision.ranked:
        if len(attempts) == max_attempts:
            break
        backend = pool.by_name[name]
        model = pool.upstream_model(backend, info.model)
        if model is not None:
            attempts.append(Attempt(backend, model))
    if not attempts:
        why = f": {decision.empty_reason}" if decision.empty_reason else ""
        return Refusal(503, f"policy '{policy.name}' found no backend{why}", code="no_backend")
    return Plan(decision, tuple(attempts))


def has_room(backend: BackendState) -> bool:
    """``backend`` is below its ``max_inflight``, or its router's grant of it (the live
    figures: router.backends.pool.BackendState.limit)."""
    limit = backend.limit
    return limit is None or backend.inflight < limit


def first_free(options: Sequence[OnBackend]) -> int | None:
    """The index of the first of ``options`` whose backend has room, None when none has."""
    for i, option in enumerate(options):
        if has_room(option.backend):
            return i
    return None
