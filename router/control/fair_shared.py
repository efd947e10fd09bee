"""The fair queues' counters shared by the workers of one router (``--workers N``).

Each worker has its own admission queues, but the service each tenant got and how many wait
in each class are the router's: the parent maps one segment before it forks, with a row per
counter (a tenant's service in a class, or a class's waiting count) and a column per worker.
A worker writes only its own column and reads a row's sum, so no lock is needed but to claim
a row for a new counter (once per counter and process: a POSIX record lock, as
router.control.quota takes). So a tenant served by one worker is the less favoured by all of
them, and a class's ``queue_size`` bounds what waits in all of them together. A worker that
dies has its waiting counts zeroed by the parent (:meth:`SharedFairness.clear`); its service
counts stay, as service given.

What each tenant holds in a class (for the reserved slots, router.control.fair.below_share)
is a second table: per class, up to :data:`TENANTS` rows, claimed in order under the lock so
that the rows in use are the first ones, each ``[key, weight, last seen, in flight per
worker...]``. Reading who shares a class reads those rows; a tenant past a full table counts
in this worker alone. A dead worker's in-flight columns are zeroed with its waiting counts.
"""

from __future__ import annotations

import logging
import mmap
import os

from policies.types import REQUEST_CLASSES
from router.control.fair import Head, Holding, LocalLedger
from router.control.quota import RecordLock, claim_row, row_key

log = logging.getLogger("router")

ROWS = 4096
TENANTS = 256
"""Tenants a class's in-flight table holds (keys beyond it count per worker)."""
_QUEUED = "\0queued"
_HEAD, _HEAD_ROW = "\0head", "\0head-row"
_BAND0 = 1000.0  # a head's band is stored as band + _BAND0 (bands are -100..100), 0: none
_KEY, _WEIGHT, _SEEN, _HELD = 0, 1, 2, 3


def _name(key: tuple[str, str | None]) -> str:
    cls, tenant = key
    return f"{cls}\0{'' if tenant is None else tenant}"


class SharedFairness:
    """The segment: make it in the parent, before forking."""

    def __init__(self, workers: int, rows: int = ROWS) -> None:
        self.workers = workers
        self._width = 1 + workers
        size = rows * self._width * 8
        self._fd = os.memfd_create("turnout-fairness", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._mem = mmap.mmap(self._fd, size)
        self._words = memoryview(self._mem).cast("d")
        held = len(REQUEST_CLASSES) * TENANTS * (_HELD + workers) * 8
        self._held_fd = os.memfd_create("turnout-held", os.MFD_CLOEXEC)
        os.ftruncate(self._held_fd, held)
        self._held_mem = mmap.mmap(self._held_fd, held)
        self._held = memoryview(self._held_mem).cast("d")
        # Only locked, never mapped: taking a backend's slot (SharedLedger.taking) has a lock
        # of its own, since a record lock taken again on one file is let go by the inner exit.
        self._take_fd = os.memfd_create("turnout-take", os.MFD_CLOEXEC)
        # A doorbell per worker: another worker rings it for a slot that this one's first
        # waiter should take (it goes before the ringer's own).
        self._bells = tuple(os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC) for _ in range(workers))

    def ledger(self, worker: int) -> SharedLedger:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of {self.workers}")
        lock = RecordLock(self._fd)
        held = HeldTable(self._held, self.workers, worker, RecordLock(self._held_fd))
        take = RecordLock(self._take_fd)
        return SharedLedger(self._words, self._width, worker, lock, held, self._bells, take)

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s waiting and in-flight counts (it died, and its requests
        with it)."""
        ledger = self.ledger(worker)
        ledger.clear_queued()
        ledger.held.clear()


class HeldTable:
    """One worker's handle on what tenants hold in each class (see the module)."""

    def __init__(self, words: memoryview[float], workers: int, worker: int, lock: RecordLock):
        self._words = words
        self._width = _HELD + workers
        self._worker = worker
        self._lock = lock
        self._rows: dict[tuple[str, str | None], int] = {}
        self._alone = LocalLedger()

    def _base(self, cls: str) -> int:
        return REQUEST_CLASSES.index(cls) * TENANTS * self._width

    def _row(self, key: tuple[str, str | None]) -> int | None:
        at = self._rows.get(key)
        if at is not None:
            return at
        mark, words, width = row_key(f"{key[0]}\0{key[1]}"), self._words, self._width
        base = self._base(key[0])
        with self._lock:
            for i in range(TENANTS):
                at = base + i * width
                if words[at + _KEY] in (mark, 0.0):
                    words[at + _KEY] = mark
                    self._rows[key] = at
                    return at
        return None  # full: this tenant counts in this worker alone

    def hold(self, key: tuple[str, str | None], weight: float, delta: int, now: float) -> None:
        at = self._row(key)
        if at is None:
            self._alone.hold(key, weight, delta, now)
            return
        words = self._words
        words[at + _WEIGHT], words[at + _SEEN] = weight, now
        words[at + _HELD + self._worker] += delta

    def holdings(self, key: tuple[str, str | None], since: float) -> tuple[int, list[Holding]]:
        at = self._row(key)
        if at is None:
            return self._alone.holdings(key, since)
        words, width, held, others = self._words, self._width, 0, []
        base = self._base(key[0])
        for row in range(base, base + TENANTS * width, width):
            if words[row + _KEY] == 0.0:
                break  # rows are claimed in order: the rest are free
            count = int(sum(words[row + _HELD : row + width]))
            if row == at:
                held = count
            elif count > 0 or words[row + _SEEN] >= since:
                others.append(Holding(words[row + _WEIGHT], count))
        return held, others

    def clear(self) -> None:
        for row in range(0, len(self._words), self._width):
            self._words[row + _HELD + self._worker] = 0.0


