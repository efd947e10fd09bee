"""The router's background capture writer.

The request path only calls :meth:`CaptureWriter.record`, which samples and puts the finished
request on a queue bounded in requests (``queue_size``) and in bytes (``queue_bytes``: the
request bodies and headers the queued requests hold) without blocking; a full queue drops it
and calls ``on_drop`` (the router counts it in ``turnout_capture_dropped_total{reason}``). A
background task drains the queue and hands each batch to a worker thread, which derives each
request's record (parsing its body there, off the event loop), redacts it
(router.observe.redact), serialises it to a capture line (turnout.common.capture) and pipes
the lines to the sink process (router.observe.sink) that owns the file, as they are made (a
write per :data:`WRITE_BYTES` of lines). A request's bytes count against ``queue_bytes``
until its batch is piped, so what a crash of the router can lose is bounded by the queue's
bounds. A sink that dies is replaced at the next write (at most once a second).

No request that reaches the writer escapes the file: a record that cannot be written as it
is (a body nested deeper than a line can be, text that is not UTF-8) is written with its body
replaced and counted by ``on_degraded``.

One secret keys both the ``hash`` filler and sampling, so that neither can be predicted by a
client: ``capture.hash_key_env`` or ``hash_key_file``, the same in every worker and replica;
without one, a random key per process.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Protocol

import orjson

from router.config.model import CaptureSettings, credential_header
from router.observe.redact import prompt_size, redact, redact_error
from router.observe.sink import open_append
from turnout.common.capture import CaptureRecord, Response, dump_line

log = logging.getLogger("router")
_BATCH = 512  # requests the writer takes from the queue at once
WRITE_BYTES = 64 * 1024
"""Lines gathered before a write to the sink's pipe (a longer line is written alone)."""
_RESTART_SECONDS = 1.0  # a dead sink is replaced at most this often
# The `_turnout` note of a line written with its body replaced.
_NOT_ENCODABLE = "body not encodable"


class Capturable(Protocol):
    """A finished request that can be written as a capture line (router.proxy.exchange)."""

    @property
    def request_id(self) -> str:
        """The request's id (``X-Request-Id``, or the router's), the line's ``custom_id``."""
        ...

    @property
    def capture_bytes(self) -> int:
        """What the request holds until its line is written: its body and headers as
        received, in bytes (what ``queue_bytes`` counts)."""
        ...

    def capture_record(self, t0: float) -> CaptureRecord:
        """The request's record before redaction; ``t_offset_ms`` counts from ``t0``. Called
        in the writer's thread: it may parse the body."""
        ...


def _subkey(secret: bytes, purpose: bytes) -> bytes:
    """A key for one purpose, so that the filler and the sample reveal nothing of each other."""
    return hmac.new(secret, purpose, hashlib.sha256).digest()


def _utf8(s: str) -> str:
    return s.encode("utf-8", "replace").decode("utf-8")


def _encodes(value: object) -> bool:
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


