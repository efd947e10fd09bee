"""The in-flight load every worker of one router puts on each backend, shared between them.

With ``turnout serve --workers N`` each worker process would otherwise see only its own
requests: a policy balancing on in-flight counts would pile on a backend the other workers
fill, and ``max_inflight`` would cap each worker rather than the router. So the parent maps
one small anonymous shared memory segment before it forks (the children inherit it; nothing
on disk to clean up) with one row per worker. A worker writes only its own row, one slot per
backend (in flight, outstanding prompt and output tokens), and reads every row to sum them.
Worker 0's slot also keeps the router's grant of the backend's slots among its replicas
(router.backends.grants), which worker 0 asks for and every worker reads; and every slot
counts the requests that found no room on the backend, which worker 0 adds to what it asks
for.

No lock is needed: every slot has one writer, and each figure is an aligned 8-byte word,
which the CPU reads and writes whole. A reader may see one worker's three figures from two
moments a microsecond apart, which is no worse than the figures' own staleness. What does
need one step across workers, finding a backend below ``max_inflight`` and counting a request
there, admission does under the fairness segment's lock (router.control.admission).

A backend's slot is found by a 64-bit hash of its name, in a small open-addressed table per
row (linear probing), so workers agree on a backend without agreeing on an order, also after
a reload or discovery adds backends in a different order in each.
"""

from __future__ import annotations

import hashlib
import logging
import mmap

log = logging.getLogger("router")

SLOTS = 1024
"""Backends one worker can hold slots for over its lifetime (8 bytes x 6 words each)."""
_WORDS = 6  # key, in flight, outstanding prompt and output tokens, the router's grant, and
_GRANT = 4  # the requests that found no room here (a count that only grows)
_TURNED = 5
_EMPTY = 0


def _key(name: str) -> int:
    key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
    key &= (1 << 63) - 1  # a positive signed word
    return key or 1  # 0 marks an empty slot


class SharedLoad:
    """The segment: ``workers`` rows of :data:`SLOTS` slots. Make it before forking."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._mem = mmap.mmap(-1, workers * SLOTS * _WORDS * 8)  # MAP_SHARED, anonymous
        self._words = memoryview(self._mem).cast("q")

    def row(self, worker: int) -> WorkerRow:
        """Worker ``worker``'s view: writes to its row, reads all of them."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of {self.workers}")
        return WorkerRow(self._words, worker, self.workers)

    def clear(self, worker: int) -> None:
        """Zero worker ``worker``'s figures (it died, and its requests with it); its slots
        stay claimed for its replacement, and the router's grants with them."""
        start = worker * SLOTS * _WORDS
        words = self._words
        for at in range(start, start + SLOTS * _WORDS, _WORDS):
            if words[at] != _EMPTY:
                words[at + 1] = words[at + 2] = words[at + 3] = 0


class WorkerRow:
    """One worker's handle on the segment."""

    def __init__(self, words: memoryview, worker: int, workers: int) -> None:
        self._words = words
        self._worker = worker
        self._rows = [r * SLOTS * _WORDS for r in range(workers)]
        self._full_warned = False

    def slot(self, name: str) -> Slot | None:
        """The slot of backend ``name`` in this worker's row (None: the row is full, and this
        backend's load stays this worker's own)."""
        key = _key(name)
        index = _find(self._words, self._rows[self._worker], key, claim=True)
        if index is None:
            if not self._full_warned:
                log.warning("shared load table full (%d backends): %s counts alone", SLOTS, name)
                self._full_warned = True
            return None
        return Slot(self._words, index, key, self._rows)


class Slot:
    """One backend's figures: this worker's, written here, and every worker's, summed."""

    __slots__ = ("_at", "_found", "_key", "_rows", "_words")

    def __init__(self, words: memoryview, at: int, key: int, rows: list[int]) -> None:
        self._words = words
        self._at = at
        self._key = key
        self._rows = rows
        # Where each row keeps this backend, once seen there (slots never move).
        self._found: list[int | None] = [None] * len(rows)

    def add(self, inflight: int, prompt: int, output: int) -> None:
        """Change this worker's figures (only this worker writes them, from its event loop;
        two objects for one backend name, as around a reload, add up)."""
        w, at = self._words, self._at
        w[at + 1] += inflight
        w[at + 2] += prompt
        w[at + 3] += output

    def set_grant(self, code: int) -> None:
        """Keep the router's grant here (router.backends.grants.FleetShare): only
        worker 0 writes it, as the one process that asks for the router's grants."""
        self._words[self._at + _GRANT] = code

    def grant(self) -> int:
        """The router's grant as worker 0 last wrote it (0: not yet)."""
        at = self._found[0]
        if at is None:
            at = self._found[0] = _find(self._words, self._rows[0], self._key)
            if at is None:
                return 0
        return self._words[at + _GRANT]

    def turned_away(self) -> None:
        """One more request found no room here (this worker's count)."""
        self._words[self._at + _TURNED] += 1

    def turned_total(self) -> int:
        """Requests that found no room here, over every worker, since they started."""
        total = 0
        for r, row in enumerate(self._rows):
            at = self._found[r]
            if at is None:
                at = self._found[r] = _find(self._words, row, self._key)
            if at is not None:
                total += self._words[at + _TURNED]
        return total

    def totals(self) -> tuple[int, int, int]:
        """In flight, outstanding prompt and output tokens over every worker."""
        w, found = self._words, self._found
        inflight = prompt = output = 0
        for r, row in enumerate(self._rows):
            at = found[r]
            if at is None:
                at = found[r] = _find(w, row, self._key)
                if at is None:  # that worker has not used this backend yet
                    continue
            inflight += w[at + 1]
            prompt += w[at + 2]
            output += w[at + 3]
        return inflight, prompt, output


def _find(words: memoryview, row: int, key: int, *, claim: bool = False) -> int | None:
    """The word index of ``key``'s slot in the row starting at word ``row`` (with ``claim``,
    an empty slot is taken for it); None if absent (or, claiming, the row is full)."""
    start = key % SLOTS
    for i in range(SLOTS):
        at = row + ((start + i) % SLOTS) * _WORDS
        held = words[at]
        if held == key:
            return at
        if held == _EMPTY:
            if not claim:
                return None
            for word in range(1, _WORDS):
                words[at + word] = 0
            words[at] = key  # last: a reader sees the key only with zeroed figures
            return at
    return None