class SharedLedger:
    """One worker's handle: a :class:`router.control.fair.Ledger` over every worker's."""

    def __init__(
        self,
        words: memoryview[float],
        width: int,
        worker: int,
        lock: RecordLock,
        held: HeldTable,
        bells: tuple[int, ...],
        take: RecordLock,
    ) -> None:
        self.held = held
        self._take = take
        self._bells = bells
        self._words = words
        self._width = width
        self._worker = worker
        self._lock = lock
        self._rows: dict[str, int] = {}
        self._alone = LocalLedger()  # counters past a full table: this worker's own
        self._full_warned = False

    def get(self, key: tuple[str, str | None]) -> float:
        at = self._row(_name(key))
        if at is None:
            return self._alone.get(key)
        return sum(self._words[at + 1 : at + self._width])

    def add(self, key: tuple[str, str | None], amount: float) -> None:
        at = self._row(_name(key))
        if at is None:
            self._alone.add(key, amount)
        else:
            self._words[at + 1 + self._worker] += amount

    def lift(self, key: tuple[str, str | None], floor: float) -> None:
        at = self._row(_name(key))
        if at is None:
            self._alone.lift(key, floor)
            return
        total = sum(self._words[at + 1 : at + self._width])
        if total < floor:
            self._words[at + 1 + self._worker] += floor - total

    def queued(self, cls: str, own: int) -> int:
        at = self._row(cls + _QUEUED)
        if at is None:
            return own
        self._words[at + 1 + self._worker] = float(own)
        return int(sum(self._words[at + 1 : at + self._width]))

    def join(self, cls: str, own: int, bound: int) -> bool:
        at = self._row(cls + _QUEUED)
        if at is None:
            return own < bound
        mine = at + 1 + self._worker
        words = self._words
        # Under the lock: another worker's place taken between our sum and our write would
        # let both through (each worker writes its column unlocked only to hold or drop a
        # place it already has).
        with self._lock:
            others = sum(words[at + 1 : at + self._width]) - words[mine]
            if others + own >= bound:
                return False
            words[mine] = float(own + 1)
        return True

    def publish(self, cls: str, head: Head | None) -> None:
        band_at, row_at = self._row(cls + _HEAD), self._row(cls + _HEAD_ROW)
        if band_at is None or row_at is None:
            return  # a full table: this worker's waiters are woken by its own slots alone
        column = 1 + self._worker
        if head is None:
            self._words[band_at + column] = 0.0
            return
        counter = self._row(_name((cls, head[1])))
        self._words[row_at + column] = 0.0 if counter is None else float(counter + 1)
        self._words[band_at + column] = head[0] + _BAND0

    def ahead(self, cls: str, head: Head | None) -> int | None:
        best, best_rank = None, None
        if head is not None:
            best_rank = (head[0], -self.get((cls, head[1])))
        for worker, band, served in self._heads(cls):
            if best_rank is None or (band, -served) > best_rank:  # a tie stays here: no ring
                best, best_rank = worker, (band, -served)
        return best

    def floor(self, cls: str) -> float | None:
        return min((served for _, _, served in self._heads(cls)), default=None)

    def _heads(self, cls: str) -> list[tuple[int, int, float]]:
        """The other workers' first waiters in ``cls``: (worker, band, service)."""
        band_at, row_at = self._row(cls + _HEAD), self._row(cls + _HEAD_ROW)
        if band_at is None or row_at is None:
            return []
        words, width, out = self._words, self._width, []
        for worker in range(width - 1):
            band = words[band_at + 1 + worker]
            if worker == self._worker or band == 0.0:
                continue
            counter = int(words[row_at + 1 + worker])
            served = sum(words[counter : counter - 1 + width]) if counter else 0.0
            out.append((worker, int(band - _BAND0), served))
        return out

    def ring(self, worker: int) -> None:
        os.eventfd_write(self._bells[worker], 1)

    def bell(self) -> int | None:
        return self._bells[self._worker]

    def hold(self, key: tuple[str, str | None], weight: float, delta: int, now: float) -> None:
        self.held.hold(key, weight, delta, now)

    def holdings(self, key: tuple[str, str | None], since: float) -> tuple[int, list[Holding]]:
        return self.held.holdings(key, since)

    def taking(self) -> RecordLock:
        return self._take

    def clear_queued(self) -> None:
        for cls in REQUEST_CLASSES:
            for name in (_QUEUED, _HEAD):
                at = self._row(cls + name)
                if at is not None:
                    self._words[at + 1 + self._worker] = 0.0

    def _row(self, name: str) -> int | None:
        """The first word of counter ``name``'s row, claimed if new; None: the table is full."""
        at = self._rows.get(name)
        if at is not None:
            return at
        with self._lock:
            found = claim_row(self._words, self._width, name)
        if found is not None:
            self._rows[name] = found[0]
            return found[0]
        if not self._full_warned:
            rows = len(self._words) // self._width
            log.warning("fairness table full (%d counters): further ones count per worker", rows)
            self._full_warned = True
        return None
