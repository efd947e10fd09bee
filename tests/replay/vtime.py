"""Virtual time for the runner tests: an injectable clock and sleep, driven by the test."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTime:
    """Time advances only when every task is waiting on :meth:`sleep`."""

    def __init__(self) -> None:
        self.now = 0.0
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + max(delay, 0.0), next(self._seq), fut))
        await fut

    async def drive(self, coro: Coroutine[Any, Any, T], max_steps: int = 100_000) -> T:
        """Run ``coro`` to completion, jumping the clock to the next wake-up when idle."""
        task = asyncio.ensure_future(coro)
        for _ in range(max_steps):
            for _ in range(30):  # let every runnable task reach its next sleep
                await asyncio.sleep(0)
            if task.done():
                return task.result()
            if not self._sleepers:
                raise RuntimeError("deadlock: nothing sleeping and the task is not done")
            t, _, fut = heapq.heappop(self._sleepers)
            self.now = max(self.now, t)
            fut.set_result(None)
        raise RuntimeError("too many steps")
