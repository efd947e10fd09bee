"""Incremental meter for OpenAI-style SSE streams.

Both the router (on every forwarded chunk) and the replayer (on every received chunk) feed
upstream bytes through :class:`StreamMeter`. It never re-encodes what it forwards: it finds
line and event boundaries with ``bytes.find``, and JSON-decodes (orjson) only the events it
must read: those that may carry the first content (every content event when tracking gaps),
and those with a non-null ``finish_reason``, ``usage`` or ``error``, which a byte pattern that
tolerates JSON whitespace picks out. What it reads it checks: the upstream is not trusted, and
nothing it sends makes the meter raise (see :attr:`StreamMeter.protocol_errors`).

Definitions follow vLLM's serving benchmark: TTFT is the time to the first event carrying
content; ITL are the gaps between content events; TPOT is ``(e2e - ttft) / (tokens - 1)``.

The Responses API's typed events (``event: response.output_text.delta`` and a ``data`` line
whose ``type`` repeats it) are read by name, on a shortcut: a ``*.delta`` event like any
content event (content is a non-empty text, reasoning, refusal or function-call argument
delta), the last event (``response.completed``, ``.incomplete`` or ``.failed``, which ends
the stream instead of ``[DONE]``, its response carrying the usage as ``input_tokens`` and
``output_tokens``, the status and the error) and the ``error`` event read whole, the other
events (items and parts added and done) not read at all. Typed events sent without their
``event:`` line are read by their ``data`` alone, as chat chunks are: the last event is then
found by its usage or error.
"""

from __future__ import annotations

import re

from turnout.common.answer_fields import BAD, LAST_TYPES
from turnout.common.sse_events import EventMeter
from turnout.common.sse_lines import CR, LF, blank_line

MAX_EVENT_SIZE = 1 << 20
"""Default for :class:`StreamMeter`'s ``max_event_size``: 1 MiB."""

_BOM = b"\xef\xbb\xbf"
# A data field (lines ending in LF): "data", or "data:" and a value less one leading space.
_DATA_FIELD = re.compile(rb"^data(?::[ ]?([^\n]*))?$", re.MULTILINE)
# What the end of the last chunk left pending. A CR: an LF starting the next chunk is its second
# byte, and belongs with it to the held-back event, an event returned, or one dropped. Or, at
# the stream's start, whether it begins with a byte order mark.
_CR_KEPT = 1
_CR_DROPPED = 2
_FRESH = 3
_FAILED = 4  # nothing more is read

_DATA = b"data:"
_EVENT = b"event:"
_DELTA = b".delta"
# The names of the typed events read whole: the last ones and the error event.
_READ_NAMES = frozenset({t.encode() for t in LAST_TYPES} | {b"error"})


