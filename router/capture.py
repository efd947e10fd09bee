"""The router's background capture writer.

The request path only calls :meth:`CaptureWriter.record`, which samples and puts the entry on
a bounded queue without blocking; a full queue drops the entry and calls ``on_drop`` (the
router counts it in ``switchyard_capture_dropped_total``). A background task drains the queue,
redacts, serialises to capture lines (see :mod:`common.capture`) and hands whole lines to a
worker thread that writes them with one ``os.write`` per batch on an ``O_APPEND`` descriptor.
Nothing is buffered in user space, so lines reach the kernel as soon as they are written (well
within a second) and a ``kill -9`` of the router can lose at most the batch in flight, never
leave half a line behind a whole one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from common.capture import CaptureRecord, Observed, Response, Route, dump_line, iso_utc
from common.tokens import count_chat, count_text
from router.config import CaptureSettings

# Never written, whatever the allow-list says.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
# The prompt-bearing keys of the OpenAI request bodies the router serves.
_PROMPT_KEYS = ("messages", "prompt", "input", "suffix")
_WORD = re.compile(r"\w+")
_FILLER = b"abcdefghijklmnopqrstuvwxyz"
_BATCH = 512


@dataclass(frozen=True, slots=True)
class CaptureEntry:
    """Everything the router knows when a request has finished."""

    request_id: str
    url: str
    body: bytes
    headers: Mapping[str, str]
    arrival: float
    arrival_wall: float
    policy: str
    request_class: str
    backend: str | None
    failovers: int
    status: int
    stream: bool
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error: Mapping[str, object] | None
    ttft_s: float | None
    tpot_s: float | None
    e2e_s: float | None


def hash_text(text: str) -> str:
    """Same-length deterministic filler: word characters replaced, punctuation and spaces kept.

    The filler is keyed on the whole text, so identical texts (shared system prompts) stay
    identical and prefix caches still see the sharing, and the token count under
    :mod:`common.tokens` is unchanged (word runs stay word runs of the same length).
    """
    digest = hashlib.blake2b(text.encode(), digest_size=64).digest()
    n = len(digest)
    i = 0

    def fill(m: re.Match[str]) -> str:
        nonlocal i
        start = i
        i += len(m.group())
        return bytes(_FILLER[digest[k % n] % 26] for k in range(start, i)).decode()

    return _WORD.sub(fill, text)


def _hash_value(v: Any) -> Any:
    """Apply :func:`hash_text` to every string inside a prompt-bearing value."""
    if isinstance(v, str):
        return hash_text(v)
    if isinstance(v, list):
        return [_hash_value(x) for x in v]
    if isinstance(v, dict):
        return {k: (_hash_value(x) if k in ("content", "text") else x) for k, x in v.items()}
    return v


def _prompt_size(body: Mapping[str, Any]) -> int | None:
    messages = body.get("messages")
    if isinstance(messages, list):
        return count_chat(m for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    return count_text(prompt) if isinstance(prompt, str) else None


def redact(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """The body as written under redaction ``mode`` (``none``, ``hash`` or ``drop``)."""
    if mode == "none":
        return body
    if mode == "drop":
        return {k: v for k, v in body.items() if k not in _PROMPT_KEYS}
    return {k: (_hash_value(v) if k in _PROMPT_KEYS else v) for k, v in body.items()}


class CaptureWriter:
    """Writes finished requests to the capture file in the background (see module doc)."""

    def __init__(self, settings: CaptureSettings, *, on_drop: Callable[[], None]) -> None:
        self._settings = settings
        self._on_drop = on_drop
        self._allow = frozenset(h.lower() for h in settings.headers) - _SECRET_HEADERS
        # Sampling by request id: deterministic, and the same id is kept or dropped everywhere.
        self._threshold = int(min(max(settings.sample_rate, 0.0), 1.0) * 2**32)
        self._queue: asyncio.Queue[CaptureEntry | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._fd = -1
        self._size = 0
        self._t0 = 0.0

    async def start(self) -> None:
        """Open the capture file (appending) and start the background writer."""
        loop = asyncio.get_running_loop()
        self._t0 = loop.time()
        self._fd = await asyncio.to_thread(self._open)
        self._queue = asyncio.Queue(maxsize=self._settings.queue_size)
        self._task = asyncio.create_task(self._run(), name="capture-writer")

    def record(self, entry: CaptureEntry) -> None:
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
        """Write everything queued, then close the file."""
        if self._queue is None or self._task is None:
            return
        if not self._task.done():
            await self._queue.put(None)
            await self._task
        self._queue = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

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
                    await asyncio.to_thread(self._write, lines)
                except OSError:
                    for _ in lines:
                        self._on_drop()

    def _line(self, e: CaptureEntry) -> bytes:
        try:
            body = orjson.loads(e.body) if e.body else {}
        except orjson.JSONDecodeError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        mode = self._settings.redaction
        prompt_tokens = e.prompt_tokens
        if mode == "drop" and prompt_tokens is None:
            prompt_tokens = _prompt_size(body)  # keep the size so a replay can synthesize
        rec = CaptureRecord(
            custom_id=e.request_id,
            url=e.url,
            body=redact(body, mode),
            t_offset_ms=(e.arrival - self._t0) * 1000.0,
            ts=iso_utc(e.arrival_wall),
            headers={k.lower(): v for k, v in e.headers.items() if k.lower() in self._allow},
            route=Route(e.policy, e.request_class, e.backend, e.failovers),
            resp=Response(
                status=e.status,
                stream=e.stream,
                finish_reason=e.finish_reason,
                prompt_tokens=prompt_tokens,
                completion_tokens=e.completion_tokens,
                error=e.error,
            ),
            obs=Observed(
                ttft_ms=None if e.ttft_s is None else e.ttft_s * 1000.0,
                tpot_ms=None if e.tpot_s is None else e.tpot_s * 1000.0,
                e2e_ms=None if e.e2e_s is None else e.e2e_s * 1000.0,
            ),
        )
        return dump_line(rec)

    # The methods below run in a worker thread; only the writer task calls them, one at a time.

    def _open(self) -> int:
        fd = os.open(self._settings.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(fd).st_size
        return fd

    def _write(self, lines: list[bytes]) -> None:
        limit = self._settings.rotate_bytes
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            if limit is not None and self._size + size + len(line) > limit:
                if chunk:
                    self._write_all(b"".join(chunk))
                    chunk, size = [], 0
                if self._size > 0:
                    self._rotate()
            chunk.append(line)
            size += len(line)
        if chunk:
            self._write_all(b"".join(chunk))

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._size += len(data)

    def _rotate(self) -> None:
        """``path`` becomes ``path.1``; older rotations move up one number."""
        path = self._settings.path
        n = 1
        while os.path.exists(f"{path}.{n}"):
            n += 1
        for k in range(n - 1, 0, -1):
            os.replace(f"{path}.{k}", f"{path}.{k + 1}")
        os.close(self._fd)
        os.replace(path, f"{path}.1")
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0
