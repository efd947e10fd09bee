"""Per-backend outlier ejection (a circuit breaker driven by real requests).

Closed: requests flow; ``failures_to_eject`` consecutive failures open it, unless the pool
says no more backends may be out (``may_eject``: the ejection cap), in which case it stays
closed and the next failure asks again. Which failures are the backend's is decided by the
caller (router.proxy.upstream); the breaker only counts. Open: the backend gets no requests
for the current cooldown. Half-open: once the cooldown has passed, exactly one request at a
time is let through as a probe; its success closes the breaker and resets the cooldown, its
failure opens it again for twice the previous cooldown (up to ``cooldown_max``), so a backend
that keeps failing is tried less and less often.
"""

from __future__ import annotations

from collections.abc import Callable


class Breaker:
    """Mutated only from the event loop."""

    __slots__ = (
        "_base",
        "_clock",
        "_cooldown",
        "_failures",
        "_max",
        "_may_eject",
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
    ) -> None:
        self._threshold = threshold
        self._may_eject = may_eject
        self._base = cooldown
        self._max = max(cooldown, cooldown_max)
        self._clock = clock
        self._cooldown = cooldown
        self._failures = 0
        self._open_until: float | None = None
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

    def allows(self) -> bool:
        """Whether a new request may be sent now."""
        if self._open_until is None:
            return True
        return self._clock() >= self._open_until and not self.probing

    def started(self) -> None:
        """A request was sent; in half-open it is the probe."""
        if self._open_until is not None:
            self.probing = True

    def ended(self) -> None:
        """The request ended (its verdict, if any, comes through ok/failed)."""
        self.probing = False

    def ok(self) -> None:
        self._failures = 0
        # A request sent before the ejection proves nothing; only the half-open probe counts.
        if self._open_until is not None and self._clock() >= self._open_until:
            self._open_until = None
            self._cooldown = self._base

    def failed(self) -> None:
        if self._open_until is not None:
            if self._clock() >= self._open_until:  # the probe failed: back out, for longer
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

    @property
    def cooldown(self) -> float:
        """The cooldown the next (or current) ejection lasts."""
        return self._cooldown
