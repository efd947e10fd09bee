"""Value objects that flow through a policy: the request, the candidates, the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from turnout.common.figures import meets

RequestClass = Literal["interactive", "batch"]
# tokenize and detokenize never reach a policy (router.proxy.utility); they name a lease's request.
Endpoint = Literal["chat", "completions", "embeddings", "responses", "tokenize", "detokenize"]
REQUEST_CLASSES: tuple[RequestClass, ...] = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a policy may know about one request (parsed once by the router's classifier)."""

    request_id: str
    endpoint: Endpoint
    model: str
    request_class: RequestClass
    stream: bool = False
    prompt_tokens: int = 0
    """Estimated prompt size in tokens (the documented counting rule, not the engine's)."""
    max_tokens: int | None = None
    """Requested output budget (``max_completion_tokens`` wins over ``max_tokens``)."""
    session_key: str | None = None
    """Session/affinity key (a session header), when the client sent one."""
    prefix_hash: int | None = None
    """Hash of the prompt's leading block, for prefix-cache affinity."""
    prefix_blocks: tuple[int, ...] = ()
    """Hash chain of the prompt text's blocks, for cache-aware routing (policies/prefix.py)."""
    choices: int = 1
    """Choices generated in parallel (the request's ``n``), each up to ``max_tokens``."""

    @property
    def expected_output_tokens(self) -> int:
        """Output tokens to plan for, over all choices (256 a choice without a budget)."""
        per_choice = self.max_tokens if self.max_tokens is not None else 256
        return per_choice * self.choices


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """Load scraped from an engine's own /metrics (None where the engine does not say)."""

    waiting: float | None = None
    running: float | None = None
    kv_cache_usage: float | None = None
    """Fraction in [0, 1]."""
    kv_cache_tokens: float | None = None
    """The engine's whole KV cache, in tokens (vLLM's ``cache_config_info``: blocks x
    block size, summed over its data-parallel engines); what its prefix cache can hold."""
    age_s: float = 0.0
    """Seconds since the scrape that produced these figures."""
    stale: bool = False
    """True when the scrape is older than the configured staleness bound."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A snapshot of one backend as the router sees it when a request arrives."""

    name: str
    engine: str
    """Engine kind, e.g. ``vllm`` or ``deepinfer``; backends of one kind form a pool."""
    healthy: bool = True
    inflight: int = 0
    """Requests the router currently has open on this backend."""
    max_inflight: int | None = None
    outstanding_prompt_tokens: int = 0
    outstanding_output_tokens: int = 0
    load: EngineLoad | None = None
    priority_capable: bool = False
    """The engine honours the request ``priority`` field (vLLM priority scheduling)."""

    @property
    def outstanding_tokens(self) -> int:
        return self.outstanding_prompt_tokens + self.outstanding_output_tokens

    @property
    def saturated(self) -> bool:
        return at_limit(self.inflight, self.max_inflight)


def at_limit(inflight: int, max_inflight: int | None) -> bool:
    """A backend with ``inflight`` requests open takes no more: the one rule, for the
    router's live figures and a policy's snapshot of them alike."""
    return max_inflight is not None and inflight >= max_inflight


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer: backends in preference order (head serves, tail is failover)."""

    ranked: tuple[str, ...]
    priority: int | None = None
    """When set, the router writes this into the upstream body's ``priority`` field."""
    scores: dict[str, float] = field(default_factory=dict)
    """Final per-backend scores, for debugging endpoints; never on the hot path."""
    empty_reason: str | None = None
    """Why ``ranked`` is empty, when the policy can say (e.g. which filter removed every
    candidate); the router adds it to its 503 message."""
    memo: object = None
    """What ``choose`` worked out that the policy's ``committed`` records, should the router
    send the request on this decision (the router hands it back untouched)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to a routed request; fed back to learning policies via ``on_finish``."""

    status: int
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True, slots=True)
class Lesson:
    """What one finished request teaches a learning policy, in terms any process of the
    router can learn from: the policy's ``lesson`` makes it where the request was served,
    its ``taught`` learns it there and in every other process (policies.base.SharesLearning).
    """

    backend: str
    request_class: RequestClass
    stream: bool
    prompt_tokens: int
    """The router's estimate of the prompt (the engine's count when it had none)."""
    ahead_tokens: float
    """The prefill the serving process estimated queued ahead on ``backend`` when it chose."""
    outcome: Outcome


def group_of(name: str) -> str:
    """The configured backend a backend name stands for in policy params.

    A replica the router discovered behind a configured backend's DNS name is named
    ``<backend>@<address>`` (``vllm@10.0.3.7``; configured names cannot hold ``@``), and
    policies treat it as that backend: ``group_of("vllm@10.0.3.7") == "vllm"``. Any other
    name stands for itself.
    """
    return name.partition("@")[0]


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What a policy may know about a configured backend when it is built.

    Policies are built against the configured backends; the candidates they then rank may
    be replicas discovered behind one of them (see :func:`group_of`).
    """

    name: str
    engine: str
    """Engine kind, e.g. ``vllm`` or ``deepinfer``; the same kind forms one pool."""
    priority_capable: bool = False


@dataclass(frozen=True, slots=True)
class Slo:
    """A class's service-level targets: time to first token and time per output token (s).

    Shared by the adaptive policy (spill control) and anything counting goodput.
    """

    ttft_s: float
    tpot_s: float

    def met(self, outcome: Outcome) -> bool:
        """A failed request, or one over either target, misses.

        For a non-streamed response ``ttft_s`` is the whole response time, so it is judged
        against the TTFT target as a whole.
        """
        return meets(outcome.ok, outcome.ttft_s, outcome.tpot_s, self.ttft_s, self.tpot_s)
