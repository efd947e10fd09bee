"""API keys' usage in the router's own memory: token buckets and concurrency counts.

A :class:`QuotaTable` holds one row per quota (a configured key by its tenant id, or the
anonymous callers): the requests bucket's level and time, the tokens bucket's, and the
requests open, one count per worker. The limits themselves are not stored: every call
brings the caller's current ones, so a reload's new limits apply at once and what was spent
stays spent.

One process keeps the table in its own memory. With ``turnout serve --workers N`` the parent
maps one segment before it forks (:class:`SharedQuotas`), so every worker reserves from the
same buckets; a reservation is a check and a take that must not interleave with another
worker's, so each holds a POSIX record lock on the segment's file for those few
microseconds. The kernel drops such a lock when its holder dies, so a killed worker cannot
leave the others locked out; its open requests, which died with it, are its own column,
which the parent zeroes (:meth:`SharedQuotas.clear`).

A bucket of ``per_minute`` tokens refills continuously at ``per_minute / 60`` a second and
starts full. A take may push it below zero (a usage past the charge is a debt that later
refills repay); a caller needing more than the whole bucket needs it full, so it is slow,
not impossible.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import mmap
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger("router")
Clock = Callable[[], float]

ROWS = 4096
"""Quotas one table holds over its lifetime (configured keys, across reloads, and one
anonymous); past it a quota is counted by its process alone, with a warning."""
_HEAD = 5  # key, requests level and stamp, tokens level and stamp; then one count per worker
_EMPTY = 0.0
_FULL = math.nan  # a bucket never used (or its limit just set): full
WINDOW_SECONDS = 60


@dataclass(frozen=True, slots=True)
class Limits:
    """A caller's limits; None: no such limit."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a reservation was refused: ``open`` (every slot taken; ``held`` of them),
    ``requests`` or ``tokens`` (a window spent, for ``wait`` seconds), ``store`` (the shared
    store is unreachable and ``on_error: deny``)."""

    kind: Literal["open", "requests", "tokens", "store"]
    wait: float = 1.0
    held: int = 0


class Settler(Protocol):
    """Where a reservation is settled: the store that made it."""

    def settle(self, quota: str, limits: Limits, give: float) -> None:
        """Free the reservation's slot; ``give`` tokens back (negative: take more)."""


class QuotaStore(Settler, Protocol):
    """What the gate (router.control.auth) reserves from."""

    async def reserve(self, quota: str, limits: Limits, tokens: float) -> Settler | Refusal:
        """Take a slot, a request and ``tokens`` tokens of ``quota``, all or none."""

    def check(self, quota: str, limits: Limits, tokens: float) -> Refusal | None:
        """Whether :meth:`reserve` would refuse now, as far as known without asking anyone;
        takes nothing."""

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class _Lock(Protocol):
    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> None: ...


class _Alone:
    """No other process shares the table."""

    def __enter__(self) -> object:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class RecordLock:
    """An exclusive POSIX record lock on the segment's file (released if its holder dies)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> object:
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN)


def row_key(quota: str) -> float:
    """A quota's row key: 52 bits of its hash, exact as a double, never 0."""
    digest = hashlib.blake2b(quota.encode(), digest_size=8).digest()
    return float((int.from_bytes(digest, "little") >> 12) or 1)


FREED = -1.0
"""The key of a row let go of (router.control.fair_shared): a probe passes over it, and a
claim reuses it. No :func:`row_key` is negative."""


def claim_row(words: memoryview[float], width: int, name: str) -> tuple[int, bool] | None:
    """The first word of ``name``'s row in a table of rows of ``width`` words, each a key then
    zeros when claimed (the caller holds the lock that guards claims), and whether it was
    claimed now; None when every row is taken."""
    key = row_key(name)
    rows = len(words) // width
    start = int(key) % rows
    free = None  # the first freed row on the probe: ``name``'s if it is not further on
    for i in range(rows):
        at = ((start + i) % rows) * width
        held = words[at]
        if held == key:
            return at, False
        if held == FREED:
            free = at if free is None else free
        elif held == _EMPTY:
            free = at if free is None else free
            break
    if free is None:
        return None
    words[free + 1 : free + width] = memoryview(bytearray((width - 1) * 8)).cast("d")
    words[free] = key
    return free, True


def _level(words: memoryview[float], at: int, per_minute: int, now: float) -> float:
    """The bucket at word ``at`` (level, stamp), refilled to ``now``."""
    level = words[at]
    if level != level:  # NaN: full
        return float(per_minute)
    return min(float(per_minute), level + (now - words[at + 1]) * per_minute / WINDOW_SECONDS)


def _wait(need: float, per_minute: int) -> float:
    return need * WINDOW_SECONDS / per_minute


