"""Admission control: a bounded wait per class when every eligible backend is saturated.

A request whose candidates are all at ``max_inflight`` waits in its class's queue instead of
failing at once. Whenever a request leaves a backend the first waiter is woken and plans
again: interactive waiters always before batch ones, so interactive work is served first and
never starved by a batch backlog. A full queue, or a wait longer than the class's
``max_wait``, answers 429 with ``Retry-After``. With no ``admission`` section the queues are
empty-sized: saturation answers 429 at once (still with ``Retry-After``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TypeVar

from policies.types import REQUEST_CLASSES, RequestClass
from router.config.model import AdmissionSettings
from router.server.errors import RouterError

T = TypeVar("T")


class Saturated(RouterError):
    """Every eligible backend is at its in-flight limit (the request may wait and retry)."""

    def __init__(self, message: str = "every eligible backend is at its in-flight limit") -> None:
        super().__init__(429, message, code="rate_limit_exceeded")


class QueueRejected(RouterError):
    """429 from admission, with ``Retry-After`` (whole seconds, at least 1)."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(
            429,
            message,
            code="rate_limit_exceeded",
            headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
        )


class Admission:
    """Per-class FIFO queues of waiters; one per router app, used from the event loop only."""

    def __init__(self, settings: AdmissionSettings) -> None:
        self.settings = settings
        self._queues: dict[RequestClass, deque[asyncio.Future[None]]] = {
            cls: deque() for cls in REQUEST_CLASSES
        }

    def waiting(self, cls: RequestClass) -> int:
        """Requests of ``cls`` waiting now."""
        return len(self._queues[cls])

    async def admit(self, cls: RequestClass, plan: Callable[[], T]) -> T:
        """``plan()``'s result; while it raises :class:`Saturated`, wait in ``cls``'s queue.

        Raises :class:`QueueRejected` when the queue is full or the wait runs out.
        """
        limits = self.settings.for_class(cls)
        deadline: float | None = None
        front = False
        while True:
            try:
                return plan()
            except Saturated as exc:
                queue = self._queues[cls]
                if not front and len(queue) >= limits.queue_size:
                    raise QueueRejected(
                        f"{exc.message}, and the {cls} queue is full", self.settings.retry_after
                    ) from None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + limits.max_wait
                if now >= deadline:
                    raise QueueRejected(
                        f"{exc.message} for over {limits.max_wait:g} s", self.settings.retry_after
                    ) from None
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                # A waiter woken for nothing goes back to the head: it keeps its turn.
                queue.appendleft(waiter) if front else queue.append(waiter)
                try:
                    async with asyncio.timeout_at(_loop_time(deadline)):
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
                    if waiter in queue:
                        queue.remove(waiter)
                front = True

    def release(self) -> None:
        """A backend slot may have freed up: wake the first waiter, interactive first."""
        for cls in REQUEST_CLASSES:
            queue = self._queues[cls]
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return


def _loop_time(deadline: float) -> float:
    """A ``time.monotonic`` deadline on the event loop's clock."""
    return asyncio.get_running_loop().time() + (deadline - time.monotonic())
