"""The fair queues' counters shared by the workers of one router (``--workers N``).

Each worker has its own admission queues, but the service each tenant got and how many wait
in each class are the router's: the parent maps one segment before it forks, with a row per
counter (a tenant's service in a class, or a class's waiting count) and a column per worker.
A worker writes only its own column and reads a row's sum, so no lock is needed but to claim
a row for a new counter (once per counter and process: a POSIX record lock, as
router.control.quota takes) and to let go of it. So a tenant served by one worker is the
less favoured by all of them, and a class's ``queue_size`` bounds what waits in all of them
together. A worker that dies has its waiting counts zeroed by the parent
(:meth:`SharedFairness.clear`); its service counts stay, as service given.

What each tenant holds in a class (for the reserved slots, router.control.fair.below_share)
is a second table: per class, up to :data:`TENANTS` rows, claimed in order under the lock so
that the rows in use are the first ones, each ``[key, weight, last seen, in flight per
worker..., in use per worker...]``. Reading who shares a class reads those rows up to the
first never claimed, passing over freed ones; a tenant past a full table counts in this
worker alone. A dead worker's in-flight columns are zeroed with its waiting counts.

Rows are let go of, so both tables hold the tenants active now rather than every key a
reload ever added: each row has a column per worker saying it uses the row (set when it
claims or finds the row, under the lock). A worker writes only rows it uses, and stops
using a tenant's rows once the tenant has been idle there past the class's
``active_window`` with nothing in flight or waiting there (router.control.fair.Activity,
:meth:`SharedLedger.release`). The last worker to stop frees the row, under the lock: its
key becomes :data:`~router.control.quota.FREED` first (readers pass over it), and a later
claim reuses it. So no worker writes a row after it was freed, and a reader sees a row
either whole or freed. Such a tenant held nothing and had not been seen within the window,
so no reader counted it as sharing the class; its service goes with its row (the lift when
it next waits puts it level with the least served). A dead worker stops using every row.
"""

from __future__ import annotations

import logging
import mmap
import os

from policies.types import REQUEST_CLASSES
from router.control.fair import Head, Holding, LocalLedger
from router.control.quota import FREED, RecordLock, claim_row, row_key

log = logging.getLogger("router")

ROWS = 4096
TENANTS = 256
"""Tenants a class's in-flight table holds (keys beyond it count per worker)."""
_QUEUED = "\0queued"
_HEAD, _HEAD_ROW = "\0head", "\0head-row"
_BAND0 = 1000.0  # a head's band is stored as band + _BAND0 (bands are -100..100), 0: none
_KEY, _WEIGHT, _SEEN, _HELD = 0, 1, 2, 3
_ALONE = -1
"""A worker's cached row for a key that found the table full: it counts alone here until it
is let go of (so what it holds is counted where it was added)."""


def _let_go(
    words: memoryview[float],
    at: int,
    use: int,
    users: tuple[int, int],
    counts: tuple[int, int] = (0, 0),
) -> None:
    """This worker stops using the row at word ``at`` (``use``: its flag there); it is freed
    if no worker uses it (every worker's flags: words ``users``, from and to, in the row) and
    nothing is counted in it (words ``counts``). The caller holds the table's lock."""
    words[at + use] = 0.0
    if any(words[at + users[0] : at + users[1]]) or any(words[at + counts[0] : at + counts[1]]):
        return
    words[at] = FREED  # first: a reader passes over it from here on


def _name(key: tuple[str, str | None]) -> str:
    cls, tenant = key
    return f"{cls}\0{'' if tenant is None else tenant}"


