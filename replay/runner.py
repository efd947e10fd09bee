"""Open loop on an absolute clock, and closed loop.

Open loop: every send time is ``start + at`` against one clock reading taken at the start, so
lateness never accumulates (no relative sleeps); each request runs in its own task, so a slow
response never delays the next send; how late each task actually started is its send lag.
The next request's body is built before sleeping, so synthesis costs no lag.

Closed loop: ``concurrency`` workers each send their next request when the previous answer
is complete (the shape of vLLM's benchmark with ``--max-concurrency``).

The clock and sleep are injectable, so tests run the loops in virtual time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from replay.plan import Planned
from replay.sources import Item

Prepare = Callable[[Item], bytes]
"""Builds the request body of an item (synthesis happens here, ahead of the send time)."""
Send = Callable[[Item, bytes, float | None], Awaitable[None]]
"""Sends one request (body, send lag or None in closed loop) and records its result."""


@dataclass(slots=True)
class Timing:
    """When a run started and when its last request finished (clock seconds)."""

    start: float
    end: float

    @property
    def duration(self) -> float:
        """Run duration: the first scheduled send to the last completion."""
        return max(self.end - self.start, 1e-9)


class Runner:
    """Drives ``send`` over a plan; ``sent`` and ``done`` feed the progress line."""

    def __init__(
        self,
        prepare: Prepare,
        send: Send,
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._prepare = prepare
        self._send = send
        self._clock = clock
        self._sleep = sleep
        self.sent = 0
        self.done = 0
        self.start = 0.0

    async def _one(self, item: Item, body: bytes, due: float | None) -> None:
        lag = None if due is None else self._clock() - due
        self.sent += 1
        try:
            await self._send(item, body, lag)
        finally:
            self.done += 1

    async def open_loop(self, plan: Iterable[Planned]) -> Timing:
        """Send each planned item at ``start + at``; wait for all; return the timing."""
        tasks: set[asyncio.Task[None]] = set()
        self.start = start = self._clock()
        for p in plan:
            body = self._prepare(p.item)
            due = start + p.at
            delay = due - self._clock()
            if delay > 0:
                await self._sleep(delay)
            task = asyncio.create_task(self._one(p.item, body, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            # Let the task start its send now, before the next body is built.
            await asyncio.sleep(0)
        while tasks:
            await asyncio.gather(*list(tasks))
        return Timing(start, self._clock())

    async def closed_loop(self, plan: Iterable[Planned], concurrency: int) -> Timing:
        """``concurrency`` requests in flight until the plan is exhausted."""
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        items: Iterator[Planned] = iter(plan)

        async def worker() -> None:
            for p in items:  # a shared iterator: each item goes to exactly one worker
                await self._one(p.item, self._prepare(p.item), None)

        self.start = self._clock()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Timing(self.start, self._clock())