class CaptureWriter:
    """Writes finished requests to the capture file in the background (see module doc)."""

    def __init__(
        self,
        settings: CaptureSettings,
        *,
        on_drop: Callable[[str], None],
        on_degraded: Callable[[str], None],
    ) -> None:
        """``on_drop(reason)``: a request not written (``queue_full``, ``queue_bytes``,
        ``not_running``, ``sink_gone``, ``unencodable``, ``error``); ``on_degraded(reason)``:
        one written with its body replaced (``unencodable``)."""
        self._settings = settings
        self._on_drop = on_drop
        self._on_degraded = on_degraded
        # Never a credential, whatever the allow-list says (the parser refuses them too).
        self._allow = frozenset(h.lower() for h in settings.headers if not credential_header(h))
        secret = settings.hash_key
        if secret is None:
            secret = secrets.token_bytes(32)
            if settings.redaction == "hash":
                log.warning(
                    "capture: redaction hash without hash_key_env or hash_key_file: a random "
                    "key for this process, so the same text hashes differently in other "
                    "workers, replicas and after a restart"
                )
        self._text_key = _subkey(secret, b"turnout capture text")
        self._sample_key = _subkey(secret, b"turnout capture sample")
        self._threshold = int(min(max(settings.sample_rate, 0.0), 1.0) * 2**32)
        self._queue: asyncio.Queue[tuple[Capturable, int] | None] | None = None
        self._queued = 0  # bytes of the requests queued or in the writer's hands
        self._task: asyncio.Task[None] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe = -1
        self._restart_at = 0.0
        self._t0 = 0.0

    async def start(self) -> None:
        """Start the file sink process and the background writer task."""
        self._t0 = time.monotonic()
        self._proc = await asyncio.to_thread(self._spawn)
        self._queue = asyncio.Queue(maxsize=self._settings.queue_size)
        self._task = asyncio.create_task(self._run(), name="capture-writer")

    def sampled(self, request_id: str) -> bool:
        """Whether ``request_id`` is in the sample: a keyed hash, so a client cannot pick ids
        that stay out of it; the same id is in or out in every worker sharing the key."""
        if self._threshold >= 2**32:
            return True
        digest = hashlib.blake2b(
            request_id.encode("utf-8", "surrogatepass"), key=self._sample_key, digest_size=4
        ).digest()
        return int.from_bytes(digest, "big") < self._threshold

    def record(self, entry: Capturable) -> None:
        """Queue ``entry`` if sampled; never blocks or raises; a full queue calls ``on_drop``."""
        if not self.sampled(entry.request_id):
            return
        queue = self._queue
        if queue is None or self._task is None or self._task.done():
            self._on_drop("not_running")
            return
        size = entry.capture_bytes
        if self._queued + size > self._settings.queue_bytes:
            self._on_drop("queue_bytes")
            return
        try:
            queue.put_nowait((entry, size))
        except asyncio.QueueFull:
            self._on_drop("queue_full")
            return
        self._queued += size

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
            entries = [e for e, _ in filter(None, batch)]
            closing = len(entries) < len(batch)
            if entries:
                try:
                    await asyncio.to_thread(self._write, entries)
                finally:
                    self._queued -= sum(size for _, size in filter(None, batch))

    # The methods below run in a worker thread; only the writer task calls them, one at a time.

    def _write(self, entries: list[Capturable]) -> None:
        lines: list[bytes] = []
        held = 0
        for entry in entries:
            try:
                line = self._line(entry)
            except Exception:  # a malformed entry must not stop the writer
                log.exception("capture: a request's record failed")
                self._on_drop("error")
                continue
            if line is not None:
                lines.append(line)
                held += len(line)
            if held >= WRITE_BYTES:
                self._pipe_lines(lines)
                lines, held = [], 0
        if lines:
            self._pipe_lines(lines)

    def _pipe_lines(self, lines: list[bytes]) -> None:
        data = lines[0] if len(lines) == 1 else b"".join(lines)
        view, sent = memoryview(data), 0
        try:
            while sent < len(data):
                sent += os.write(self._pipe, view[sent:])
        except OSError:  # the sink is gone, and with it the lines not wholly in its pipe
            for end in itertools.accumulate(map(len, lines)):
                if end > sent:
                    self._on_drop("sink_gone")
            self._restart()

    def _restart(self) -> None:
        """Replace a dead sink (it cuts a line the old one may have left half written)."""
        now = time.monotonic()
        if now < self._restart_at:
            return
        self._restart_at = now + _RESTART_SECONDS
        old = self._proc
        self._pipe = -1  # closed below: never write to a number the process may reuse
        if old is not None:
            assert old.stdin is not None
            old.stdin.close()
            try:
                old.wait(_RESTART_SECONDS)
            except subprocess.TimeoutExpired:
                old.kill()
                old.wait()
            log.warning("capture: the sink process ended (%s); starting a new one", old.returncode)
        try:
            self._proc = self._spawn()
        except OSError as exc:
            log.error("capture: cannot start a new sink: %s", exc)

    def _line(self, source: Capturable) -> bytes | None:
        rec = source.capture_record(self._t0)
        mode = self._settings.redaction
        resp = rec.resp
        if mode == "drop" and resp is not None and resp.prompt_tokens is None:
            # Keep the prompt's size so that a replay can synthesize one as long.
            resp = replace(resp, prompt_tokens=prompt_size(rec.body))
        if resp is not None and resp.error is not None:
            resp = replace(resp, error=redact_error(resp.error, mode, self._text_key))
        headers = {k.lower(): v for k, v in rec.headers.items() if k.lower() in self._allow}
        try:
            body = redact(rec.body, mode, self._text_key)
            return dump_line(replace(rec, body=body, headers=headers, resp=resp))
        except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
            pass  # not writable as it is: written with the body replaced
        try:
            line = dump_line(_stand_in(rec, headers, resp))
        except (TypeError, ValueError):
            self._on_drop("unencodable")
            return None
        self._on_degraded("unencodable")
        return line

    def _spawn(self) -> subprocess.Popen[bytes]:
        s = self._settings
        # Fail at startup, with the OS's reason, if the file cannot be opened for appending.
        os.close(open_append(s.path))
        argv = [sys.executable, "-m", "router.observe.sink", s.path, str(s.rotate_bytes or 0)]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True)
        assert proc.stdin is not None
        self._pipe = proc.stdin.fileno()
        return proc


def _stand_in(
    rec: CaptureRecord, headers: Mapping[str, str], resp: Response | None
) -> CaptureRecord:
    """``rec`` as it can be written: the body replaced by a note (and the model), every other
    string made UTF-8 (an id or header with undecodable bytes), and the prompt's size kept
    so that a replay still synthesizes one as long."""
    body: dict[str, Any] = {}
    model = rec.body.get("model")
    if isinstance(model, str):
        body["model"] = _utf8(model)
    body["_turnout"] = _NOT_ENCODABLE
    if resp is not None:
        if resp.prompt_tokens is None:
            resp = replace(resp, prompt_tokens=prompt_size(rec.body))
        if resp.finish_reason is not None:
            resp = replace(resp, finish_reason=_utf8(resp.finish_reason))
        if resp.error is not None and not _encodes(resp.error):
            resp = replace(resp, error={"message": "error not encodable"})
    return replace(
        rec,
        custom_id=_utf8(rec.custom_id),
        body=body,
        headers={_utf8(k): _utf8(v) for k, v in headers.items()},
        resp=resp,
    )
