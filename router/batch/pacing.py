"""How many batch lines one router runs at once: AIMD on the interactive class's TTFT.

With an interactive TTFT SLO (the policies' goodput targets, router.control.slo) the window
starts at ``initial_concurrency`` and, once per :data:`PERIOD`, while the lines want more than
it allows:

- grows while the interactive P95 TTFT of the last :data:`WINDOW` seconds stays under
  ``headroom`` x its SLO (or there is no interactive traffic to protect): doubles until the
  first decrease (TCP's slow start: a batch reaches the capacity it is given in a few
  periods), then by a tenth, at least one line (additive increase);
- halves (multiplicative decrease, not below ``min_concurrency``) when it does not, and when
  the service failed a batch request in the period (a reason of
  router.observe.outcomes.FAILURES: the batch pool full, no backend, an engine's error or
  timeout), which says the shared engines are pressed. A request refused for what its
  tenant did (its own quota, an invalid body) is no such sign: the executor holds back that
  tenant's lines alone (router.batch.executor), and the window stays.

The P95 counts only interactive requests served by a backend that also served batch requests
in the last :data:`SHARED` seconds: a batch can only slow those down (the engine's slots and
KV cache are what they share). Interactive traffic that is slow on a pool the batch never
touches (class-split keeps them apart) is no reason to hold the batch back, and holding it
back would not help it. The one thing every request shares is the router's own event loop,
which runs every batch line too: when the P95 of *all* interactive TTFTs is over the target
and the loop fell behind by more than :data:`LAG_SHARE` of the target in the period (see
:meth:`Pacer.lag`), the window halves as well.

Without any SLO the window is fixed at ``max_concurrency``: a plain concurrency budget.
"""

from __future__ import annotations

import math
import time
from collections import deque

from router.config.batch import BatchSettings
from router.observe.outcomes import FAILURES

PERIOD = 1.0
"""Seconds between two adjustments."""
WINDOW = 10.0
"""Seconds of interactive TTFTs the P95 is taken over."""
SHARED = 60.0
"""Seconds a backend counts as shared after it last answered a batch request."""
LAG_SHARE = 0.1
"""Loop lag, as a share of the TTFT target, that makes the router a suspect."""
MIN_SAMPLES = 5
"""Fewer interactive answers than this in the window are no signal (no decrease)."""
_KEEP = 2048


class Pacer:
    """The batch lines' concurrency window."""

    def __init__(self, settings: BatchSettings, slo_ttft: float | None) -> None:
        """``slo_ttft``: the interactive TTFT target in seconds; None: a fixed budget."""
        self._settings = settings
        self._target = None if slo_ttft is None else slo_ttft * settings.headroom
        self._ttfts: deque[tuple[float, str, float]] = deque(maxlen=_KEEP)
        self._batch_seen: dict[str, float] = {}
        self._refused = False
        self._lag = 0.0
        self._slow_start = True
        self._last = time.monotonic()
        self.limit = float(
            settings.initial_concurrency if slo_ttft is not None else settings.max_concurrency
        )

    @property
    def window(self) -> int:
        """Lines that may be in flight now."""
        return int(self.limit)

    def observe(self, request_class: str, backend: str, ttft: float | None, reason: str) -> None:
        """A finished request (``reason``: its outcome, router.observe.metrics): a batch one
        marks its backend shared, and is pressure when the service failed it; an interactive
        one's TTFT is a sample."""
        now = time.monotonic()
        if request_class == "batch":
            self._batch_seen[backend] = now
            if reason in FAILURES:
                self._refused = True
        elif request_class == "interactive" and ttft is not None:
            self._ttfts.append((now, backend, ttft))

    def lag(self, seconds: float) -> None:
        """The event loop ran a timer ``seconds`` late (the executor probes it)."""
        self._lag = max(self._lag, seconds)

    def p95(self, now: float, *, shared_only: bool = True) -> float | None:
        """The P95 TTFT of the window's interactive requests (on shared backends only, by
        default); None with too few samples."""
        shared = {b for b, at in self._batch_seen.items() if at >= now - SHARED}
        recent = sorted(
            t for at, b, t in self._ttfts if at >= now - WINDOW and (b in shared or not shared_only)
        )
        if len(recent) < MIN_SAMPLES:
            return None
        return recent[min(len(recent) - 1, math.ceil(0.95 * len(recent)) - 1)]

    def adjust(self, wanting: bool) -> None:
        """Once per period: ``wanting`` says the lines had more to run than the window held."""
        now = time.monotonic()
        if now - self._last < PERIOD or self._target is None:
            return
        self._last = now
        s = self._settings
        target = self._target
        p95 = self.p95(now)
        busy = self._lag > LAG_SHARE * target and (self.p95(now, shared_only=False) or 0) > target
        if self._refused or busy or (p95 is not None and p95 > target):
            self.limit = max(float(s.min_concurrency), self.limit / 2)
            self._slow_start = False
        elif wanting:
            grown = self.limit * 2 if self._slow_start else self.limit + max(1.0, self.limit / 10)
            self.limit = min(float(s.max_concurrency), grown)
        self._refused = False
        self._lag = 0.0
