"""The plugin protocols. Each is one method; plugins never do I/O, time or log themselves."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol, runtime_checkable

from policies.types import Candidate, Decision, Lesson, Outcome, RequestClass, RequestInfo, Slo

PluginKind = Literal["filter", "scorer", "picker"]


@runtime_checkable
class Filter(Protocol):
    """Shrinks the candidate set (may return it unchanged, never adds)."""

    def filter(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Sequence[Candidate]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better."""

    def score(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Mapping[str, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Turns weighted total scores into a ranked list of backend names."""

    def pick(self, req: RequestInfo, scored: Sequence[tuple[Candidate, float]]) -> list[str]: ...


@runtime_checkable
class Learner(Protocol):
    """A plugin that learns from finished requests (the pipeline forwards ``on_finish``)."""

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None: ...


@runtime_checkable
class Commits(Protocol):
    """A plugin that records where requests are sent (the pipeline forwards ``committed``).

    Called once per request, with the candidates it was ranked over and the backend its
    first attempt goes to: what a plugin learns from a choice belongs here, not in its
    ``score`` or ``pick``, which run again for a request that waited for room.
    """

    def committed(
        self, req: RequestInfo, candidates: Sequence[Candidate], backend: str
    ) -> None: ...


@runtime_checkable
class Nominates(Protocol):
    """A plugin that can name the backends it would score best without reading the others
    (the cache-aware scorer: those its record says hold the prompt's prefix). A sampled
    pipeline scores them along with its random draw (policies/sampling.py)."""

    def nominate(self, req: RequestInfo) -> Sequence[str]: ...


@runtime_checkable
class SharesPlacement(Protocol):
    """A policy or plugin whose record of where prompts went (the cache-aware prefix record)
    also learns from where the router's other processes sent theirs.

    The router passes on, for each request such a policy sent, the backend and the prompt's
    prefix blocks (router.control.placement), and each other process's instance records them
    through :meth:`learn`; a policy whose ``shares_placement`` attribute is true is one.
    """

    def learn(self, backend: str, blocks: Sequence[int]) -> None: ...


@runtime_checkable
class SharesLearning(Protocol):
    """A policy whose learned estimates (``adaptive``'s TTFT lines, TPOT, batch pace and
    interactive attainment) also learn from the requests the router's other processes served.

    For each finished request of such a policy the router asks for its :meth:`lesson` just
    before its ``on_finish`` (a lesson holds what the policy noted when it chose, which
    ``on_finish`` lets go), passes it on (router.control.placement), and each other process's
    instance learns it through :meth:`taught`, as its own ``on_finish`` learns its own. A
    policy whose ``shares_learning`` attribute is true is one.
    """

    def lesson(self, req: RequestInfo, backend: str, outcome: Outcome) -> Lesson | None:
        """What the finished ``req`` teaches (None: nothing); changes nothing."""
        ...

    def taught(self, lesson: Lesson) -> None: ...


@runtime_checkable
class SharesSpills(Protocol):
    """A policy that caps the requests it spills onto a backend (``adaptive``'s batch spills
    onto a low-TTFT replica) by how many the router has open there, whichever worker sent them.

    Right after a request's ``committed`` the router asks :meth:`spill` whether the request
    was spilled, and just before its ``on_finish`` asks again; what is open it passes on to the
    router's other workers (router.control.placement), whose instances count it through
    :meth:`spill_opened` until :meth:`spill_closed`. ``origin`` names the worker that spilled
    it (never empty). A policy whose ``shares_spills`` attribute is true is one.
    """

    def spill(self, request_id: str) -> tuple[str, int] | None:
        """The backend this process's ``request_id`` is spilled to and its prompt tokens,
        while it is open (None: it is not); changes nothing."""
        ...

    def spill_opened(
        self, origin: str, request_id: str, backend: str, prompt_tokens: int
    ) -> None: ...

    def spill_closed(self, origin: str, request_id: str) -> None: ...


@runtime_checkable
class Forgets(Protocol):
    """A policy or plugin that keeps figures per backend name.

    ``forget`` is called when a backend has left the router (a replica behind a DNS name
    that went away, or one a reload removed), so figures of backends that come and go stay
    bounded; a backend that comes back under the name starts afresh.
    """

    def forget(self, backend: str) -> None: ...


@runtime_checkable
class Policy(Protocol):
    """A named routing policy: ``choose`` is pure and synchronous; ``committed`` and
    ``on_finish`` are where it learns.

    ``choose`` may run more than once for a request, or for one never sent (the simulator
    and the debugging endpoints ask too), so it changes nothing. ``committed`` is called
    once per request the router sends, with the decision it is sent on and the backend its
    first attempt goes to (llm-d's PreRequest); ``on_finish`` once per classified request,
    sent or not.
    """

    name: str
    type: str

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision: ...

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None: ...

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None: ...


def reads_prefix(policy: object) -> bool:
    """Whether ``policy`` reads a request's prompt prefix (``RequestInfo.prefix_hash`` and
    ``prefix_blocks``), which the router then hashes for it (else it leaves them empty).

    A policy says so with a ``reads_prefix`` attribute; one that does not say is taken to
    read it. A pipeline's is its plugins': those that read it say ``reads_prefix = True``.
    """
    return bool(getattr(policy, "reads_prefix", True))


@runtime_checkable
class ReportsError(Protocol):
    """A policy that predicts per backend and measures how wrong it was (exported as a
    metric per policy and backend)."""

    def prediction_error(self) -> Mapping[str, float]:
        """Backend name -> mean absolute percentage error of its recent predictions (a
        ratio); backends without any are absent."""
        ...


@runtime_checkable
class Judged(Protocol):
    """A policy that declares SLO targets per class; the router counts goodput by them."""

    @property
    def slo(self) -> Mapping[RequestClass, Slo]: ...


class PipelineObserver(Protocol):
    """Where the pipeline runner reports on its plugins (the router's metrics facade).

    Each method is called once per plugin when a policy is built and returns the callable
    the runner then calls per request, so nothing is looked up on the hot path. ``plugin``
    is the plugin's configured type name (with its position when a type repeats).
    """

    def plugin_timer(self, policy: str, kind: PluginKind, plugin: str) -> Callable[[float], None]:
        """Called with the seconds one run of the plugin took."""
        ...

    def filter_emptied(self, policy: str, filter: str) -> Callable[[], None]:
        """Called each time the filter removes every remaining candidate."""
        ...


def _ignore_seconds(seconds: float) -> None:
    pass


def _ignore() -> None:
    pass


class NullObserver:
    """A :class:`PipelineObserver` that records nothing (tests, ``check-config``)."""

    __slots__ = ()

    def plugin_timer(self, policy: str, kind: PluginKind, plugin: str) -> Callable[[float], None]:
        return _ignore_seconds

    def filter_emptied(self, policy: str, filter: str) -> Callable[[], None]:
        return _ignore
