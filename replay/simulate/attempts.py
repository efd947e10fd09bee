"""The router between a request's plan and an engine, on the virtual clock: admission's
queues, the attempts down the plan, failover and the per-class timeouts.

The parts are the router's own: :class:`~router.control.admission.WaitQueues` with its limits
and refusals, its fair order by tenant and its room check (``WaitQueues.room``: a backend's
last ``reserve`` slots only for a tenant below its share; a failover hop looks with
:func:`~router.control.plan.first_free`, as the router's does), the plan made once (a woken
waiter looks at its own attempts; one that would find no room is passed over), the failover
budget and backoff of ``failover`` and the timeouts of ``timeouts``, as router.proxy.upstream
and relay apply them to an emulated engine: an answer that is not streamed has its headers when
it is whole, so past its deadline (``non_stream_total``, or ``total`` when smaller) the attempt
fails and the request fails over to the next backend of its plan with room (waiting in its
queue again when all are full), or gets 504 when none is left; a stream has its headers and
opening event at once, so one whose first token has not come within ``idle`` is cut (a 200 that
ends in an upstream_timeout error, no failover). A timed-out attempt blames its backend only
when another backend then answers the request (router.proxy.upstream's evidence rule).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from emulator.rank import Sequence
from replay.simulate.prompts import Piece
from replay.simulate.requests import Refused, Routed
from replay.simulate.world import Backend
from router.backends.pool import BackendLease
from router.config.model import RouterConfig
from router.control.admission import Seat, WaitQueues
from router.control.auth import tenant_shares
from router.control.fair import NOBODY, Share
from router.control.plan import Attempt, Plan, first_free

Timer = Callable[[float], None]
Alive = Callable[[], bool]
"""Whether a timer still has something to do (a void one is dropped unrun)."""


def _always() -> bool:
    return True


@dataclass(slots=True, eq=False)
class Waiter:
    """A planned request from its arrival until its answer: the attempts left, and where it
    is (waiting for room, backing off, in an engine)."""

    routed: Routed
    plan: Plan
    arrived: float
    rest: list[Attempt]
    """The plan's attempts not tried yet, best first."""
    since: float = 0.0
    """When its current wait for room began."""
    failovers: int = 0
    suspects: list[BackendLease] = field(default_factory=list)
    """Leases of attempts that timed out, blamed if another backend answers."""
    waiting: bool = False
    """In an admission queue (a deadline queued for it is void otherwise)."""
    seat: Seat = field(default_factory=Seat)
    """Its place among its tenant's requests, from its admission until :meth:`Attempts.left`."""
    share: Share = NOBODY
    """Its tenant, weight and band (:meth:`Attempts.share_of`)."""


@dataclass(slots=True, eq=False)
class Flight:
    """One attempt of a request in an engine."""

    waiter: Waiter
    seq: Sequence
    backend: Backend
    lease: BackendLease
    finish: str
    reply: Piece = (0, 0)
    first: float | None = None
    chunks: int = 0

    @property
    def routed(self) -> Routed:
        return self.waiter.routed

    @property
    def sent(self) -> float:
        """When the request arrived: its times count from there, waits included."""
        return self.waiter.arrived


Launch = Callable[[Waiter, Attempt, float], None]
"""Start ``waiter``'s attempt on its backend's engine at the given time."""
Refuse = Callable[[Waiter, Refused, float], None]
"""Answer ``waiter`` with an error at the given time (the backend it last tried, if any)."""