class StreamMeter(EventMeter):
    """Feeds on raw SSE bytes in any split; remembers only what the figures need.

    Framing follows the WHATWG server-sent events parser: a line ends with CRLF, LF or CR
    (mixed freely, split anywhere, a CR at the end of one chunk and its LF at the start of the
    next included), an event ends at an empty line, and only ``data`` fields are read (several
    ``data`` lines are joined with LF; comments and other fields are forwarded, not metered).
    What the data says is metered by :class:`turnout.common.sse_events.EventMeter` (its
    ``keep_itl``, ``strip_usage``, ``track_gaps`` and ``choices``; a usage-only event dropped
    with ``strip_usage`` is left out of what :meth:`feed` returns).

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
    """

    __slots__ = ("_bol", "_bom", "_buf", "_edge", "_limit", "failure")

    def __init__(
        self,
        start: float,
        *,
        keep_itl: bool = False,
        strip_usage: bool = False,
        track_gaps: bool = True,
        max_event_size: int = MAX_EVENT_SIZE,
        choices: int = 1,
    ) -> None:
        if max_event_size < 1:
            raise ValueError(f"max_event_size must be positive, not {max_event_size}")
        super().__init__(
            start,
            keep_itl=keep_itl,
            strip_usage=strip_usage,
            track_gaps=track_gaps,
            choices=choices,
        )
        self._limit = max_event_size
        self._buf = bytearray()  # the event still arriving: never longer than _limit
        self._bol = True  # the next byte starts a line
        self._edge = _FRESH  # what the last chunk's end left pending (see _CR_KEPT)
        self._bom = False  # the first event starts with a BOM (to be ignored)
        self.failure: str | None = None
        """Why the stream cannot go on (an event over ``max_event_size``), else None."""

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
                    self._bol = True  # also when the BOM came split over chunks
            elif data[0] == LF:  # the second byte of a CRLF: not a line ending of its own
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
                elif i + 1 < n and data[i + 1] == LF:
                    t = i + 1
                    one = pos == start and not buf  # the event is the line data[start:i]
                else:
                    t = data.find(b"\n\n", i)
                    if t < 0:
                        break
                    t += 1
                    one = False
            else:
                if bol and pos < n and data[pos] in (LF, CR):
                    t = pos
                else:
                    t = blank_line(data, pos)
                    if t < 0:
                        break
                one = False
            if data[t] == LF:
                end = t + 1
            elif t + 1 < n:
                end = t + 2 if data[t + 1] == LF else t + 1
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
                if not one:
                    keep = self._event(data, start, t, now)
                elif data.startswith(_DATA, start):
                    a = start + 6 if data[start + 5] == 0x20 else start + 5
                    keep = self._payload(data[a : t - 1], now)
                else:  # a comment (": keep-alive") has nothing to read
                    keep = data[start] == 0x3A or self._event(data, start, t, now)
                if not keep:
                    if out is None:
                        out = []
                    if start > run:
                        out.append(data[run:start])
                    run = end
            pos = start = end
            if end == n:
                if data[t] == CR:
                    self._edge = _CR_KEPT if keep else _CR_DROPPED
                break
            bol = True
        if start < n:  # the start of an event still arriving
            if len(buf) + n - start > self._limit:
                return self._too_large(data, run, start, out)
            buf += data[start:] if start else data
            last = data[n - 1]
            self._bol = pos == n or last in (LF, CR)  # pos == n: just after a BOM
            if last == CR:
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

    def _event(self, buf: bytes, s: int, t: int, now: float) -> bool:
        """Meter the event whose lines are ``buf[s:t]``; False if it must not be forwarded."""
        if buf.startswith(_DATA, s):  # one `data:` line (the usual event) is quicker to read
            e = t - 2 if buf[t - 1] == LF and buf[t - 2] == CR else t - 1
            if buf.find(b"\n", s, e) < 0 and buf.find(b"\r", s, e) < 0:
                return self._payload(buf[s + 6 if buf[s + 5] == 0x20 else s + 5 : e], now)
        elif buf.startswith(_EVENT, s):  # a typed event: `event: NAME`, then one `data:` line
            e = t - 1
            n = buf.find(b"\n", s, e)
            if (
                n > 0
                and buf.startswith(_DATA, n + 1)
                and buf.find(b"\n", n + 1, e) < 0
                and buf.find(b"\r", s, e) < 0
            ):
                return self._typed_event(buf, s, n, e, now)
        if self._bom:
            self._bom = False
            s += 3  # the first event starts with it
        lines = buf[s:t]
        if b"\r" in lines:
            lines = lines.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        values = _DATA_FIELD.findall(lines)
        if not values:
            return True  # comments (": keep-alive") or fields we do not meter
        return self._payload(b"\n".join(values), now)

    def _typed_event(self, buf: bytes, s: int, n: int, e: int, now: float) -> bool:
        """Meter the typed event ``event: NAME`` (``buf[s:n]``) whose one data line ends at
        ``e``, by its name: a delta like any content event, the last and error events read
        whole, and the rest (framing: items and parts added and done) not at all."""
        a = n + 7 if buf[n + 6] == 0x20 else n + 6  # where the data's value starts
        if buf.endswith(_DELTA, s, n):
            if self._track_gaps or self.first_content is None:
                return self._payload(buf[a:e], now)
            # A later delta carries nothing the figures need (usage, error and the end come
            # in the last event): counted, not read.
            self.data_events += 1
            self.last_event = now
            return True
        self.last_event = now
        if buf[s + 6 : n].strip() in _READ_NAMES:
            doc = self._parse(buf[a:e])
            if isinstance(doc, dict):
                self._typed(doc.get("type"), doc)
            elif doc is not BAD:
                self._count("bad_json")
        return True
