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
"""

from __future__ import annotations

import logging
import mmap
import os

from policies.types import REQUEST_CLASSES
from router.control.fair import LocalLedger
from router.control.quota import RecordLock, claim_row

log = logging.getLogger("router")

ROWS = 4096
_QUEUED = "\0queued"


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

    def ledger(self, worker: int) -> SharedLedger:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of {self.workers}")
        return SharedLedger(self._words, self._width, worker, RecordLock(self._fd))

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s waiting counts (it died, and its waiters with it)."""
        self.ledger(worker).clear_queued()


class SharedLedger:
    """One worker's handle: a :class:`router.control.fair.Ledger` over every worker's."""

    def __init__(self, words: memoryview[float], width: int, worker: int, lock: RecordLock) -> None:
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

    def clear_queued(self) -> None:
        for cls in REQUEST_CLASSES:
            at = self._row(cls + _QUEUED)
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
