"""vLLM's data-parallel front end: API servers balancing on counts relayed by a coordinator.

The ``vllm-dp`` rank assignment (mixed scheduling). A rank publishes its ``(waiting,
running)`` when they changed, at the start and at the end of each step; requests that arrive
during a step wait in its input queue and are not counted until the step ends. The coordinator
relays the latest counts to every API server at most once per ``dp_stats_interval_ms`` while
they keep changing, and every four seconds otherwise. Each of ``api_servers`` front-end
processes takes a request (the kernel hands each connection to one of them), picks the rank
with the lowest ``4 x waiting + running`` in its own copy of the counts (ties to the first
from its own scan start, which moves on by one after each pick) and adds ``api_servers`` to
that rank's waiting count there, guessing that the other servers do likewise; a broadcast
replaces those guesses. So between broadcasts every API server sees the same least loaded
rank, and a rank in the middle of a long prefill step looks as it did when the step began:
several requests may land on it and queue behind each other. (From vLLM's ``coordinator.py``
and ``DPLBAsyncMPClient``, with pull requests 21617, 41626 and 47420; recent vLLM starts one
API server per DP rank by default.)
"""

from __future__ import annotations

import random

HEARTBEAT_S = 4.0  # the coordinator republishes unchanged counts this often


class DPFrontEnd:
    """The coordinator's latest counts and each API server's copy of them."""

    def __init__(self, ranks: int, api_servers: int, interval_ms: float, seed: int) -> None:
        self._rng = random.Random(seed)
        self._interval = interval_ms / 1e3
        self._counts = [[0, 0] for _ in range(ranks)]  # what the coordinator last received
        self._views = [[[0, 0] for _ in range(ranks)] for _ in range(api_servers)]
        self._start = [ranks * i // api_servers for i in range(api_servers)]
        self._last = -HEARTBEAT_S  # when the last broadcast went out
        self._pending: float | None = None  # when the next one goes out, if counts changed

    def _catch_up(self, now: float) -> None:
        """Deliver the broadcast due by ``now`` (the counts cannot have changed since)."""
        if self._pending is not None and self._pending <= now:
            self._broadcast(self._pending)
        elif self._pending is None and now > self._last + HEARTBEAT_S:
            self._broadcast(self._last + HEARTBEAT_S * ((now - self._last) // HEARTBEAT_S))

    def _broadcast(self, at: float) -> None:
        for view in self._views:
            for mine, latest in zip(view, self._counts, strict=True):
                mine[:] = latest
        self._last, self._pending = at, None

    def published(self, rank: int, counts: tuple[int, int], now: float) -> None:
        """Rank ``rank`` reports ``counts`` at ``now`` (sent on only if they changed)."""
        if list(counts) == self._counts[rank]:
            return
        self._catch_up(now)
        self._counts[rank] = list(counts)
        if self._pending is None:
            self._pending = max(now, self._last + self._interval)

    def pick(self, now: float) -> int:
        """The rank a request reaching the front end at ``now`` is sent to."""
        self._catch_up(now)
        server = self._rng.randrange(len(self._views))
        view, start = self._views[server], self._start[server]
        n = len(view)
        order = [(start + i) % n for i in range(n)]
        best = min(order, key=lambda i: 4 * view[i][0] + view[i][1])  # first of equals
        view[best][0] += len(self._views)
        self._start[server] = (start + 1) % n
        return best
