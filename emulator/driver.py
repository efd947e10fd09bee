"""Runs the pure engine model in real time inside the event loop.

One task owns the engine: it sleeps until the next step's deadline, measured against an
absolute start (model time = real elapsed time × time scale, so steps never drift), completes
every step that is due and wakes the streams that received chunks. Handlers only submit,
cancel and wait on their own event, so thousands of chunks per second cost one wake-up each.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from emulator.kvtransfer import Pull
from emulator.model import Engine, Sequence


class Driver:
    """Real-time clock and wake-up plumbing around an :class:`Engine`."""

    def __init__(
        self, engine: Engine, time_scale: float, on_pull: Callable[[Pull], None] | None = None
    ) -> None:
        self.engine = engine
        self._on_pull = on_pull
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = time.perf_counter()
        # Timers fire with about 1 ms of granularity; events due within half of that are
        # completed now rather than spinning on a zero-delay timer.
        self._slack = 0.0005 * time_scale
        self._kick = asyncio.Event()
        self._waiters: dict[Sequence, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None

    def model_now(self) -> float:
        """Current model time in seconds."""
        return (time.perf_counter() - self._t0) * self.time_scale

    def start(self) -> None:
        """Start the engine loop task."""
        self._task = asyncio.create_task(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        """Stop the engine loop task."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, seq: Sequence, arrived: float) -> asyncio.Event:
        """Queue ``seq`` now, which arrived at ``arrived`` (``time.perf_counter()``; the
        server's work on it since counts as front-end time); the returned event is set
        whenever it gets chunks."""
        event = asyncio.Event()
        now = self.model_now()
        self._dispatch(now)  # complete what is due first: the model's clock never runs back
        self._waiters[seq] = event
        spent = (time.perf_counter() - arrived) * self.time_scale
        pull = self.engine.submit(seq, now, spent)
        if pull is not None and self._on_pull is not None:
            self._on_pull(pull)
        self._kick.set()
        return event

    def hand_over(self, transfer_id: str) -> int | None:
        """A decode engine pulls the blocks held under ``transfer_id`` now (see
        :meth:`Engine.hand_over`)."""
        now = self.model_now()
        self._dispatch(now)
        tokens = self.engine.hand_over(transfer_id, now)
        self._kick.set()
        return tokens

    def release(self, seq: Sequence) -> None:
        """Forget ``seq``; if it is still in the engine (client gone), cancel it."""
        self._waiters.pop(seq, None)
        if not seq.done:
            now = self.model_now()
            self._dispatch(now)
            self.engine.cancel(seq, now)
            self._kick.set()

    async def _run(self) -> None:
        loop, kick = self._loop, self._kick
        while True:
            deadline = self.engine.next_deadline()
            handle = None
            if deadline is not None:
                delay = self._t0 + deadline / self.time_scale - time.perf_counter()
                handle = loop.call_later(max(delay, 0.0), kick.set)
            await kick.wait()
            kick.clear()
            if handle is not None:
                handle.cancel()
            self._dispatch(self.model_now() + self._slack)

    def _dispatch(self, now: float) -> None:
        """Complete every event due by ``now`` and wake the streams that got chunks."""
        waiters = self._waiters
        for seq in self.engine.advance(now):
            event = waiters.get(seq)
            if event is not None:
                event.set()
