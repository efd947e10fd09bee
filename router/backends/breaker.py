"""Per-backend outlier ejection (a circuit breaker driven by real requests).

Closed: requests flow; ``failures_to_eject`` consecutive failures open it, unless the pool
says no more backends may be out (``may_eject``: the ejection cap), in which case it stays
closed and the next failure asks again. Which failures are the backend's is decided by the
caller (router.proxy.upstream); the breaker only counts. Open: the backend gets no requests
for the current cooldown. Half-open: once the cooldown has passed, exactly one request at a
time is let through as a probe; its success closes the breaker and resets the cooldown, its
failure opens it again for twice the previous cooldown (up to ``cooldown_max``), so a backend
that keeps failing is tried less and less often.

Each request gets a ticket when it starts (:meth:`Breaker.started`) and reports its outcome
with it. The ticket names the breaker's state at the time (an epoch, moved on by every
ejection and every closing), so an outcome decides only in the state its request was sent
in: a request sent before an ejection neither closes nor re-opens the breaker when it ends
after the cooldown, and only the half-open probe's own outcome moves the breaker out of
half-open. Requests sent while the breaker is out other than as the probe (panic mode routes
to ejected backends) get :data:`UNCOUNTED`.
"""

from __future__ import annotations

from collections.abc import Callable

UNCOUNTED = -1
"""The ticket of a request whose outcome the breaker ignores."""


class Breaker:
    """Mutated only from the event loop."""

    __slots__ = (
        "_base",
        "_clock",
        "_cooldown",
        "_epoch",
        "_failures",
        "_max",
        "_may_eject",
        "_on_change",
        "_open_until",
        "_threshold",
        "ejections",
        "probing",
    )

    def __init__(
        self,
        threshold: int,
        cooldown: float,
        cooldown_max: float,
        clock: Callable[[], float],
        may_eject: Callable[[], bool] = lambda: True,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_change`` is called whenever :meth:`allows` may have changed other than by
        the clock passing :attr:`reopens_at` (the pool keeps its candidate sets by it)."""
        self._threshold = threshold
        self._on_change = on_change
        self._may_eject = may_eject
        self._base = cooldown
        self._max = max(cooldown, cooldown_max)
        self._clock = clock
        self._cooldown = cooldown
        self._failures = 0
        self._open_until: float | None = None
        self._epoch = 0
        self.probing = False
        """A half-open probe request is in flight."""
        self.ejections = 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        if self._open_until is None:
            return "closed"
        return "open" if self._clock() < self._open_until else "half-open"

    @property
    def ejected(self) -> bool:
        """Open or half-open: out of service until a probe succeeds."""
        return self._open_until is not None

    @property
    def reopens_at(self) -> float | None:
        """While open: when the cooldown ends and a probe may go (None otherwise)."""
        if self._open_until is None or self._clock() >= self._open_until:
            return None
        return self._open_until

    def allows(self) -> bool:
        """Whether a new request may be sent now."""
        if self._open_until is None:
            return True
        return self._clock() >= self._open_until and not self.probing

    def started(self) -> int:
        """A request was sent: its ticket for :meth:`ok`, :meth:`failed` and :meth:`ended`.

        While the breaker is out, only the half-open probe gets a ticket that counts.
        """
        if self._open_until is None:
            return self._epoch
        if self.probing or self._clock() < self._open_until:
            return UNCOUNTED
        self.probing = True
        self._on_change()
        return self._epoch

    def ended(self, ticket: int) -> None:
        """The request of ``ticket`` ended (its verdict, if any, comes through ok/failed)."""
        if ticket == self._epoch and self._open_until is not None and self.probing:
            self.probing = False  # the probe's: the next request may probe
            self._on_change()

    def ok(self, ticket: int) -> int:
        """The request of ``ticket`` was answered properly; the ticket it holds from now on
        (a probe that closed the breaker belongs to the new state: its later failure counts)."""
        if ticket != self._epoch:
            return ticket  # sent before the state changed (or not counted): proves nothing
        if self._open_until is None:
            self._failures = 0
            return ticket
        self._open_until = None  # the probe passed
        self._cooldown = self._base
        return self._next_epoch()

    def failed(self, ticket: int) -> None:
        """The request of ``ticket`` failed in a way that is the backend's."""
        if ticket != self._epoch:
            return
        if self._open_until is not None:  # the probe failed: back out, for longer
            self._cooldown = min(self._cooldown * 2, self._max)
            self._eject()
            return
        self._failures += 1
        if self._failures >= self._threshold and self._may_eject():
            self._eject()

    def _eject(self) -> None:
        self._failures = 0
        self.ejections += 1
        self._open_until = self._clock() + self._cooldown
        self._next_epoch()

    def _next_epoch(self) -> int:
        """A change of state: every ticket handed out so far stops counting."""
        self._epoch += 1
        self.probing = False
        self._on_change()
        return self._epoch

    @property
    def cooldown(self) -> float:
        """The cooldown the next (or current) ejection lasts."""
        return self._cooldown
