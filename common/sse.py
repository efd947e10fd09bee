"""Incremental meter for OpenAI-style SSE streams.

Both the router (on every forwarded chunk) and the replayer (on every received chunk) feed
upstream bytes through :class:`StreamMeter`. It never re-encodes what it forwards: it finds
event boundaries with ``bytes.find`` and looks inside an event only as far as needed to tell
a content event (first token, inter-token gaps) from the role, usage, error and ``[DONE]``
events. Only the usage and error events, which arrive once per stream, are JSON-decoded.

Definitions follow vLLM's serving benchmark: TTFT is the time to the first event carrying
content; ITL are the gaps between content events; TPOT is ``(e2e - ttft) / (tokens - 1)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

_DATA = b"data:"
_DONE = b"[DONE]"
# A key followed by a non-empty string (or, for tool calls, a list) marks a content event.
_CONTENT_KEYS = (b'"content":', b'"text":', b'"reasoning_content":', b'"tool_calls":')
_USAGE = b'"usage":'
_FINISH = b'"finish_reason":"'
_ERROR = b'{"error"'


def _has_value(event: bytes, key: bytes) -> bool:
    """True if ``key`` occurs in ``event`` followed by a non-empty string or a list."""
    start = 0
    while True:
        i = event.find(key, start)
        if i < 0:
            return False
        j = i + len(key)
        if j < len(event) and event[j] == 0x20:  # tolerate `"key": value`
            j += 1
        if j + 1 < len(event):
            c = event[j]
            if c == 0x22 and event[j + 1] != 0x22:  # "x… (non-empty string)
                return True
            if c == 0x5B and event[j + 1] != 0x5D:  # [… (non-empty list)
                return True
        start = j


def is_content_event(payload: bytes) -> bool:
    """Whether one SSE ``data:`` payload carries generated content."""
    return any(_has_value(payload, key) for key in _CONTENT_KEYS)


@dataclass(slots=True)
class StreamFigures:
    """What a finished stream measured. Times are seconds relative to the request's start."""

    ttft: float | None
    e2e: float | None
    content_events: int
    itl_sum: float
    itls: list[float] | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    error: dict[str, object] | None
    done: bool

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None with fewer than two tokens)."""
        if self.ttft is None or self.e2e is None:
            return None
        tokens = self.completion_tokens or self.content_events
        if tokens < 2:
            return None
        return (self.e2e - self.ttft) / (tokens - 1)


class StreamMeter:
    """Feeds on raw SSE bytes in any split; remembers only what the figures need.

    ``strip_usage``: drop the usage-only event (``"choices":[]`` plus ``usage``) from what
    :meth:`feed` returns, for when the router asked the engine for usage on the client's
    behalf. In that mode only whole events are returned (call :meth:`flush` at the end of the
    stream for any unterminated tail); otherwise ``feed`` returns its input object unchanged
    (no copy).

    ``track_gaps``: look for content in every event (needed for ITL). The router passes False:
    after the first content event it only watches for the finish, usage, error and ``[DONE]``
    events, which roughly halves the per-chunk scan; its TPOT then comes from the usage figures.

    Events end with a blank line: ``\n\n``, or ``\r\n\r\n`` when the stream's first line
    ending is CRLF.
    """

    __slots__ = (
        "_buf",
        "_last_content",
        "_sep",
        "_start",
        "_strip_usage",
        "_track_gaps",
        "completion_tokens",
        "content_events",
        "done",
        "error",
        "finish_reason",
        "first_content",
        "itl_sum",
        "itls",
        "last_event",
        "prompt_tokens",
    )

    def __init__(
        self,
        start: float,
        *,
        keep_itl: bool = False,
        strip_usage: bool = False,
        track_gaps: bool = True,
    ) -> None:
        self._start = start
        self._strip_usage = strip_usage
        self._track_gaps = track_gaps or keep_itl
        self._sep: bytes | None = None
        self._buf = b""
        self._last_content: float | None = None
        self.first_content: float | None = None
        self.last_event: float | None = None
        self.content_events = 0
        self.itl_sum = 0.0
        self.itls: list[float] | None = [] if keep_itl else None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.finish_reason: str | None = None
        self.error: dict[str, object] | None = None
        self.done = False

    def feed(self, data: bytes, now: float) -> bytes:
        """Account for ``data`` received at ``now``; return the bytes to forward."""
        buf = self._buf + data if self._buf else data
        sep = self._sep
        if sep is None:
            eol = buf.find(b"\n")
            if eol < 0:
                self._buf = buf
                return b"" if self._strip_usage else data
            sep = self._sep = b"\r\n\r\n" if eol > 0 and buf[eol - 1] == 0x0D else b"\n\n"
        step = len(sep)
        out: list[bytes] | None = [] if self._strip_usage else None
        pos = 0
        while True:
            end = buf.find(sep, pos)
            if end < 0:
                break
            keep = self._event(buf[pos:end], now)
            if out is not None and keep:
                out.append(buf[pos : end + step])
            pos = end + step
        self._buf = buf[pos:] if pos < len(buf) else b""
        if out is None:
            return data
        return b"".join(out)

    def flush(self) -> bytes:
        """End of stream: the unterminated tail that ``strip_usage`` mode held back."""
        tail, self._buf = self._buf, b""
        return tail if self._strip_usage else b""

    def _event(self, event: bytes, now: float) -> bool:
        """Meter one event; return False if it must not be forwarded (stripped usage)."""
        i = event.find(_DATA)
        if i < 0:
            return True  # comment (": keep-alive") or a field we do not meter
        payload = event[i + 5 :].strip()
        self.last_event = now
        if payload == _DONE:
            self.done = True
            return True
        if payload.startswith(_ERROR):
            self.error = _decode_error(payload)
            return True
        if (self._track_gaps or self.first_content is None) and is_content_event(payload):
            if self.first_content is None:
                self.first_content = now
            else:
                gap = now - self._last_content  # type: ignore[operator]
                self.itl_sum += gap
                if self.itls is not None:
                    self.itls.append(gap)
            self._last_content = now
            self.content_events += 1
        f = payload.find(_FINISH)
        if f >= 0:
            f += len(_FINISH)
            self.finish_reason = payload[f : payload.find(b'"', f)].decode()
        u = payload.find(_USAGE)
        if u >= 0 and not payload[u + len(_USAGE) :].lstrip().startswith(b"null"):
            self._usage(payload)
            if self._strip_usage and b'"choices":[]' in payload:
                return False
        return True

    def _usage(self, payload: bytes) -> None:
        try:
            usage = orjson.loads(payload).get("usage") or {}
        except orjson.JSONDecodeError:
            return
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)

    def feed_body(self, body: bytes, now: float) -> None:
        """Meter a non-streamed JSON response that arrived whole at ``now``."""
        self.first_content = self.last_event = now
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if not isinstance(doc, dict):
            return
        if isinstance(doc.get("error"), dict):
            self.error = doc["error"]
        usage = doc.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self.finish_reason = choices[0].get("finish_reason")
        self.content_events = 1

    def figures(self, end: float | None = None) -> StreamFigures:
        """The stream's figures; ``end`` defaults to the last event's arrival."""
        finish = end if end is not None else self.last_event
        return StreamFigures(
            ttft=None if self.first_content is None else self.first_content - self._start,
            e2e=None if finish is None else finish - self._start,
            content_events=self.content_events,
            itl_sum=self.itl_sum,
            itls=self.itls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            finish_reason=self.finish_reason,
            error=self.error,
            done=self.done,
        )


def _decode_error(payload: bytes) -> dict[str, object]:
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {"message": payload.decode(errors="replace")}
    err = doc.get("error") if isinstance(doc, dict) else None
    return err if isinstance(err, dict) else {"message": str(err)}