class SharedFairness:
    """The segment: make it in the parent, before forking."""

    def __init__(self, workers: int, rows: int = ROWS) -> None:
        self.workers = workers
        self._width = 1 + 2 * workers  # key, a count per worker, an in-use flag per worker
        size = rows * self._width * 8
        self._fd = os.memfd_create("turnout-fairness", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._mem = mmap.mmap(self._fd, size)
        self._words = memoryview(self._mem).cast("d")
        held = len(REQUEST_CLASSES) * TENANTS * (_HELD + 2 * workers) * 8
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
        return SharedLedger(self._words, self.workers, worker, lock, held, self._bells, take)

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s waiting and in-flight counts (it died, and its requests
        with it)."""
        ledger = self.ledger(worker)
        ledger.clear_queued()
        ledger.held.clear()
        ledger.clear_uses()


class HeldTable:
    """One worker's handle on what tenants hold in each class (see the module)."""

    def __init__(self, words: memoryview[float], workers: int, worker: int, lock: RecordLock):
        self._words = words
        self._workers = workers
        self._width = _HELD + 2 * workers
        self._worker = worker
        self._use = _HELD + workers + worker  # this worker's in-use flag in a row
        self._lock = lock
        self._rows: dict[tuple[str, str | None], int] = {}
        self._alone = LocalLedger()

    def _base(self, cls: str) -> int:
        return REQUEST_CLASSES.index(cls) * TENANTS * self._width

    def _row(self, key: tuple[str, str | None]) -> int | None:
        at = self._rows.get(key)
        if at is not None:
            return None if at == _ALONE else at
        mark, words, width = row_key(f"{key[0]}\0{key[1]}"), self._words, self._width
        base = self._base(key[0])
        with self._lock:
            free = None  # the first freed row: the tenant's, if it has none further on
            for row in range(base, base + TENANTS * width, width):
                held = words[row + _KEY]
                if held == mark:
                    free = row
                    break
                if held == FREED and free is None:
                    free = row
                elif held == 0.0:
                    free = row if free is None else free
                    break
            if free is None:
                self._rows[key] = _ALONE  # full: this tenant counts in this worker alone
                return None
            if words[free + _KEY] != mark:
                words[free + 1 : free + width] = memoryview(bytearray((width - 1) * 8)).cast("d")
                words[free + _KEY] = mark  # last: a reader sees the key with zeroed figures
            words[free + self._use] = 1.0
        self._rows[key] = free
        return free

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
        base, workers = self._base(key[0]), self._workers
        for row in range(base, base + TENANTS * width, width):
            mark = words[row + _KEY]
            if mark == 0.0:
                break  # rows are claimed in order: the rest were never used
            if mark == FREED:
                continue
            count = int(sum(words[row + _HELD : row + _HELD + workers]))
            if row == at:
                held = count
            elif count > 0 or words[row + _SEEN] >= since:
                others.append(Holding(words[row + _WEIGHT], count))
        return held, others

    def release(self, key: tuple[str, str | None]) -> None:
        """This worker stops using ``key``'s row; the last to stop frees it, if nothing is
        held in it."""
        at = self._rows.pop(key, None)
        if at is None or at == _ALONE:
            return self._alone.release(key)
        with self._lock:
            self._let_go(at)

    def _let_go(self, at: int) -> None:
        held = _HELD + self._workers
        _let_go(self._words, at, self._use, (held, self._width), (_HELD, held))

    def clear(self) -> None:
        """Zero this worker's in-flight counts, and stop using every row (it died)."""
        words, width = self._words, self._width
        with self._lock:
            for row in range(0, len(words), width):
                words[row + _HELD + self._worker] = 0.0
                if words[row + self._use]:
                    self._let_go(row)
        self._rows.clear()


class SharedLedger:
    """One worker's handle: a :class:`router.control.fair.Ledger` over every worker's."""

    def __init__(
        self,
        words: memoryview[float],
        workers: int,
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
        self._workers = workers
        self._width = 1 + 2 * workers
        self._worker = worker
        self._use = 1 + workers + worker  # this worker's in-use flag in a row
        self._lock = lock
        self._rows: dict[str, int] = {}
        self._alone = LocalLedger()  # counters past a full table: this worker's own
        self._full_warned = False

    def get(self, key: tuple[str, str | None]) -> float:
        at = self._row(_name(key))
        if at is None:
            return self._alone.get(key)
        return sum(self._words[at + 1 : at + 1 + self._workers])

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
        total = sum(self._words[at + 1 : at + 1 + self._workers])
        if total < floor:
            self._words[at + 1 + self._worker] += floor - total

    def queued(self, cls: str, own: int) -> int:
        at = self._row(cls + _QUEUED)
        if at is None:
            return own
        self._words[at + 1 + self._worker] = float(own)
        return int(sum(self._words[at + 1 : at + 1 + self._workers]))

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
            others = sum(words[at + 1 : at + 1 + self._workers]) - words[mine]
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
        words, workers, out = self._words, self._workers, []
        for worker in range(workers):
            band = words[band_at + 1 + worker]
            if worker == self._worker or band == 0.0:
                continue
            counter = int(words[row_at + 1 + worker])
            served = sum(words[counter : counter + workers]) if counter else 0.0
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

    def release(self, key: tuple[str, str | None]) -> None:
        """This worker stops using ``key``'s counter and held rows; the last to stop frees
        each (see the module)."""
        self.held.release(key)
        at = self._rows.pop(_name(key), None)
        if at is None or at == _ALONE:
            return self._alone.release(key)
        with self._lock:
            _let_go(self._words, at, self._use, (1 + self._workers, self._width))

    def clear_uses(self) -> None:
        """Stop using every row (this worker died)."""
        words, width = self._words, self._width
        with self._lock:
            for row in range(0, len(words), width):
                if words[row + self._use]:
                    _let_go(words, row, self._use, (1 + self._workers, width))
        self._rows.clear()

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
            return None if at == _ALONE else at
        with self._lock:
            found = claim_row(self._words, self._width, name)
            if found is not None:
                self._words[found[0] + self._use] = 1.0
        if found is not None:
            self._rows[name] = found[0]
            return found[0]
        self._rows[name] = _ALONE
        if not self._full_warned:
            rows = len(self._words) // self._width
            log.warning("fairness table full (%d counters): further ones count per worker", rows)
            self._full_warned = True
        return None
