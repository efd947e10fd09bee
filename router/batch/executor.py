"""Running batches: take lines under lease, send each through the router, write the answers.

One executor per router process. Each turn (:data:`TICK` seconds, sooner when a line ends) it
looks at the batches some router still has work on and, in creation order:

- finalizes a batch whose lines are all answered (status ``finalizing``, then ``completed``
  with its output and error files), a ``cancelling`` one (``cancelled``) and one past its
  completion window (``expired``: its unanswered lines go to the error file as
  ``batch_expired``) once no router runs a line of it any more;
- takes as many open lines as the pacing window leaves room for (router.batch.pacing) and
  runs each as a ``batch``-class request through the request path, in-process
  (router.batch.lines).

A line that the router turned away (429, 503: the batch pool is full, or the tenant is over
its own limits) is given back and taken again after a pause, until the window ends; one whose
engine failed (other 5xx) is tried up to ``max_attempts`` times; any other answer is final:
2xx to the output file, the rest to the error file, in OpenAI's line shape (the files are
written by router.batch.finalize, beside the turns). Leases are renewed while lines run, so
only a dead router's lines are taken over by another.

A 429 holds back the lines of that tenant's batches only, for the pause it asked: a tenant
over its own quota slows nobody else. The pacing window shrinks for what the service fails
(router.batch.pacing learns it from every finished request), not for a tenant's 429s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping

import orjson

from router.batch.finalize import error_line, finalize
from router.batch.lines import run_line
from router.batch.metrics import BatchMetrics
from router.batch.pacing import Pacer
from router.batch.store import BatchRow, BatchStatus, BatchStore, Finished, Line, new_id
from router.config.batch import BatchSettings
from router.proxy.state import RouterState
from router.server.ids import usable_id

TICK = 0.5
"""Seconds between two looks at the store when nothing happens."""
MAX_PAUSE = 30.0
"""Seconds between two turns at most while the store keeps failing."""
LAG_PROBE = 0.05
"""Seconds between two looks at how late the event loop runs a timer."""
RETRY_PAUSE = 1.0
"""Seconds before a line turned away is taken again (doubling per try, at most 30 s)."""
SWEEP_EVERY = 300.0
"""Seconds between two sweeps of what dead writers left in the store."""
STALE = 3600.0
"""Seconds after which a file still being written, or a batch still validating, counts as
left by a writer that died (an upload takes at most ``limits.body_seconds``)."""
_RETRY_ALWAYS = frozenset({429, 503})
_INTERNAL = "The router failed to run this line."
log = logging.getLogger("router")


def request_id(batch_id: str, line: Line) -> str:
    """The line's ``X-Request-Id`` (so its capture line's ``custom_id``): the custom_id, when
    it is usable as one (router.server.ids.usable_id); else ``<batch id>-<line index>``."""
    cid = line.custom_id
    if usable_id(cid):
        return cid
    return f"{batch_id}-{line.idx}"


class Executor:
    """Takes, runs and finishes batch lines for one router process."""

    def __init__(
        self,
        store: BatchStore,
        state: RouterState,
        pacer: Pacer,
        metrics: BatchMetrics,
        settings: BatchSettings,
    ) -> None:
        self._store = store
        self._state = state
        self._pacer = pacer
        self._metrics = metrics
        self._settings = settings
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This process's name on the leases it holds."""
        self._running: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._finalizing: dict[str, asyncio.Task[None]] = {}
        self._held: dict[str, float] = {}
        """Tenant (owner id) -> ``time.monotonic()`` until which none of its lines start."""
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._probe_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="batch-executor")
        self._probe_task = asyncio.create_task(self._probe(), name="batch-loop-lag")

    def wake(self) -> None:
        """Look at the store now (a batch was created or cancelled)."""
        self._wake.set()

    async def aclose(self) -> None:
        """Stop taking lines, give up those running and hand their leases back at once."""
        for background in (self._loop_task, self._probe_task):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        tasks = [*self._running.values(), *self._finalizing.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._store.renew(self.worker, 0.0)

    async def _probe(self) -> None:
        """Tell the pacer how late the event loop runs a timer (how busy the router is)."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(LAG_PROBE)
            self._pacer.lag(loop.time() - start - LAG_PROBE)

    async def _loop(self) -> None:
        renewed = time.monotonic()
        swept = renewed - SWEEP_EVERY
        failures = 0
        while True:
            pause = TICK
            try:
                await self._turn()
                if self._running and time.monotonic() - renewed > self._settings.lease_seconds / 3:
                    renewed = time.monotonic()
                    await self._store.renew(self.worker, time.time() + self._settings.lease_seconds)
                if time.monotonic() - swept > SWEEP_EVERY:
                    swept = time.monotonic()
                    await self._store.sweep(time.time() - STALE)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # the store is away: back off, and say so once per doubling
                failures += 1
                pause = min(MAX_PAUSE, TICK * 2**failures)
                if failures & (failures - 1) == 0:
                    log.exception("batch executor turn failed (%d in a row)", failures)
            self._wake.clear()
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns normally when the wake
            # comes in the same turn as a cancel (a line ending while aclose cancels this
            # loop), swallowing the cancel, and aclose then waited on this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()

    async def _turn(self) -> None:
        now = time.time()
        batches = await self._store.active()
        self._metrics.update_rate()
        wanting = False
        for batch in batches:
            if batch.id in self._finalizing:
                continue
            if batch.status == "finalizing":
                self._finalize(batch, "completed")
            elif batch.status == "cancelling" or now >= batch.expires_at:
                if not self._runs(batch.id) and not await self._store.live_leases(batch.id, now):
                    self._finalize(
                        batch, "cancelled" if batch.status == "cancelling" else "expired"
                    )
            elif batch.completed + batch.failed >= batch.total:
                self._finalize(batch, "completed")
            else:
                wanting |= await self._take(batch, now)
        self._pacer.adjust(wanting)
        self._metrics.window.set(self._pacer.window)
        self._metrics.inflight.set(len(self._running))

    def _runs(self, batch_id: str) -> bool:
        return any(key[0] == batch_id for key in self._running)

    def _holds(self, owner: str) -> bool:
        """Whether the tenant's lines wait (a 429 asked it to)."""
        until = self._held.get(owner)
        if until is not None and until <= time.monotonic():
            del self._held[owner]
            return False
        return until is not None

    async def _take(self, batch: BatchRow, now: float) -> bool:
        """Start lines of ``batch`` as the window allows; True when it wanted more."""
        # Draining: no new lines (a running one finishes or is cut, and given back, at the
        # drain's deadline), so a batch does not hold the exit to it.
        if self._state.drain.draining or self._holds(batch.owner):
            return False
        free = self._pacer.window - len(self._running)
        if free <= 0:
            return True
        until = now + self._settings.lease_seconds
        lines = await self._store.claim(batch.id, self.worker, free, now, until)
        for line in lines:
            key = (line.batch_id, line.idx)
            self._running[key] = asyncio.create_task(self._run(batch, line), name="batch-line")
        return len(lines) == free

    async def _run(self, batch: BatchRow, line: Line) -> None:
        try:
            status, request_id, body, retry_after = await self._send(batch, line)
            if self._retry(status, line):
                pause = retry_after or min(30.0, RETRY_PAUSE * 2 ** (line.attempts - 1))
                if status == 429:
                    until = time.monotonic() + pause
                    self._held[batch.owner] = max(until, self._held.get(batch.owner, 0.0))
                await self._store.release_line(line, self.worker, time.time() + pause)
                return
            done = _finished(line, status, request_id, body)
            if await self._store.finish_line(line, self.worker, done, time.time()):
                self._metrics.line(done.ok, done.prompt_tokens, done.completion_tokens)
        except asyncio.CancelledError:
            raise
        except Exception:  # answered as failed, else the same bug would take it again forever
            log.exception("batch %s line %d failed inside the router", batch.id, line.idx)
            failed = Finished(False, error_line(line.custom_id, "internal", _INTERNAL))
            with contextlib.suppress(Exception):
                if await self._store.finish_line(line, self.worker, failed, time.time()):
                    self._metrics.line(False, 0, 0)
        finally:
            self._running.pop((line.batch_id, line.idx), None)
            self._wake.set()

    def _retry(self, status: int, line: Line) -> bool:
        if status in _RETRY_ALWAYS:
            return True
        return status >= 500 and line.attempts < self._settings.max_attempts

    async def _send(
        self, batch: BatchRow, line: Line
    ) -> tuple[int, str | None, bytes, float | None]:
        """The router's answer to the line: status, request id, body and the Retry-After it
        asked for."""
        headers = {
            "Content-Type": "application/json",
            "X-Request-Class": "batch",
            "X-Request-Id": request_id(batch.id, line),
            "X-Turnout-Batch": batch.id,
        }
        reply = await run_line(self._state, batch.owner, line.url, headers, line.body)
        return reply.status, reply.headers.get("X-Request-Id"), reply.body, _seconds(reply.headers)

    def _finalize(self, batch: BatchRow, status: BatchStatus) -> None:
        """Finalize the batch beside the turns (its files may take a while to write)."""
        task = asyncio.create_task(
            finalize(self._store, batch, status, self._settings.lease_seconds, self._metrics),
            name="batch-finalize",
        )
        self._finalizing[batch.id] = task

        def done(task: asyncio.Task[None]) -> None:
            del self._finalizing[batch.id]
            if not task.cancelled() and task.exception() is not None:
                # The store is away: another turn tries once the right to finalize lapses.
                log.error("batch %s failed to finalize", batch.id, exc_info=task.exception())
            self._wake.set()

        task.add_done_callback(done)


def _seconds(headers: Mapping[str, str]) -> float | None:
    try:
        return min(30.0, float(headers.get("Retry-After", "")))
    except ValueError:
        return None


def _finished(line: Line, status: int, request_id: str | None, body: bytes) -> Finished:
    """The line's output (2xx) or error line, and its token counts."""
    try:
        doc = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        doc = body.decode("utf-8", "replace")
    usage = doc.get("usage") if isinstance(doc, dict) else None
    prompt = completion = 0
    if isinstance(usage, dict):  # /v1/responses says input_tokens and output_tokens
        prompt = _count(usage.get("prompt_tokens", usage.get("input_tokens")))
        completion = _count(usage.get("completion_tokens", usage.get("output_tokens")))
    response = {"status_code": status, "request_id": request_id, "body": doc}
    out = {
        "id": new_id("batch_req_"),
        "custom_id": line.custom_id,
        "response": response,
        "error": None,
    }
    return Finished(200 <= status < 300, orjson.dumps(out), prompt, completion)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
