"""What ``adaptive`` keeps of its batch spills: the settings, the limit's governor, and the
notes of which spilled requests are still open on which low-TTFT replica.

A spill borrows a low-TTFT replica for a batch request (policies/adaptive.py says when). How
many may be open at once on one replica is :class:`SpillGovernor`'s limit, and how many are
is :class:`SpillNotes`' count, kept from ``committed`` to ``on_finish``: the router's, as the
router's other workers tell the policy of theirs (policies.base.SharesSpills).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from policies.types import Candidate
from turnout.common.schema import Reader

# Additive increase of the spill limit per interactive request that met its SLO: four such
# requests re-open one spill slot; a breach of the attainment target halves the limit.
_LIMIT_STEP = 0.25


@dataclass(frozen=True, slots=True)
class SpillSettings:
    """How much batch work may borrow the low-TTFT pool (policies/adaptive.py)."""

    enabled: bool = True
    headroom: float = 1.0
    max_inflight: int = 4
    initial_inflight: int = 1
    min_high_inflight: int = 1
    min_attainment: float = 0.95
    window: int = 50
    priority: int = 10
    priority_prefill_tokens: int = 2048
    pace_margin: float = 1.0


@dataclass(slots=True)
class SpillGovernor:
    """AIMD on the per-replica spill limit, driven by interactive SLO attainment.

    The limit starts at ``initial_inflight`` (one slot by default), so spilling proves
    itself before it grows: the priors may be wrong. Over the last ``window`` interactive
    outcomes on the low-TTFT pool: while attainment is at or above the target each met SLO
    raises the limit a little (up to ``max_inflight``);
    a miss while attainment is below the target halves it, at most once per ``window // 4``
    outcomes so one burst of misses does not drive it straight to zero.
    """

    settings: SpillSettings
    limit: float = field(init=False)
    _outcomes: deque[bool] = field(init=False)
    _since_cut: int = 0

    def __post_init__(self) -> None:
        self.limit = float(min(self.settings.initial_inflight, self.settings.max_inflight))
        self._outcomes = deque(maxlen=self.settings.window)

    @property
    def attainment(self) -> float:
        """Fraction of the recent interactive outcomes that met the SLO (1.0 when none)."""
        return sum(self._outcomes) / len(self._outcomes) if self._outcomes else 1.0

    @property
    def allowed(self) -> int:
        """Spilled batch requests each low-TTFT replica may hold now."""
        return int(self.limit)

    def record(self, met: bool) -> None:
        """Feed one interactive outcome observed on the low-TTFT pool."""
        self._outcomes.append(met)
        self._since_cut += 1
        below = self.attainment < self.settings.min_attainment
        if not met and below and self._since_cut >= max(1, self.settings.window // 4):
            self.limit /= 2
            self._since_cut = 0
        elif met and not below:
            self.limit = min(float(self.settings.max_inflight), self.limit + _LIMIT_STEP)


SpillKey = tuple[str, str]
"""A spilled request: the router process that spilled it (``""``: this one) and its request
id (two workers may each see a client's X-Request-Id)."""


@dataclass(slots=True)
class SpillNotes:
    """The spilled requests open per backend (request -> prompt tokens, oldest first), this
    process's and those the router's other workers said they opened."""

    _open: dict[str, OrderedDict[SpillKey, int]] = field(default_factory=dict)
    _where: dict[SpillKey, str] = field(default_factory=dict)
    """Request -> the backend it was spilled to."""

    def count(self, backend: str) -> int:
        """Spilled requests open on ``backend``."""
        return len(self._open.get(backend, ()))

    def tokens(self, backend: str) -> int:
        """Prompt tokens of the spilled requests open on ``backend``."""
        records = self._open.get(backend)
        return sum(records.values()) if records else 0

    def backends(self) -> list[str]:
        """The backends with open spilled requests."""
        return list(self._open)

    def of(self, key: SpillKey) -> tuple[str, int] | None:
        """The backend ``key`` is spilled to and its prompt tokens, while it is open."""
        backend = self._where.get(key)
        return None if backend is None else (backend, self._open[backend][key])

    def note(self, key: SpillKey, backend: str, prompt_tokens: int) -> None:
        """``key`` was spilled to ``backend``."""
        self.forget(key)  # a client may reuse an X-Request-Id
        self._open.setdefault(backend, OrderedDict())[key] = prompt_tokens
        self._where[key] = backend

    def forget(self, key: SpillKey) -> None:
        """``key`` finished (or was never spilled)."""
        backend = self._where.pop(key, None)
        if backend is not None:
            records = self._open[backend]
            del records[key]
            if not records:  # no empty record per backend that ever was (they come and go)
                del self._open[backend]

    def reconcile(self, c: Candidate) -> None:
        """Drop notes the router can no longer have open on ``c``.

        A request that never reached a backend may never be reported to ``on_finish``, and
        another worker's word that its spill ended may be lost (it died, or this one fell a
        ring behind); the router's in-flight count (every worker's) bounds how many spilled
        requests can still be open there, so the oldest notes beyond it are stale.
        """
        records = self._open.get(c.name)
        while records and len(records) > c.inflight:
            key, _ = records.popitem(last=False)
            del self._where[key]


def queued_share(c: Candidate) -> float:
    """The share of ``c``'s requests waiting for prefill by a fresh scrape (1 without one)."""
    load = c.load
    if load is None or load.stale or load.waiting is None or not c.inflight:
        return 1.0
    return min(1.0, load.waiting / c.inflight)


def queueing(c: Candidate) -> bool:
    """Whether ``c`` has requests waiting for prefill (by a fresh scrape; without one, the
    router's in-flight count is all there is, so it may)."""
    load = c.load
    return load is None or load.stale or load.waiting is None or load.waiting > 0


def read_spill(p: Reader) -> SpillSettings:
    """The ``spill`` params (docs/policies.md, `adaptive`)."""
    d = SpillSettings()
    s = SpillSettings(
        enabled=p.flag("enabled", d.enabled),
        headroom=p.number("headroom", d.headroom, low=0.0, high=1.0),
        max_inflight=p.integer("max_inflight", d.max_inflight),
        initial_inflight=p.integer("initial_inflight", d.initial_inflight),
        min_high_inflight=p.integer("min_high_inflight", d.min_high_inflight),
        min_attainment=p.number("min_attainment", d.min_attainment, low=0.0, high=1.0),
        window=p.integer("window", d.window, low=1),
        priority=p.integer("priority", d.priority),
        priority_prefill_tokens=p.integer(
            "priority_prefill_tokens", d.priority_prefill_tokens, low=1
        ),
        pace_margin=p.number("pace_margin", d.pace_margin, low=1.0, high=2.0),
    )
    p.done()
    return s
