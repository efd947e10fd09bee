"""Who goes first among one class's waiters: priority bands, then fair shares by tenant.

A class's admission queue (router.control.admission) holds its waiters here. Waiters of a
higher ``priority`` band (an API key's ``priority``; callers without a key are band 0) go
before any of a lower one. Within a band, the tenant (API key, or every keyless caller as
one) that has been served least goes first, and each tenant's own waiters keep their order:
the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language Models" (OSDI
2024). Each tenant of a class has a counter of the service it was given, in weighted tokens:
every request of the class that is admitted, whether it waited or not, adds its prompt
tokens plus :data:`OUTPUT_WEIGHT` times its output budget, divided by the key's ``weight``
(a key of weight 2 gets twice the share of one of weight 1). A tenant that starts waiting
has its counter lifted to the smallest counter among those already waiting (of other
workers, their first waiters'; to the last served one's when none is), so credit is not
saved up while idle: a tenant back after an hour does not get an hour's worth of requests
ahead of everyone.

While tenants share a class, a backend's last ``reserve`` free slots (the class's
``admission`` setting) go only to a tenant holding fewer of the class's requests in flight
than its weighted share (:func:`below_share`), so a light tenant arriving beside a flood finds
a slot free rather than waiting for one of the flood's to end. A tenant counts as sharing the
class while it has a request in flight or waiting there, and for ``active_window`` seconds
after; alone, a tenant may take every slot.

The lowest band is sheddable: when a class's queue is full, a request of a higher band takes
the place of the youngest waiter of the lowest band waiting, which is refused (429 with
``X-Turnout-Refused: shed``), rather than being refused itself.

Pure data: no clock, no I/O, no event loop; counters live in a :class:`Ledger`, this process's
own or one the router's workers share (router.control.fair_shared).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

W = TypeVar("W", bound=Hashable)
OUTPUT_WEIGHT = 2.0
"""An output token costs the engine about twice an input one (the paper's weights, 1 and 2)."""


@dataclass(frozen=True, slots=True)
class Share:
    """Who a waiter is: its tenant (None: callers without a key), band and weight."""

    tenant: str | None = None
    band: int = 0
    weight: float = 1.0

    def cost(self, prompt_tokens: int, output_tokens: int) -> float:
        """What serving a request of ``prompt_tokens`` and ``output_tokens`` adds."""
        return (prompt_tokens + OUTPUT_WEIGHT * output_tokens) / self.weight


NOBODY = Share()
Head = tuple[int, str | None]
"""A queue's first waiter: its band and tenant."""


@dataclass(frozen=True, slots=True)
class Holding:
    """A tenant's weight and its requests in flight in a class (router-wide)."""

    weight: float
    held: int


def below_share(me: Holding, others: Iterable[Holding], free: int) -> bool:
    """Whether a tenant holding ``me`` may take one of a backend's last reserved slots (it has
    ``free`` left), beside the ``others`` sharing the class: it holds fewer than its weighted
    share of the slots the class holds plus those free. Alone, it always may."""
    weights, slots = me.weight, me.held + free
    for other in others:
        weights += other.weight
        slots += other.held
    return me.held < slots * me.weight / weights


class Ledger(Protocol):
    """Each tenant's counter, per class (``key`` is ``(class, tenant)``)."""

    def get(self, key: tuple[str, str | None]) -> float: ...

    def add(self, key: tuple[str, str | None], amount: float) -> None: ...

    def lift(self, key: tuple[str, str | None], floor: float) -> None:
        """Raise the counter to ``floor`` if below it."""

    def queued(self, cls: str, own: int) -> int:
        """Record that ``own`` of ``cls`` wait here; how many wait in the router."""

    def join(self, cls: str, own: int, bound: int) -> bool:
        """Hold a place for one more waiter of ``cls`` here (``own`` wait here now) if fewer
        than ``bound`` wait in the router; False: the queue is full. Checking and holding are
        one step, so two workers cannot both take the last place."""

    def publish(self, cls: str, head: Head | None) -> None:
        """The waiter this process would wake first in ``cls`` now (None: none waits)."""

    def ahead(self, cls: str, head: Head | None) -> int | None:
        """The worker whose first waiter in ``cls`` goes before ``head`` (this process's),
        if another's does; it is told with :meth:`ring`."""

    def floor(self, cls: str) -> float | None:
        """The smallest service among the other workers' first waiters in ``cls`` (None:
        none waits there), which a tenant starting to wait is lifted to as well."""

    def ring(self, worker: int) -> None:
        """Tell ``worker`` that a slot freed for its first waiter."""

    def bell(self) -> int | None:
        """The descriptor that is readable when another worker rang this one (None: alone)."""

    def hold(self, key: tuple[str, str | None], weight: float, delta: int, now: float) -> None:
        """The tenant of ``key`` (of ``weight``) has ``delta`` more requests in flight in the
        class, or begins to wait there (``delta`` 0), at ``now``."""

    def holdings(self, key: tuple[str, str | None], since: float) -> tuple[int, list[Holding]]:
        """The requests ``key``'s tenant has in flight in the class, and the others sharing
        it: holding some, or seen at ``since`` or later."""

    def taking(self) -> AbstractContextManager[object]:
        """Held while a backend's room is looked at and a slot there taken, so that two
        workers cannot both take its last slot (router.control.admission)."""

    def release(self, key: tuple[str, str | None]) -> None:
        """This process is done with ``key``'s tenant for now (idle here past the class's
        ``active_window``, with nothing in flight or waiting here: :class:`Activity`): its
        counters may go once no process uses them, and start afresh when it is back."""


class LocalLedger:
    """Counters in this process's memory (bounded by the configured keys: one per tenant)."""

    def __init__(self) -> None:
        self._counters: dict[tuple[str, str | None], float] = {}
        # per class, tenant -> [weight, last seen, in flight]
        self._held: dict[str, dict[str | None, list[float]]] = {}

    def get(self, key: tuple[str, str | None]) -> float:
        return self._counters.get(key, 0.0)

    def add(self, key: tuple[str, str | None], amount: float) -> None:
        self._counters[key] = self._counters.get(key, 0.0) + amount

    def lift(self, key: tuple[str, str | None], floor: float) -> None:
        if self._counters.get(key, 0.0) < floor:
            self._counters[key] = floor

    def queued(self, cls: str, own: int) -> int:
        return own

    def join(self, cls: str, own: int, bound: int) -> bool:
        return own < bound

    def publish(self, cls: str, head: Head | None) -> None:
        pass  # one process: no other worker reads it

    def ahead(self, cls: str, head: Head | None) -> int | None:
        return None

    def floor(self, cls: str) -> float | None:
        return None

    def ring(self, worker: int) -> None:
        raise ValueError("one process has no other worker to ring")

    def bell(self) -> int | None:
        return None

    def hold(self, key: tuple[str, str | None], weight: float, delta: int, now: float) -> None:
        cls, tenant = key
        row = self._held.setdefault(cls, {}).setdefault(tenant, [weight, now, 0.0])
        row[0], row[1], row[2] = weight, now, row[2] + delta

    def taking(self) -> AbstractContextManager[object]:
        return nullcontext()  # one process: its event loop does one take at a time

    def release(self, key: tuple[str, str | None]) -> None:
        self._counters.pop(key, None)
        cls, tenant = key
        held = self._held.get(cls)
        if held is not None:
            held.pop(tenant, None)

    def holdings(self, key: tuple[str, str | None], since: float) -> tuple[int, list[Holding]]:
        cls, me = key
        held, others = 0, []
        for tenant, (weight, seen, count) in self._held.get(cls, {}).items():
            if tenant == me:
                held = int(count)
            elif count > 0 or seen >= since:
                others.append(Holding(weight, int(count)))
        return held, others


SWEEP = 1.0
"""How often, at most, a process looks for tenants to let go of (:class:`Activity`), in the
admission's clock's seconds."""


class Activity:
    """The tenants this process has counted in each class lately: how many of their requests
    hold a seat here and when it last saw them. A tenant idle here longer than its class's
    ``active_window``, holding nothing and waiting for nothing here, is let go of
    (:meth:`Ledger.release`), so the counters kept are the active tenants'. Its service is
    forgotten with it: back, it starts at the least served waiter's (the lift when it
    waits), as a tenant back after a pause does anyway."""

    def __init__(
        self,
        ledger: Ledger,
        window: Callable[[str], float],
        holds: Mapping[str, Callable[[str | None], bool]],
    ) -> None:
        """``window``: a class's ``active_window``; ``holds``: per class, whether a tenant
        waits there here (:meth:`FairQueue.holds`)."""
        self._ledger = ledger
        self._window = window
        self._holds = holds
        self._seen: dict[tuple[str, str | None], list[float]] = {}  # key -> [seats, when]
        self._next = 0.0

    def touch(self, key: tuple[str, str | None], seats: int, now: float) -> None:
        """``key``'s tenant was seen at ``now``, with ``seats`` more held here."""
        row = self._seen.get(key)
        if row is None:
            self._seen[key] = [float(seats), now]
        else:
            row[0] += seats
            row[1] = now

    def sweep(self, now: float) -> None:
        """Let go of the tenants idle past their class's window (at most every
        :data:`SWEEP` seconds)."""
        if now < self._next:
            return
        self._next = now + SWEEP
        idle = [
            key
            for key, (seats, when) in self._seen.items()
            if seats <= 0 and when < now - self._window(key[0]) and not self._holds[key[0]](key[1])
        ]
        for key in idle:
            del self._seen[key]
            self._ledger.release(key)


class FairQueue(Generic[W]):
    """One class's waiters, by band, then least served tenant, then arrival."""

    def __init__(self, cls: str, ledger: Ledger) -> None:
        self._cls = cls
        self._ledger = ledger
        self._bands: dict[int, dict[str | None, deque[W]]] = {}
        self._where: dict[W, Share] = {}
        # Taken out by pop() to look for room, and not yet put back or gone: still waiting
        # for the router's count, or another worker could fill its place meanwhile.
        self._woken: dict[W, Share] = {}
        self._last = 0.0  # the counter of the tenant served last

    def __len__(self) -> int:
        return len(self._where)

    def waiting(self) -> int:
        """How many wait in this class in the router (every worker's queue, if shared)."""
        return self._ledger.queued(self._cls, self._count())

    def _count(self) -> int:
        return len(self._where) + len(self._woken)

    def reserve(self, bound: int) -> bool:
        """Whether one more may wait (fewer than ``bound`` in the router), its place held
        until :meth:`put` takes it."""
        return self._ledger.join(self._cls, self._count(), bound)

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._where

    def holds(self, tenant: str | None) -> bool:
        """Whether a waiter of ``tenant`` is here (queued, or woken to look for room)."""
        waiting = (tenant in tenants for tenants in self._bands.values())
        return any(waiting) or any(s.tenant == tenant for s in self._woken.values())

    def put(self, waiter: W, share: Share = NOBODY, *, front: bool = False) -> None:
        """Queue ``waiter``: after its tenant's others, or before them (a waiter woken for
        nothing keeps its turn)."""
        self._woken.pop(waiter, None)
        tenants = self._bands.setdefault(share.band, {})
        own = tenants.get(share.tenant)
        if own is None:  # starts waiting: no credit saved up meanwhile
            waiting = [self._ledger.get((self._cls, t)) for t in tenants]
            elsewhere = self._ledger.floor(self._cls)  # the router's, not this worker's alone
            if elsewhere is not None:
                waiting.append(elsewhere)
            self._ledger.lift((self._cls, share.tenant), min(waiting, default=self._last))
            own = tenants[share.tenant] = deque()
        own.appendleft(waiter) if front else own.append(waiter)
        self._where[waiter] = share
        self._changed()

    def discard(self, waiter: W) -> None:
        woken = self._woken.pop(waiter, None) is not None
        share = self._where.pop(waiter, None)
        if share is None:
            if woken:
                self._changed()
            return
        tenants = self._bands[share.band]
        own = tenants[share.tenant]
        own.remove(waiter)
        if not own:
            del tenants[share.tenant]
            if not tenants:
                del self._bands[share.band]
        self._changed()

    def _changed(self) -> None:
        self._ledger.queued(self._cls, self._count())
        self._ledger.publish(self._cls, self.head())

    def head(self) -> Head | None:
        """Whom :meth:`pop` would take: the highest band's least served tenant (ties: the
        one waiting longest); None when none waits."""
        if not self._bands:
            return None
        band = max(self._bands)
        ledger, cls = self._ledger, self._cls
        return band, min(self._bands[band], key=lambda t: ledger.get((cls, t)))

    def pop(self) -> W | None:
        """The next waiter out of the queue (:meth:`head`'s first). It still counts as
        waiting until it is put back or discarded, whichever its owner does once it has
        looked for room."""
        head = self.head()
        if head is None:
            return None
        band, tenant = head
        waiter = self._bands[band][tenant][0]
        self._last = self._ledger.get((self._cls, tenant))
        share = self._where[waiter]
        self.discard(waiter)
        self._woken[waiter] = share  # counted until put back or discarded
        self._ledger.queued(self._cls, self._count())
        return waiter

    def put_back(self, waiter: W) -> bool:
        """Queue a waiter :meth:`pop` took out again, at the head of its tenant's line, as
        it was; False if it was not taken out."""
        share = self._woken.get(waiter)
        if share is None:
            return False
        self.put(waiter, share, front=True)
        return True

    def served(self, share: Share, prompt_tokens: int, output_tokens: int) -> None:
        """A request of ``share`` was admitted (waited or not): count its service."""
        self._ledger.add((self._cls, share.tenant), share.cost(prompt_tokens, output_tokens))
        if self._bands:  # who goes first may have changed
            self._ledger.publish(self._cls, self.head())

    def shed(self, band: int) -> W | None:
        """Take out and return the youngest waiter of the lowest band waiting, if that band is
        below ``band`` (a newcomer of ``band`` takes its place); None when there is none."""
        if not self._bands:
            return None
        lowest = min(self._bands)
        if lowest >= band:
            return None
        tenants = self._bands[lowest]
        # The most served tenant's youngest: the one fairness would have served last.
        ledger, cls = self._ledger, self._cls
        tenant = max(tenants, key=lambda t: ledger.get((cls, t)))
        waiter = tenants[tenant][-1]
        self.discard(waiter)
        return waiter


def engine_priority(policy_priority: int | None, band: int) -> int | None:
    """The ``priority`` field for an engine that schedules by it (vLLM: lower first): the
    policy's (say, spill's 10 for a spilled request), moved earlier by the key's band."""
    if band == 0:
        return policy_priority
    return (policy_priority or 0) - band
