"""A class's ``tail`` settings in virtual time: first-token deadlines and hedged requests.

The decisions are the router's own :class:`router.control.race.Race` (the one core the live
router drives on sockets, router.proxy.tail); here its moves act on engine models and the
simulation's timers. A streamed request of a class with ``tail`` settings is held from its
first attempt's launch (headers and role chunk come at once from an emulated engine, so the
attempt is a stream at once) until an attempt's first token:

- the race's next moment (a deadline, the hedge delay) is a timer on the virtual clock;
- a cut cancels the attempt's sequence in its engine (its slot and KV blocks freed at once)
  and ends its lease, as closing the connection does live;
- an opening (a failover or a hedge) launches on the first of its backends at once: an
  emulated engine always answers a stream's head;
- the first attempt whose engine emits a token wins; every other is cut at that moment (the
  engines run event by event while two attempts race, so the cut is exact).

What the live router counts in its metrics is counted in :class:`TailCounts`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from replay.simulate.attempts import Attempts, Flight, Waiter
from router.config.model import RouterConfig
from router.control.plan import Attempt
from router.control.race import Held, Moves, Race, queueing
from router.control.tailstate import TailMemory

_HOLD_MAX = 60.0  # as router.proxy.tail: held this long without a deadline when no idle is set

Start = Callable[[Waiter, Attempt, float], Flight | None]
"""Launch an attempt's sequence on its engine (None: the engine refused it)."""
Cut = Callable[[Flight, float], bool]
"""End a flight unanswered at the given time (its engine cancels it, its lease ends)."""
Arm = Callable[[Flight, float], None]
"""Arm the timeouts a stream let through gets from the given time (its idle bound)."""


@dataclass(slots=True)
class TailCounts:
    """The live router's tail metrics, summed over policies, backends and classes."""

    hedges: int = 0
    """``turnout_hedges_total``"""
    hedges_won: int = 0
    """``turnout_hedges_won_total``"""
    cancelled: int = 0
    """``turnout_hedges_cancelled_total``"""
    wasted_tokens: int = 0
    """``turnout_hedge_wasted_tokens_total``"""
    missed: int = 0
    """``turnout_first_token_deadlines_missed_total``"""
    extra: int = 0
    """Attempts beyond each request's first (hedges and deadline failovers)."""


@dataclass(slots=True, eq=False)
class _Request:
    race: Race[Flight, Attempt]
    waiter: Waiter
    armed: float = math.inf
    over: bool = False


class Tails:
    """Every held stream of one simulation (see the module)."""

    def __init__(self, config: RouterConfig, timers: Attempts, start: Start, cut: Cut,
                 arm: Arm) -> None:  # fmt: skip
        self.config = config
        self.memory = TailMemory()
        """Hedge budgets and measured TTFTs, as one router worker keeps them."""
        self.counts = TailCounts()
        self._timers, self._start, self._cut, self._arm = timers, start, cut, arm
        self._held: dict[Flight, tuple[_Request, Held[Flight]]] = {}
        self._duos: set[_Request] = set()

    @property
    def racing(self) -> bool:
        """Two attempts of a request are in engines: the first token of either cuts the
        other, so the engines must run event by event."""
        return bool(self._duos)

    def hold(self, f: Flight, now: float) -> bool:
        """Hold ``f``, a request's first attempt, launched at ``now``, if its class has
        ``tail`` settings and it streams; False: it is not held."""
        info, w = f.routed.info, f.waiter
        tail = self.config.tail.get(info.request_class) if info.stream else None
        if tail is None:
            return False
        cls = info.request_class
        busy = lambda a: queueing(a.backend, self._timers.queues.waiting(cls))  # noqa: E731
        idle = self.config.timeouts_for(cls).idle or _HOLD_MAX
        race: Race[Flight, Attempt] = Race(
            tail, self.memory, cls, info.prompt_tokens, w.rest, busy, idle
        )
        w.rest = []  # the race owns the rest of the ranking now
        r = _Request(race, w)
        self._held[f] = (r, race.start(f, f.backend.state.name, now))
        self._rearm(r)
        return True

    def first(self, f: Flight, now: float) -> None:
        """``f``'s engine emitted its first token at ``now``."""
        entry = self._held.get(f)
        if entry is None:
            return
        r, a = entry
        self._apply(r, r.race.content(a, now), now)

    def _due(self, r: _Request, now: float) -> None:
        r.armed = math.inf
        self._apply(r, r.race.due(now), now)

    def _apply(self, r: _Request, moves: Moves[Flight, Attempt], now: float) -> None:
        race, counts = r.race, self.counts
        for a, missed in moves.cut:
            self._drop(a.handle)
            if self._cut(a.handle, now):
                counts.missed += missed
                if race.hedged:
                    counts.cancelled += 1
                    counts.wasted_tokens += race.wasted(a.handle.chunks)
        if moves.open is not None:
            self._open(r, moves.open, moves.hedge, now)
        winner = moves.winner
        if winner is not None:
            self._won(r, winner, moves, now)
        else:
            self._rearm(r)
        if not r.over and len(race.live) > 1:
            self._duos.add(r)
        else:
            self._duos.discard(r)

    def _open(self, r: _Request, given: list[Attempt], hedge: bool, now: float) -> None:
        """Launch on the first of ``given``: an engine answers a stream's head at once."""
        race, w = r.race, r.waiter
        f = self._start(w, given[0], now)
        if f is None:
            race.open_failed()
            return
        w.failovers += 1
        self.counts.extra += 1
        if hedge:
            self.counts.hedges += 1
        moves = race.opened(f, given[0], now, failovers=0, stream=True)
        self._held[f] = (r, race.live[-1])
        self._apply(r, moves, now)

    def _won(self, r: _Request, a: Held[Flight], moves: Moves[Flight, Attempt], now: float) -> None:
        r.over = True
        self._drop(a.handle)  # the others were cut
        f = a.handle
        if f.first is None:  # let through past its grace: its idle bound applies from now
            self._arm(f, now)
            return
        for late in moves.blame:  # another backend served in time: the misses count
            late.handle.lease.failed()
        if a.hedge:
            self.counts.hedges_won += 1

    def _drop(self, f: Flight) -> None:
        self._held.pop(f, None)

    def _rearm(self, r: _Request) -> None:
        t = r.race.next_timer()
        if r.over or t == math.inf or t >= r.armed:
            return
        r.armed = t
        self._timers.at(t, lambda now: self._due(r, now), lambda: not r.over and r.armed == t)
