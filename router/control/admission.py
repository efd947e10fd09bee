"""Admission control: a bounded wait per class when every backend of a plan is full.

A request whose planned backends are all at ``max_inflight`` waits in its class's queue
instead of failing at once. Admission owns that wait: it is handed the request's attempts
(router.control.plan, planned once) and gives back the first whose backend has room, taken
out of the list. Whenever a request leaves a backend the first waiter is woken and looks
again at its own attempts (interactive waiters always before batch ones, so interactive work
is served first and never starved by a batch backlog); one that finds none with room goes
back to the head of its tenant's line. Within a class, higher priority bands go first and,
within a band, the tenant served least (router.control.fair), not the first to come. A full
queue, or a wait longer than the class's ``max_wait``, answers 429 with ``Retry-After`` and
``X-Turnout-Refused`` naming why (``queue_full``, ``max_wait``; ``shed`` for a waiter of the
lowest band whose place a higher band's request took). With no ``admission`` section the
queues are empty-sized: saturation answers 429 at once (still with ``Retry-After``).

A class's ``reserve`` keeps a backend's last free slots, while several tenants share the
class, for a tenant below its weighted share of the class's slots (router.control.fair): a
tenant over it treats those slots as full, and a slot freed for it wakes the next waiter
that may take it instead. A request counts as its tenant's from its admission until its
:class:`Seat` is left (however many hops it takes).

Across the workers of a router (a shared ledger, router.control.fair_shared) each worker
publishes its first waiter per class; a slot freed in one worker goes to the router's first
waiter: when another worker's goes before its own, that worker's doorbell is rung and it wakes
its first waiter at once (:meth:`Admission.listen`). Finding a backend with room and taking
its slot are one step under the ledger's lock (:meth:`Ledger.taking`): the slot is counted at
once and the attempt's lease, opened in the same step, adopts it, so two workers cannot both
take a backend's last slot.

The queues themselves (:class:`WaitQueues`) hold no clock and no event loop, so ``replay
simulate`` runs the same queues, limits and refusals on its virtual clock.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from policies.types import REQUEST_CLASSES, RequestClass
from router.config.model import AdmissionSettings
from router.control.fair import (
    NOBODY,
    Activity,
    FairQueue,
    Head,
    Holding,
    Ledger,
    LocalLedger,
    Share,
    below_share,
)
from router.control.plan import OnBackend, first_free
from router.server.errors import RouterError

T = TypeVar("T", bound=OnBackend)
W = TypeVar("W", bound=Hashable)
Cost = tuple[int, int]
PATIENCE = 2
"""Polls a slot this worker's waiters could take is left for another worker's first waiter
(rung for it, but slow to come or unable to use it) before one of them takes it."""
FULL = "every backend planned for the request is at its in-flight limit"
"""Why a request waits (and the start of its 429 when it may not)."""


class QueueRejected(RouterError):
    """429 from admission, with ``Retry-After`` (whole seconds, at least 1) and
    ``X-Turnout-Refused: REASON``."""

    def __init__(self, message: str, retry_after: float, reason: str) -> None:
        super().__init__(
            429,
            message,
            code="rate_limit_exceeded",
            headers={
                "Retry-After": str(max(1, math.ceil(retry_after))),
                "X-Turnout-Refused": reason,
            },
        )
        self.reason = reason


@dataclass(slots=True)
class Seat:
    """A request's place among what its tenant holds in its class: taken at its first
    admission, left once when it finishes (:meth:`Admission.leave`)."""

    cls: RequestClass | None = None
    share: Share = NOBODY


class WaitQueues(Generic[W]):
    """Per-class fair queues of waiters ``W`` (router.control.fair), and when one may (go on)
    wait(ing); no clock, no I/O: the router's :class:`Admission` and the simulator each bring
    their own."""

    def __init__(self, settings: AdmissionSettings, ledger: Ledger | None = None) -> None:
        self.settings = settings
        self._ledger = ledger = ledger if ledger is not None else LocalLedger()
        self._queues: dict[RequestClass, FairQueue[W]] = {
            cls: FairQueue(cls, ledger) for cls in REQUEST_CLASSES
        }
        holds: dict[str, Callable[[str | None], bool]] = {
            cls: queue.holds for cls, queue in self._queues.items()
        }
        self._activity = Activity(ledger, lambda c: settings.for_class(c).active_window, holds)

    def waiting(self, cls: RequestClass) -> int:
        """Requests of ``cls`` waiting now."""
        return len(self._queues[cls])

    def deadline(self, cls: RequestClass, since: float) -> float:
        """When a request of ``cls`` that began to wait at ``since`` stops waiting."""
        return since + self.settings.for_class(cls).max_wait

    def refusal(
        self, cls: RequestClass, since: float, now: float, *, front: bool = False
    ) -> QueueRejected | None:
        """Why a request of ``cls`` that found no room, waiting since ``since``, may not
        wait (on) at ``now``; None: it may. ``front``: it has waited before and goes back to
        the head of its queue, so a full queue does not refuse it."""
        limits = self.settings.for_class(cls)
        retry = self.settings.retry_after
        queue = self._queues[cls]
        full = QueueRejected(f"{FULL}, and the {cls} queue is full", retry, "queue_full")
        if not front and queue.waiting() >= limits.queue_size:
            return full
        if now >= since + limits.max_wait:
            return QueueRejected(f"{FULL} for over {limits.max_wait:g} s", retry, "max_wait")
        if not front and not queue.reserve(limits.queue_size):  # the last place, atomically
            return full
        return None

    def put(
        self, cls: RequestClass, waiter: W, share: Share = NOBODY, *, front: bool = False
    ) -> None:
        """Queue ``waiter`` as ``share``: after its tenant's others, or before them (a waiter
        woken for nothing keeps its turn)."""
        self._queues[cls].put(waiter, share, front=front)

    def discard(self, cls: RequestClass, waiter: W) -> None:
        """``waiter`` leaves its queue (if it is still in it)."""
        self._queues[cls].discard(waiter)

    def pop(self) -> W | None:
        """The next waiter, interactive first, out of its queue (counted as waiting until
        put back or discarded: router.control.fair.FairQueue.pop); None when none waits."""
        for cls in REQUEST_CLASSES:
            waiter = self._queues[cls].pop()
            if waiter is not None:
                return waiter
        return None

    def queued(self) -> int:
        """Requests waiting now in every class, in the router (every worker's, if shared)."""
        return sum(queue.waiting() for queue in self._queues.values())

    def head(self, cls: RequestClass) -> Head | None:
        """Whom :meth:`pop` would take of ``cls`` (router.control.fair.FairQueue.head)."""
        return self._queues[cls].head()

    def put_back(self, waiter: W) -> None:
        """Queue a waiter :meth:`pop` took out again, with its turn (it was passed over)."""
        for queue in self._queues.values():
            if queue.put_back(waiter):
                return

    def served(self, cls: RequestClass, share: Share, prompt: int, output: int) -> None:
        """A request of ``share`` in ``cls`` was admitted: count it (router.control.fair)."""
        self._queues[cls].served(share, prompt, output)

    def room(
        self, cls: RequestClass, options: Sequence[OnBackend], share: Share, now: float
    ) -> int | None:
        """The index of the first of ``options`` whose backend has room for a request of
        ``share`` in ``cls`` at ``now``: below its ``max_inflight``, and, within its last
        ``reserve`` free slots, only if ``share``'s tenant is below its share (see the
        module); None when none has."""
        self._activity.touch((cls, share.tenant), 0, now)  # its rows are claimed here
        self._activity.sweep(now)  # first: rows of the idle are let go of before a claim
        limits = self.settings.for_class(cls)
        if limits.reserve == 0:
            return first_free(options)
        mine = None
        for i, option in enumerate(options):
            backend = option.backend
            cap = backend.limit
            free = 1 if cap is None else cap - backend.inflight
            if free <= 0:
                continue
            if cap is None or free > limits.reserve:
                return i
            if mine is None:
                since = now - limits.active_window
                mine = self._ledger.holdings((cls, share.tenant), since)
            held, others = mine
            if below_share(Holding(share.weight, held), others, free):
                return i
        return None

    def admitted(
        self, cls: RequestClass, share: Share, cost: Cost, seat: Seat | None, now: float
    ) -> None:
        """A request of ``share`` costing ``cost`` (prompt tokens, output budget) goes at
        ``now``: it is counted as served and, if ``seat`` is not yet taken, takes it."""
        self._activity.sweep(now)
        self.served(cls, share, *cost)
        if seat is not None and seat.cls is None:
            seat.cls, seat.share = cls, share
            self.hold(cls, share, 1, now)
        else:
            self._activity.touch((cls, share.tenant), 0, now)

    def left(self, seat: Seat, now: float) -> None:
        """The request of ``seat`` is over: its tenant holds one slot fewer (if it was
        admitted)."""
        if seat.cls is not None:
            self.hold(seat.cls, seat.share, -1, now)
            seat.cls = None

    def hold(self, cls: RequestClass, share: Share, delta: int, now: float) -> None:
        """``share``'s tenant holds ``delta`` more of ``cls``'s slots (0: it is seen, waiting).
        Tenants idle here past the class's ``active_window`` are let go of meanwhile
        (router.control.fair.Activity)."""
        self._activity.touch((cls, share.tenant), delta, now)
        self._activity.sweep(now)
        if self.settings.for_class(cls).reserve:
            self._ledger.hold((cls, share.tenant), share.weight, delta, now)

    def shed(self, cls: RequestClass, band: int) -> W | None:
        """A waiter of a band below ``band`` taken out of the full queue of ``cls`` for a
        request of ``band`` to take its place; None when none waits there."""
        return self._queues[cls].shed(band)


class Admission:
    """The router's admission: :class:`WaitQueues` of futures on its event loop, one per
    router app, used from the event loop only."""

    def __init__(
        self, settings: AdmissionSettings, ledger: Ledger | None = None, poll: float | None = None
    ) -> None:
        """``ledger``: the fair queues' counters (default: this process's own). ``poll``:
        while requests wait, wake the first every ``poll`` seconds to look again, for slots
        freed where no :meth:`release` is called (another router replica) or that the waiter
        another worker was rung for could not take."""
        self.settings = settings
        self._ledger = ledger if ledger is not None else LocalLedger()
        self._bell: int | None = None
        self.queues: WaitQueues[asyncio.Future[None]] = WaitQueues(settings, self._ledger)
        self._poll = poll
        self._poller: asyncio.Task[None] | None = None
        # Each waiter's look at its own options (a seated one's WaitQueues.room, bound to
        # them): a release passes over one that would find none.
        self._rooms: dict[asyncio.Future[None], Callable[[float], int | None]] = {}

    async def _polling(self, every: float) -> None:
        stalled = 0
        while any(self.queues.waiting(cls) for cls in REQUEST_CLASSES):
            await asyncio.sleep(every)
            stalled = self._look(stalled)
        self._poller = None

    def _look(self, stalled: int) -> int:
        """A poll's look for a slot freed unseen: this worker's first waiter that may take
        one is woken, unless another worker's goes first, which is left :data:`PATIENCE`
        periods to take it. Returns the periods it has been left so far."""
        if self._ahead() is None or stalled >= PATIENCE:
            self._wake()
            return 0
        now = time.monotonic()
        return stalled + 1 if any(room(now) is not None for room in self._rooms.values()) else 0

    def waiting(self, cls: RequestClass) -> int:
        """Requests of ``cls`` waiting now."""
        return self.queues.waiting(cls)

    def taking(self) -> AbstractContextManager[object]:
        """The lock under which a backend with room is found and its slot taken (in every
        worker of the router): a grant changed under it changes between two admissions."""
        return self._ledger.taking()

    async def take(
        self,
        cls: RequestClass,
        options: list[T],
        share: Share = NOBODY,
        cost: Cost = (0, 0),
        seat: Seat | None = None,
    ) -> T:
        """The first of ``options`` whose backend has room, taken out of the list; while none
        has, wait in ``cls``'s queue as ``share`` (see the module). ``cost``: the request's
        prompt tokens and output budget, its service once admitted. ``seat``: the request's
        place among its tenant's (taken here, if not yet; without one, a further hop of a
        request already seated, the reserve does not apply).

        Raises :class:`QueueRejected` when the queue is full or the wait runs out, or when
        the request, waiting in the lowest band, is shed for one of a higher band.
        """
        queues = self.queues
        since: float | None = None
        front = False
        while True:
            now = time.monotonic()
            with self._ledger.taking():  # another worker's look waits until the slot is taken
                i = first_free(options) if seat is None else queues.room(cls, options, share, now)
                if i is not None:
                    backend = options[i].backend
                    backend.claim()  # the attempt's lease, opened in this step, adopts it
            if i is not None:
                asyncio.get_running_loop().call_soon(backend.drop_claims)
                queues.admitted(cls, share, cost, seat, now)
                return options.pop(i)
            if since is None and options:  # asks its router for more of the fleet's slots
                options[0].backend.fleet.turned_away()
            since = now if since is None else since
            refusal = queues.refusal(cls, since, now, front=front)
            if refusal is not None and refusal.reason == "queue_full":
                shed = queues.shed(cls, share.band)
                if shed is not None and not shed.done():
                    message = f"{FULL}; shed for a request of a higher priority"
                    shed.set_exception(QueueRejected(message, self.settings.retry_after, "shed"))
                    refusal = None
            if refusal is not None:
                raise refusal
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            queues.put(cls, waiter, share, front=front)
            queues.hold(cls, share, 0, now)  # seen: it shares the class while it waits
            if seat is not None:
                self._rooms[waiter] = partial(queues.room, cls, options, share)
            else:
                self._rooms[waiter] = partial(_first_free, options)
            if self._poll is not None and self._poller is None:
                self._poller = asyncio.create_task(self._polling(self._poll))
            try:
                async with asyncio.timeout_at(_loop_time(queues.deadline(cls, since))):
                    await waiter
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.release()  # woken, then the client left: pass the turn on
                raise
            finally:
                if not waiter.done():
                    waiter.cancel()
                queues.discard(cls, waiter)
                self._rooms.pop(waiter, None)
            front = True

    def leave(self, seat: Seat) -> None:
        """The request of ``seat`` is over: its tenant holds one slot fewer (if it was
        admitted), and a waiter may take the slot."""
        self.queues.left(seat, time.monotonic())
        self.release()

    def release(self) -> None:
        """A backend slot may have freed up: it goes to the router's first waiter,
        interactive first; when another worker's goes before this one's, that worker is
        rung to wake it."""
        other = self._ahead()
        if other is not None:
            self._ledger.ring(other)
        else:
            self._wake()

    def _ahead(self) -> int | None:
        """The worker whose first waiter goes before every one of this worker's, if
        another's does (interactive first)."""
        for cls in REQUEST_CLASSES:
            head = self.queues.head(cls)
            other = self._ledger.ahead(cls, head)
            if other is not None or head is not None:
                return other
        return None

    def _wake(self) -> bool:
        """Wake this process's first waiter that may take a slot; those passed over (a
        reserved slot is not theirs) keep their turn. False: none was woken."""
        passed: list[asyncio.Future[None]] = []
        now = time.monotonic()
        woken = False
        while (waiter := self.queues.pop()) is not None:
            if waiter.done():
                continue
            room = self._rooms.get(waiter)
            if room is None or room(now) is not None:  # None: gone meanwhile
                waiter.set_result(None)
                woken = True
                break
            passed.append(waiter)
        for waiter in reversed(passed):
            self.queues.put_back(waiter)
        return woken

    def listen(self) -> None:
        """Wake a waiter here whenever another worker rings (see :meth:`release`); on the
        event loop, until :meth:`close`."""
        bell = self._ledger.bell()
        if bell is not None:
            asyncio.get_running_loop().add_reader(bell, self._rung, bell)
            self._bell = bell

    def close(self) -> None:
        if self._bell is not None:
            asyncio.get_running_loop().remove_reader(self._bell)
            self._bell = None

    def _rung(self, bell: int) -> None:
        try:
            slots = os.eventfd_read(bell)
        except BlockingIOError:  # another reader of a shared counter took it
            return
        for _ in range(slots):
            if not self._wake():
                return


def _first_free(options: Sequence[OnBackend], now: float) -> int | None:
    return first_free(options)


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
