"""Helpers for tests: candidate snapshots and requests with sensible defaults."""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Policy
from policies.types import Candidate, Decision, EngineLoad, RequestClass, RequestInfo


def make_candidate(
    name: str,
    engine: str | None = None,
    *,
    healthy: bool = True,
    inflight: int = 0,
    max_inflight: int | None = None,
    prompt_tokens: int = 0,
    output_tokens: int = 0,
    waiting: float | None = None,
    running: float | None = None,
    kv: float | None = None,
    stale: bool = False,
    priority_capable: bool = False,
) -> Candidate:
    """A snapshot; ``engine`` defaults to ``name``; scraped load only if a figure is given."""
    scraped = waiting is not None or running is not None or kv is not None
    return Candidate(
        name=name,
        engine=engine or name,
        healthy=healthy,
        inflight=inflight,
        max_inflight=max_inflight,
        outstanding_prompt_tokens=prompt_tokens,
        outstanding_output_tokens=output_tokens,
        load=EngineLoad(waiting=waiting, running=running, kv_cache_usage=kv, stale=stale)
        if scraped
        else None,
        priority_capable=priority_capable,
    )


def make_request(
    request_class: RequestClass = "interactive",
    *,
    request_id: str = "req-1",
    prompt_tokens: int = 1000,
    max_tokens: int | None = 200,
    stream: bool = True,
    session_key: str | None = None,
    prefix_hash: int | None = None,
    prefix_blocks: tuple[int, ...] = (),
) -> RequestInfo:
    """A chat request of the given class."""
    return RequestInfo(
        request_id=request_id,
        endpoint="chat",
        model="m",
        request_class=request_class,
        stream=stream,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        session_key=session_key,
        prefix_hash=prefix_hash,
        prefix_blocks=prefix_blocks,
    )


def send(policy: Policy, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
    """``policy``'s decision for ``req``, committed to its head as the router commits a
    request it sends there (an empty ranking commits nothing)."""
    decision = policy.choose(req, candidates)
    if decision.ranked:
        policy.committed(req, decision, decision.ranked[0])
    return decision