class QuotaTable:
    """One process's handle on a table of quotas (its own, or its router's workers')."""

    def __init__(
        self, words: memoryview[float], workers: int, worker: int, lock: _Lock, clock: Clock
    ) -> None:
        self._words = words
        self._width = _HEAD + workers
        self._workers = workers
        self._worker = worker
        self._lock = lock
        self._clock = clock
        self._rows: dict[str, int] = {}  # quota -> its row's first word (rows never move)
        self._overflow: QuotaTable | None = None

    @classmethod
    def private(cls, clock: Clock = time.monotonic, rows: int = ROWS) -> QuotaTable:
        """A table in this process's memory alone."""
        words = memoryview(bytearray(rows * (_HEAD + 1) * 8)).cast("d")
        return cls(words, 1, 0, _Alone(), clock)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def check(self, quota: str, limits: Limits, tokens: float) -> Refusal | None:
        with self._lock:
            found = self._row(quota)
            if isinstance(found, QuotaTable):
                return found.check(quota, limits, tokens)
            return self._refusal(found, limits, tokens, self._clock())

    async def reserve(self, quota: str, limits: Limits, tokens: float) -> Settler | Refusal:
        return self.take(quota, limits, tokens)

    def take(self, quota: str, limits: Limits, tokens: float) -> Settler | Refusal:
        """:meth:`reserve`, synchronously."""
        with self._lock:
            at = self._row(quota)
            if isinstance(at, QuotaTable):
                return at.take(quota, limits, tokens)
            now = self._clock()
            refusal = self._refusal(at, limits, tokens, now)
            if refusal is not None:
                return refusal
            w = self._words
            if limits.requests_per_minute:
                w[at + 1] = _level(w, at + 1, limits.requests_per_minute, now) - 1
                w[at + 2] = now
            if tokens and limits.tokens_per_minute:
                w[at + 3] = _level(w, at + 3, limits.tokens_per_minute, now) - tokens
                w[at + 4] = now
            w[at + _HEAD + self._worker] += 1
            return self

    def settle(self, quota: str, limits: Limits, give: float) -> None:
        with self._lock:
            at = self._row(quota)
            if isinstance(at, QuotaTable):
                at.settle(quota, limits, give)
                return
            w = self._words
            w[at + _HEAD + self._worker] -= 1
            if give and limits.tokens_per_minute:
                now = self._clock()
                per_minute = limits.tokens_per_minute
                w[at + 3] = min(float(per_minute), _level(w, at + 3, per_minute, now) + give)
                w[at + 4] = now

    def usage(self, quota: str, limits: Limits) -> tuple[float, float, int]:
        """The requests and tokens left in ``quota``'s buckets now, and its requests open."""
        with self._lock:
            at = self._row(quota)
            if isinstance(at, QuotaTable):
                return at.usage(quota, limits)
            now, w = self._clock(), self._words
            rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
            requests = _level(w, at + 1, rpm, now) if rpm else math.inf
            tokens = _level(w, at + 3, tpm, now) if tpm else math.inf
            return requests, tokens, self._open(at)

    def _open(self, at: int) -> int:
        start = at + _HEAD
        return int(sum(self._words[start : start + self._workers]))

    def _refusal(self, at: int, limits: Limits, tokens: float, now: float) -> Refusal | None:
        w = self._words
        if limits.max_concurrency is not None:
            held = self._open(at)
            if held >= limits.max_concurrency:
                return Refusal("open", held=held)
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        if rpm and (need := 1 - _level(w, at + 1, rpm, now)) > 0:
            return Refusal("requests", _wait(need, rpm))
        if tokens and tpm and (need := min(tokens, tpm) - _level(w, at + 3, tpm, now)) > 0:
            return Refusal("tokens", _wait(need, tpm))
        return None

    def _row(self, quota: str) -> int | QuotaTable:
        """The first word of ``quota``'s row, claimed if new (the lock is held); the overflow
        table when every row is taken."""
        at = self._rows.get(quota)
        if at is not None:
            return at
        found = claim_row(self._words, self._width, quota)
        if found is not None:
            at, new = found
            if new:
                self._words[at + 1] = self._words[at + 3] = _FULL
            self._rows[quota] = at
            return at
        if self._overflow is None:
            rows = len(self._words) // self._width
            log.warning("quota table full (%d quotas): further ones count per process", rows)
            self._overflow = QuotaTable.private(self._clock, rows=64)
        return self._overflow

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s open requests (it died, and they with it)."""
        with self._lock:
            w, width = self._words, self._width
            for at in range(0, len(w), width):
                if w[at] != _EMPTY:
                    w[at + _HEAD + worker] = 0.0


class SharedQuotas:
    """The segment the workers of one router share: make it in the parent, before forking."""

    def __init__(self, workers: int, rows: int = ROWS) -> None:
        self.workers = workers
        size = rows * (_HEAD + workers) * 8
        # A memfd: a file for the record lock, and memory for the table, with no path.
        self._fd = os.memfd_create("turnout-quotas", os.MFD_CLOEXEC)
        os.ftruncate(self._fd, size)
        self._mem = mmap.mmap(self._fd, size)  # MAP_SHARED: every worker sees each write
        self._words = memoryview(self._mem).cast("d")

    def table(self, worker: int, clock: Clock = time.monotonic) -> QuotaTable:
        """Worker ``worker``'s handle (writes its own count column, reads all of them)."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of {self.workers}")
        return QuotaTable(self._words, self.workers, worker, RecordLock(self._fd), clock)

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s open requests (the parent, when it died)."""
        self.table(worker).clear(worker)