class Attempts:
    """Admission, attempts, failover and timeouts for one simulation (see the module)."""

    def __init__(self, config: RouterConfig, launch: Launch, refuse: Refuse) -> None:
        self.config = config
        self.queues: WaitQueues[Waiter] = WaitQueues(config.admission)
        self._shares = tenant_shares(config.api_keys)
        self._launch, self._refuse = launch, refuse
        self._timers: list[tuple[float, int, Timer, Alive]] = []
        self._keys = itertools.count()
        self._waiting = 0

    @property
    def waiting(self) -> bool:
        """A request waits for room (an answer may let it go at any moment)."""
        return self._waiting > 0

    def next_timer(self) -> float | None:
        """When the earliest timer with something to do is due (void ones are dropped)."""
        timers = self._timers
        while timers and not timers[0][3]():
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def fire(self, now: float) -> None:
        """Run the earliest timer (due at ``now``)."""
        _, _, timer, _ = heapq.heappop(self._timers)
        timer(now)

    def at(self, t: float, timer: Timer, alive: Alive = _always) -> None:
        """Run ``timer`` at ``t`` if ``alive()`` still says so then."""
        heapq.heappush(self._timers, (t, next(self._keys), timer, alive))

    def share_of(self, routed: Routed) -> Share:
        """The captured tenant's place in the queues: the weight and ``priority`` band of the
        configured key it is the tenant id of, when the config's keys can be hashed here
        (router.control.auth.tenant_shares); else weight 1 and band 0."""
        route = routed.item.record.route
        tenant = route.tenant if route is not None else None
        if tenant is None:
            return NOBODY
        return self._shares.get(tenant) or Share(tenant)

    def send(self, w: Waiter, now: float) -> None:
        """``w``'s next attempt: on the first of its attempts with room, else it waits."""
        if not self._go(w, now):
            w.since = now
            self._wait(w, now)

    def _go(self, w: Waiter, now: float) -> bool:
        """As ``Admission.take``: a first attempt looks as its tenant, a failover hop not."""
        info, share = w.routed.info, w.share
        cls = info.request_class
        first = not w.failovers
        i = self.queues.room(cls, w.rest, share, now) if first else first_free(w.rest)
        if i is None:
            return False
        if first:
            cost = (info.prompt_tokens, info.expected_output_tokens)
            self.queues.admitted(cls, share, cost, w.seat, now)
        self._launch(w, w.rest.pop(i), now)
        return True

    def left(self, w: Waiter, now: float) -> None:
        """``w`` is answered or refused: its tenant holds one slot fewer (``Admission.leave``)."""
        self.queues.left(w.seat, now)

    def _wait(self, w: Waiter, now: float, *, front: bool = False) -> None:
        cls = w.routed.info.request_class
        refusal = self.queues.refusal(cls, w.since, now, front=front)
        if refusal is not None:
            self._refuse(w, Refused(refusal.status, refusal.message), now)
            return
        self.queues.put(cls, w, w.share, front=front)
        self.queues.hold(cls, w.share, 0, now)  # seen: it shares the class while it waits
        self._waiting += 1
        w.waiting = True
        if not front:
            self.at(
                self.queues.deadline(cls, w.since), lambda t: self._expire(w, t), lambda: w.waiting
            )

    def released(self, now: float) -> None:
        """A request left a backend: the first waiter that finds room goes; those before it
        that find none keep their turn (``Admission.release``)."""
        passed: list[Waiter] = []
        while (w := self.queues.pop()) is not None:
            self.queues.discard(w.routed.info.request_class, w)  # it looks for room at once
            self._waiting -= 1
            w.waiting = False
            if self._go(w, now):
                break
            passed.append(w)
        for w in reversed(passed):
            self.queues.put(w.routed.info.request_class, w, w.share, front=True)
            self._waiting += 1
            w.waiting = True

    def _expire(self, w: Waiter, now: float) -> None:
        """``w``'s wait runs out: it looks once more, then is refused."""
        if not w.waiting:
            return
        self.queues.discard(w.routed.info.request_class, w)
        self._waiting -= 1
        w.waiting = False
        if not self._go(w, now):
            self._wait(w, now, front=True)

    def failed(self, w: Waiter, lease: BackendLease, backend: str, now: float) -> None:
        """``w``'s attempt on ``backend`` timed out before its answer: fail over after the
        backoff, or 504 when no attempt is left."""
        w.suspects.append(lease)
        f = self.config.failover
        if not w.rest or w.failovers + 1 >= f.max_attempts:
            self._refuse(w, Refused(504, f"backend {backend} timed out"), now)
            return
        backoff = (
            min(f.backoff_initial * 2 ** (w.failovers - 1), f.backoff_max) if w.failovers else 0
        )
        w.failovers += 1
        self.at(now + backoff, lambda t: self.send(w, t))

    @staticmethod
    def answered(w: Waiter) -> None:
        """Another backend answered ``w``: the attempts that timed out are blamed."""
        for lease in w.suspects:
            lease.failed()
        w.suspects.clear()
