"""The tail defences' decisions for one held stream: which attempt is cut, when another goes
(a hedge or a failover), which one wins and what a miss counts against (router.config.tail).

A :class:`Race` owns no connection and reads no clock: its driver tells it the time with each
call and carries out the :class:`Moves` it returns. The live router drives it with sockets
and asyncio timers (router.proxy.tail), ``replay simulate`` with engine models and timers in
virtual time (replay.simulate.tail), so both make the same decisions from the same events.

The rules (docs/router.md, "Stragglers"):

- An attempt with no content by its deadline (from its send: ``first_token_timeout``, or the
  ``auto`` one from the backend's measured P99 TTFT, :class:`~router.control.tailstate.
  TailMemory`) is cut while another attempt is live. Otherwise it is marked late and the rest
  of the ranking is opened from its first backend with room; the late one is cut once that
  opening answered (if it fails, the late one stays). No failover goes to a backend that
  queues (:func:`queueing`): under saturation a late token is the queue's.
- The last attempt is never cut: past ``last_attempt_grace`` times its deadline it wins as it
  is, so a slow but valid answer is never a 504.
- A hedge: after the hedge delay with no content, if the class's budget allows (it empties
  while the next backend queues) and the prompt is short enough, one copy goes down the rest.
- The first attempt with content wins; every other is cut. Only then do the attempts cut at
  their deadline count against their backends (:attr:`Moves.blame`): another backend served
  the request in time (the breaker's evidence rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from router.backends.pool import BackendState
from router.config.tail import TailSettings
from router.control.plan import OnBackend, first_free
from router.control.tailstate import HedgeBudget, TailMemory

H = TypeVar("H")
"""The driver's own attempt (an open connection, an engine's sequence)."""
T = TypeVar("T", bound=OnBackend)
"""An entry of the ranking (an upstream target, a planned attempt)."""


def queueing(backend: BackendState, class_waiting: int) -> bool:
    """Whether another attempt on ``backend`` would only wait: requests of the class wait for
    admission (``class_waiting``), or the backend is at its ``max_inflight`` (or its
    router's grant of it), or its engine last reported requests waiting."""
    cap = backend.limit
    full = cap is not None and backend.inflight >= cap
    waiting = backend.load.waiting if backend.load is not None else None
    return class_waiting > 0 or full or bool(waiting)


@dataclass(slots=True, eq=False)
class Held(Generic[H]):
    """One attempt of the race, from its send until it wins or is cut."""

    handle: H
    backend: str
    sent: float
    deadline: float
    hedge: bool
    graced: bool = False
    late: bool = False
    """Past its deadline, kept until a failover's attempt answers."""


@dataclass(slots=True)
class Moves(Generic[H, T]):
    """What the driver does now, in this order: cut, open, then finish with the winner."""

    cut: list[tuple[Held[H], bool]] = field(default_factory=list)
    """Attempts to cut (close, free the engine's slot), each with whether it missed its
    deadline (``turnout_first_token_deadlines_missed_total``)."""
    open: list[T] | None = None
    """Open the first of these that answers, failing over down them; report back with
    :meth:`Race.opened` or :meth:`Race.open_failed`."""
    hedge: bool = False
    """The opening is a hedge (``turnout_hedges_total`` when it answers)."""
    winner: Held[H] | None = None
    blame: list[Held[H]] = field(default_factory=list)
    """Cut attempts whose miss now counts against their backend (their lease's ``failed``)."""


class Race(Generic[H, T]):
    """One held stream's attempts and the decisions about them (see the module)."""

    def __init__(
        self,
        tail: TailSettings,
        memory: TailMemory,
        cls: str,
        prompt_tokens: int,
        rest: Sequence[T],
        queueing: Callable[[T], bool],
        hold_max: float,
    ) -> None:
        """``rest``: the ranking after the first attempt; ``queueing``: whether an attempt on
        a target would only wait (:func:`queueing` for its backend); ``hold_max``: the
        longest an attempt is held without a deadline (the class's idle timeout)."""
        self.tail, self.memory, self.cls = tail, memory, cls
        self.prompt_tokens = prompt_tokens
        self.rest: list[T] = list(rest)
        """The ranking's entries no attempt or opening has gone to yet."""
        self._queueing = queueing
        self.hold_max = hold_max
        self.live: list[Held[H]] = []
        self.opening = False
        """An opening is under way (its driver reports back)."""
        self.hedged = False
        """A hedge went: every attempt cut from now on is counted as the hedge's waste."""
        self.attempts = 1
        self._opening_hedge = False
        self._given: list[T] = []
        self._cut_late: list[Held[H]] = []
        self._hedge_at = math.inf
        self._budget: HedgeBudget | None = None

    def start(self, handle: H, backend: str, sent: float) -> Held[H]:
        """The first attempt, sent at ``sent``, answered with a stream: the race begins."""
        hedge = self.tail.hedge
        if hedge is not None:
            self._budget = self.memory.budget(self.cls, hedge.max_fraction)
            self._budget.earn()
            self._hedge_at = self._hedge_time(backend, sent)
        return self._add(handle, backend, sent, hedge=False)

    def next_timer(self) -> float:
        """When :meth:`due` next has something to decide (``math.inf``: nothing)."""
        return min([self._hedge_at, *(a.deadline for a in self.live if not a.late)])

    def due(self, now: float) -> Moves[H, T]:
        """What the clock decides at ``now``: a hedge, cuts at deadlines, a failover, or a
        last attempt let through past its grace."""
        moves: Moves[H, T] = Moves()
        budget = self._budget
        if self._hedge_at <= now and not self.opening and budget is not None and self.rest:
            self._hedge_at = math.inf
            if budget.spend(self._queueing(self.rest[0])):
                moves.open = self._open(hedge=True)
                moves.hedge = self.hedged = moves.open is not None
        for a in list(self.live):
            if a.deadline > now or a.late:
                continue
            if any(x is not a and not x.late for x in self.live):
                self._cut(a, moves, missed=True)
            elif self.opening or self._may_fail_over():
                a.late = True  # cut once a failover's attempt has answered
            elif not a.graced:
                a.graced = True
                a.deadline = a.sent + (a.deadline - a.sent) * self.tail.last_attempt_grace
            else:
                moves.winner = a  # however late: never a 504 for a valid answer
                return moves
        if not self.opening and self.rest and any(a.late for a in self.live):
            moves.open = self._open(hedge=False)
        return moves

    def opened(
        self, handle: H, target: T, now: float, *, failovers: int, stream: bool
    ) -> Moves[H, T]:
        """The opening answered on ``target`` (after ``failovers`` failed attempts of its
        own) at ``now``; ``stream``: an answer to hold, else it wins at once."""
        self.opening = False
        given = self._given
        at = next(i for i, t in enumerate(given) if t is target)
        self.rest = given[at + 1 :]
        self.attempts += failovers + 1
        a = self._add(handle, target.backend.name, now, hedge=self._opening_hedge)
        moves: Moves[H, T] = Moves()
        if not stream:
            moves.winner = a
            return moves
        for late in [x for x in self.live if x.late]:
            self._cut(late, moves, missed=True)
        return moves

    def open_failed(self) -> None:
        """The opening found no backend to answer: the attempts left stay, and the last of
        them gets its grace."""
        self.opening = False
        for a in self.live:
            a.late = False

    def content(self, a: Held[H], first: float) -> Moves[H, T]:
        """``a``'s first content token came at ``first``: it wins, every other is cut."""
        self.memory.window(self.cls, a.backend).add(first - a.sent)
        moves: Moves[H, T] = Moves(winner=a)
        for other in list(self.live):
            if other is not a:
                self._cut(other, moves)
        moves.blame = list(self._cut_late)
        return moves

    def ended(self, a: Held[H], *, broke: bool) -> Moves[H, T]:
        """``a``'s answer is not to be held before any content (it ended, is not a stream,
        grew too large, or ``broke`` off): it wins, as it is, unless it broke while another
        attempt is live; then it is cut (and the break is its backend's, for the driver)."""
        moves: Moves[H, T] = Moves()
        if broke and len(self.live) > 1:
            self._cut(a, moves)
        else:
            moves.winner = a
        return moves

    def wasted(self, content_events: int) -> int:
        """The tokens a cut attempt of a hedged request wasted: its prompt, and what it had
        streamed (0 when no hedge went)."""
        return self.prompt_tokens + content_events if self.hedged else 0

    # -- inside ---------------------------------------------------------------------------

    def _add(self, handle: H, backend: str, sent: float, *, hedge: bool) -> Held[H]:
        limit = self.memory.deadline(self.tail, self.cls, backend)
        deadline = sent + (self.hold_max if limit is None else limit)
        a = Held(handle, backend, sent, deadline, hedge)
        self.live.append(a)
        return a

    def _open(self, *, hedge: bool) -> list[T] | None:
        """The rest of the ranking from its first entry with room (None: every one is full)."""
        at = first_free(self.rest)
        if at is None:
            return None
        self._given, self.rest = self.rest[at:], []
        self.opening, self._opening_hedge = True, hedge
        return list(self._given)

    def _may_fail_over(self) -> bool:
        at = first_free(self.rest)
        return at is not None and not self._queueing(self.rest[at])

    def _cut(self, a: Held[H], moves: Moves[H, T], *, missed: bool = False) -> None:
        if a in self.live:
            self.live.remove(a)
        if missed:
            self._cut_late.append(a)
        moves.cut.append((a, missed))

    def _hedge_time(self, backend: str, sent: float) -> float:
        hedge = self.tail.hedge
        if hedge is None or not self.rest:
            return math.inf
        if hedge.max_prompt_tokens is not None and self.prompt_tokens > hedge.max_prompt_tokens:
            return math.inf
        delay = self.memory.hedge_delay(self.tail, self.cls, backend)
        return math.inf if delay is None else sent + delay
