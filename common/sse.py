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

import re
from dataclasses import dataclass

import orjson

MAX_EVENT_SIZE = 1 << 20
"""Default for :class:`StreamMeter`'s ``max_event_size``: 1 MiB."""

_LF = 0x0A
_CR = 0x0D
_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"\r\n|\r|\n")
# What the end of the last chunk left pending. A CR: an LF starting the next chunk is its second
# byte, and belongs with it to the held-back event, an event returned, or one dropped. Or, at
# the stream's start, whether it begins with a byte order mark.
_CR_KEPT = 1
_CR_DROPPED = 2
_FRESH = 3
_FAILED = 4  # nothing more is read

PROTOCOL_ERRORS = ("event_too_large",)
"""The kinds :attr:`StreamMeter.protocol_errors` counts."""

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


def _blank_line(data: bytes, pos: int) -> int:
    """Where the first empty line after ``pos`` starts in ``data`` (CR, LF or CRLF endings).

    ``pos`` is not taken for a line start, and never falls between the CR and LF of a CRLF.
    Each line ending is found with ``bytes.find``, and each byte scanned once.
    """
    n = len(data)
    lf = data.find(b"\n", pos)
    cr = data.find(b"\r", pos)
    while lf >= 0 or cr >= 0:
        if cr < 0 or 0 <= lf < cr:
            nxt = lf + 1
        elif cr + 1 < n and data[cr + 1] == _LF:
            nxt = cr + 2
        else:
            nxt = cr + 1
        if nxt >= n:
            return -1
        c = data[nxt]
        if c in (_LF, _CR):
            return nxt
        if lf < nxt:
            lf = data.find(b"\n", nxt) if lf >= 0 else -1
        if cr < nxt:
            cr = data.find(b"\r", nxt) if cr >= 0 else -1
    return -1


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

    Framing follows the WHATWG server-sent events parser: a line ends with CRLF, LF or CR
    (mixed freely, split anywhere, a CR at the end of one chunk and its LF at the start of the
    next included), an event ends at an empty line, and only ``data`` fields are read (several
    ``data`` lines are joined with LF; comments and other fields are forwarded, not metered).

    :meth:`feed` returns whole events only: the bytes of an event still arriving are held back
    until its end (its client could not dispatch it earlier anyway), so that a stream cut short
    by the meter never leaves a half event before the error event that ends it. When a chunk
    ends on an event boundary and nothing is held back or dropped (the usual case), ``feed``
    returns its input object unchanged (no copy). Call :meth:`flush` at the end of the stream
    for an unterminated tail.

    **Bounded.** An event may be at most ``max_event_size`` bytes (its lines, without the empty
    line that ends it); what is held back never exceeds that, and each byte is scanned once
    however the event is split. An event over the limit is a protocol error: :attr:`failure`
    says why, ``protocol_errors["event_too_large"]`` counts it, the event is discarded, and from
    then on ``feed`` returns ``b""`` and keeps nothing. The caller must then end the stream:
    abort the upstream as a failed backend and end the client's stream with an error event
    (what was returned before is whole events, so that error event is received cleanly).

    ``strip_usage``: drop the usage-only event (``"choices":[]`` plus ``usage``) from what
    :meth:`feed` returns, for when the router asked the engine for usage on the client's
    behalf.

    ``track_gaps``: look for content in every event (needed for ITL). The router passes False:
    after the first content event it only watches for the finish, usage, error and ``[DONE]``
    events, which roughly halves the per-chunk scan; its TPOT then comes from the usage figures.
    """

    __slots__ = (
        "_bol",
        "_bom",
        "_buf",
        "_edge",
        "_last_content",
        "_limit",
        "_start",
        "_strip_usage",
        "_track_gaps",
        "completion_tokens",
        "content_events",
        "done",
        "error",
        "failure",
        "finish_reason",
        "first_content",
        "itl_sum",
        "itls",
        "last_event",
        "prompt_tokens",
        "protocol_errors",
    )

    def __init__(
        self,
        start: float,
        *,
        keep_itl: bool = False,
        strip_usage: bool = False,
        track_gaps: bool = True,
        max_event_size: int = MAX_EVENT_SIZE,
    ) -> None:
        if max_event_size < 1:
            raise ValueError(f"max_event_size must be positive, not {max_event_size}")
        self._start = start
        self._strip_usage = strip_usage
        self._track_gaps = track_gaps or keep_itl
        self._limit = max_event_size
        self._buf = bytearray()  # the event still arriving: never longer than _limit
        self._bol = True  # the next byte starts a line
        self._edge = _FRESH  # what the last chunk's end left pending (see _CR_KEPT)
        self._bom = False  # the first event starts with a BOM (to be ignored)
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
        self.failure: str | None = None
        """Why the stream cannot go on (an event over ``max_event_size``), else None."""
        self.protocol_errors: dict[str, int] = {}
        """What the upstream got wrong, by kind, with counts (see :data:`PROTOCOL_ERRORS`)."""

    def feed(self, data: bytes, now: float) -> bytes:
        """Account for ``data`` received at ``now``; return the bytes to forward (whole events)."""
        n = len(data)
        if not n:
            return b""
        buf = self._buf
        pos = start = run = 0  # scan position; start of the current event; of bytes to return
        edge = self._edge
        if edge:
            if edge == _FAILED:
                return b""
            self._edge = 0
            if edge == _FRESH:
                if self._check_bom(data):
                    pos = 3 - len(buf)  # the first line starts after it
            elif data[0] == _LF:  # the second byte of a CRLF: not a line ending of its own
                pos = 1
                if not buf:  # that CR ended the last event, so this LF is that event's
                    start = 1
                    if edge == _CR_DROPPED:
                        run = 1
        bol = self._bol
        plain = b"\r" not in data  # LF endings only (the usual case)
        out: list[bytes] | None = None
        while True:
            # t: where the empty line that ends the current event starts
            if plain:
                i = data.find(b"\n", pos)
                if i < 0:
                    break
                if i == pos and bol:
                    t = i
                    one = False
                elif i + 1 < n and data[i + 1] == _LF:
                    t = i + 1
                    one = pos == start and not buf  # the event is the line data[start:i]
                else:
                    t = data.find(b"\n\n", i)
                    if t < 0:
                        break
                    t += 1
                    one = False
            else:
                if bol and pos < n and data[pos] in (_LF, _CR):
                    t = pos
                else:
                    t = _blank_line(data, pos)
                    if t < 0:
                        break
                one = False
            if data[t] == _LF:
                end = t + 1
            elif t + 1 < n:
                end = t + 2 if data[t + 1] == _LF else t + 1
            else:
                end = n  # a CR last: an LF starting the next chunk will belong to it
            size = len(buf) + t - start
            if size > self._limit:
                return self._too_large(data, run, start, out)
            if buf:  # the first event of this chunk began in an earlier one (start is 0)
                buf += data if end == n else data[:end]
                event = bytes(buf)
                buf.clear()
                keep = self._event(event, 0, size, now)
                if keep:
                    out = [event]
                run = end
            else:
                if one and data.startswith(_DATA, start):
                    a = start + 6 if data[start + 5] == 0x20 else start + 5
                    keep = self._payload(data[a : t - 1], now)
                else:
                    keep = self._event(data, start, t, now)
                if not keep:
                    if out is None:
                        out = []
                    if start > run:
                        out.append(data[run:start])
                    run = end
            pos = start = end
            if end == n:
                if data[t] == _CR:
                    self._edge = _CR_KEPT if keep else _CR_DROPPED
                break
            bol = True
        if start < n:  # the start of an event still arriving
            if len(buf) + n - start > self._limit:
                return self._too_large(data, run, start, out)
            buf += data[start:] if start else data
            last = data[n - 1]
            self._bol = last in (_LF, _CR)
            if last == _CR:
                self._edge = _CR_KEPT
        else:
            self._bol = True
        if out is None:
            return data if run == 0 and start == n else data[run:start]
        if start > run:
            out.append(data[run:start])
        return out[0] if len(out) == 1 else b"".join(out)

    def flush(self) -> bytes:
        """End of stream: the unterminated tail that :meth:`feed` held back (not metered)."""
        tail = bytes(self._buf)
        self._buf.clear()
        return tail

    def _too_large(self, data: bytes, run: int, start: int, out: list[bytes] | None) -> bytes:
        """Give up on the stream: the event starting at ``start`` is over the limit."""
        self.failure = f"upstream sent an SSE event over {self._limit} bytes"
        self._edge = _FAILED
        self._count("event_too_large")
        self._buf = bytearray()  # release the memory, not just the length
        if out is None:
            return data[run:start]
        if start > run:
            out.append(data[run:start])
        return b"".join(out)

    def _check_bom(self, data: bytes) -> bool:
        """Whether the stream starts with a byte order mark (which the spec says to ignore)."""
        head = (bytes(self._buf) + data)[:3] if self._buf else data[:3]
        if len(head) < 3 and _BOM.startswith(head):
            self._edge = _FRESH  # not known yet
            return False
        self._bom = head == _BOM
        return self._bom

    def _count(self, kind: str) -> None:
        errors = self.protocol_errors
        errors[kind] = errors.get(kind, 0) + 1

    def _event(self, buf: bytes, s: int, t: int, now: float) -> bool:
        """Meter the event whose lines are ``buf[s:t]``; False if it must not be forwarded."""
        if buf.startswith(_DATA, s):  # one `data:` line (the usual event) is quicker to read
            e = t - 2 if buf[t - 1] == _LF and buf[t - 2] == _CR else t - 1
            if buf.find(b"\n", s, e) < 0 and buf.find(b"\r", s, e) < 0:
                return self._payload(buf[s + 6 if buf[s + 5] == 0x20 else s + 5 : e], now)
        if self._bom:
            self._bom = False
            s += 3  # the first event starts with it
        values = [
            line[5:].removeprefix(b" ") if line[4:5] == b":" else b""
            for line in _EOL.split(buf[s:t])
            if line.startswith(b"data") and (len(line) == 4 or line[4] == 0x3A)
        ]
        if not values:
            return True  # comments (": keep-alive") or fields we do not meter
        return self._payload(b"\n".join(values), now)

    def _payload(self, payload: bytes, now: float) -> bool:
        """Meter an event's data; False if the event must not be forwarded."""
        self.last_event = now
        if payload == _DONE or (len(payload) < 16 and payload.strip() == _DONE):
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
