"""The router's background capture writer.

The request path only calls :meth:`CaptureWriter.record`, which samples and puts the entry on
a bounded queue without blocking; a full queue drops the entry and calls ``on_drop`` (the
router counts it in ``switchyard_capture_dropped_total``). A background task drains the queue,
redacts and serialises to capture lines (see :mod:`common.capture`), and a worker thread
pipes each batch to a small sink process (``python -m router.observe.capture``) that owns the file.

Why a separate process: a ``kill -9`` can cut a large ``write(2)`` to a regular file short,
tearing a line. The sink copies only complete lines from the pipe to the file, so when the
router dies mid-write the sink sees EOF, drops the incomplete tail and exits: the file loses
at most the lines in flight and never holds half a line. Nothing waits in user-space buffers,
so lines reach the file as soon as the writer task has them (well within a second).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from common.capture import CaptureRecord, Observed, Response, Route, dump_line, iso_utc
from common.tokens import count_chat, count_text
from router.config.parse import CaptureSettings

# Never written, whatever the allow-list says.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
# The prompt-bearing keys of the OpenAI request bodies the router serves.
_PROMPT_KEYS = ("messages", "prompt", "input", "suffix")
# Keys whose string values are structure, not text: kept as they are under `hash`.
_STRUCTURE_KEYS = frozenset({"role", "type", "id", "tool_call_id"})
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
    tenant: str | None = None
    """The API key's capture id (a keyed hash; never the key or its name)."""


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
    if isinstance(v, dict):  # every text inside a message (content, tool-call arguments, ...)
        return {k: (x if k in _STRUCTURE_KEYS else _hash_value(x)) for k, x in v.items()}
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
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._t0 = 0.0

    async def start(self) -> None:
        """Start the file sink process and the background writer task."""
        self._t0 = time.monotonic()
        self._proc = await asyncio.to_thread(self._spawn)
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
                    await asyncio.to_thread(_write_all, self._pipe, b"".join(lines))
                except OSError:  # the sink is gone
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
            route=Route(e.policy, e.request_class, e.backend, e.failovers, e.tenant),
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

    def _spawn(self) -> subprocess.Popen[bytes]:
        s = self._settings
        # Fail at startup, with the OS's reason, if the file cannot be opened for appending.
        os.close(_open_append(s.path))
        argv = [sys.executable, "-m", "router.observe.capture", s.path, str(s.rotate_bytes or 0)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True)
        assert proc.stdin is not None
        self._pipe = proc.stdin.fileno()
        return proc


class _Sink:
    """The file side, in its own process: whole lines in, whole lines out, with rotation.

    Several sinks may share one file (``router serve --workers N`` runs one writer per
    worker): each write holds an exclusive ``flock`` on the current file, sizes come from the
    file itself, and a sink whose file was rotated away by a sibling follows the path to the
    new file before writing.
    """

    def __init__(self, path: str, rotate_bytes: int) -> None:
        self._path = path
        self._limit = rotate_bytes
        self._fd = _open_append(path)

    def run(self, fd: int) -> None:
        """Copy complete lines from ``fd`` until EOF; an incomplete last line is discarded."""
        pending = b""
        while chunk := os.read(fd, 1 << 20):
            data = pending + chunk if pending else chunk
            cut = data.rfind(b"\n") + 1
            pending = data[cut:]
            if cut:
                self._lines(data[:cut])
        os.close(self._fd)

    def _lines(self, data: bytes) -> None:
        self._lock_current()
        try:
            size = os.fstat(self._fd).st_size
            if not self._limit or size + len(data) <= self._limit:
                _write_all(self._fd, data)
                return
            for line in data.splitlines(keepends=True):
                if size and size + len(line) > self._limit:
                    self._rotate()
                    # a sibling may have written to the new file before we locked it
                    size = os.fstat(self._fd).st_size
                _write_all(self._fd, line)
                size += len(line)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _lock_current(self) -> None:
        """Lock our file; if ``path`` now names another file (rotated), follow it first."""
        while True:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            mine = os.fstat(self._fd)
            try:
                named = os.stat(self._path)
                if (named.st_ino, named.st_dev) == (mine.st_ino, mine.st_dev):
                    return
            except FileNotFoundError:
                pass
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = _open_append(self._path)

    def _rotate(self) -> None:
        """``path`` becomes ``path.1``; older rotations move up one number. Called locked."""
        path = self._path
        n = 1
        while os.path.exists(f"{path}.{n}"):
            n += 1
        for k in range(n - 1, 0, -1):
            os.replace(f"{path}.{k}", f"{path}.{k + 1}")
        os.replace(path, f"{path}.1")
        old = self._fd
        self._fd = _open_append(path)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        fcntl.flock(old, fcntl.LOCK_UN)
        os.close(old)


def _open_append(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


if __name__ == "__main__":
    # Own session (see _spawn): a Ctrl-C or group kill reaches only the router, whose exit
    # closes the pipe; the sink then finishes the file on EOF.
    _Sink(sys.argv[1], int(sys.argv[2])).run(0)
