"""The router's background capture writer.

The request path only calls :meth:`CaptureWriter.record`, which samples and puts the finished
request on a bounded queue without blocking; a full queue drops it and calls ``on_drop`` (the
router counts it in ``switchyard_capture_dropped_total``). A background task drains the queue,
derives each request's record, redacts it (router.observe.redact) and serialises it to a
capture line (common.capture); a worker thread pipes each batch to the sink process
(router.observe.sink) that owns the file. Nothing waits in user-space buffers, so lines reach
the file as soon as the writer task has them (well within a second).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from common.capture import CaptureRecord, dump_line
from router.config.model import CaptureSettings
from router.observe.redact import prompt_size, redact
from router.observe.sink import open_append, write_all

# Never written, whatever the allow-list says.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
_BATCH = 512


class Capturable(Protocol):
    """A finished request that can be written as a capture line (router.proxy.exchange)."""

    request_id: str

    def capture_record(self, t0: float) -> CaptureRecord:
        """The request's record before redaction; ``t_offset_ms`` counts from ``t0``."""
        ...


class CaptureWriter:
    """Writes finished requests to the capture file in the background (see module doc)."""

    def __init__(self, settings: CaptureSettings, *, on_drop: Callable[[], None]) -> None:
        self._settings = settings
        self._on_drop = on_drop
        self._allow = frozenset(h.lower() for h in settings.headers) - _SECRET_HEADERS
        # Sampling by request id: deterministic, and the same id is kept or dropped everywhere.
        self._threshold = int(min(max(settings.sample_rate, 0.0), 1.0) * 2**32)
        self._queue: asyncio.Queue[Capturable | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._t0 = 0.0

    async def start(self) -> None:
        """Start the file sink process and the background writer task."""
        self._t0 = time.monotonic()
        self._proc = await asyncio.to_thread(self._spawn)
        self._queue = asyncio.Queue(maxsize=self._settings.queue_size)
        self._task = asyncio.create_task(self._run(), name="capture-writer")

    def record(self, entry: Capturable) -> None:
        """Queue ``entry`` if sampled; never blocks or raises; a full queue calls ``on_drop``."""
        if self._threshold < 2**32 and zlib.crc32(entry.request_id.encode()) >= self._threshold:
            return
        queue = self._queue
        try:
            if queue is None or self._task is None or self._task.done():
                raise asyncio.QueueFull
            queue.put_nowait(entry)
        except asyncio.QueueFull:
            self._on_drop()

    async def aclose(self) -> None:
        """Write everything queued, close the pipe and wait for the sink to finish the file."""
        if self._queue is None or self._task is None or self._proc is None:
            return
        if not self._task.done():
            await self._queue.put(None)
            await self._task
        self._queue = None
        proc = self._proc
        assert proc.stdin is not None
        proc.stdin.close()
        await asyncio.to_thread(proc.wait)

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        closing = False
        while not closing:
            batch = [await queue.get()]
            while len(batch) < _BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            lines: list[bytes] = []
            for entry in batch:
                if entry is None:
                    closing = True
                    continue
                try:
                    lines.append(self._line(entry))
                except Exception:  # a malformed entry must not stop the writer
                    self._on_drop()
            if lines:
                try:
                    await asyncio.to_thread(write_all, self._pipe, b"".join(lines))
                except OSError:  # the sink is gone
                    for _ in lines:
                        self._on_drop()

    def _line(self, source: Capturable) -> bytes:
        rec = source.capture_record(self._t0)
        mode = self._settings.redaction
        resp = rec.resp
        if mode == "drop" and resp is not None and resp.prompt_tokens is None:
            # Keep the prompt's size so that a replay can synthesize one as long.
            resp = replace(resp, prompt_tokens=prompt_size(rec.body))
        rec = replace(
            rec,
            body=redact(dict(rec.body), mode),
            headers={k.lower(): v for k, v in rec.headers.items() if k.lower() in self._allow},
            resp=resp,
        )
        return dump_line(rec)

    # The methods below run in a worker thread; only the writer task calls them, one at a time.

    def _spawn(self) -> subprocess.Popen[bytes]:
        s = self._settings
        # Fail at startup, with the OS's reason, if the file cannot be opened for appending.
        os.close(open_append(s.path))
        argv = [sys.executable, "-m", "router.observe.sink", s.path, str(s.rotate_bytes or 0)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True)
        assert proc.stdin is not None
        self._pipe = proc.stdin.fileno()
        return proc
