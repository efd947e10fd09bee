"""A reference for SSE framing (the WHATWG EventSource parser), and a meter that records."""

from __future__ import annotations

import re

from turnout.common.sse import StreamMeter

_EOL = re.compile(rb"\r\n|\r|\n")


def spec_events(raw: bytes) -> list[bytes]:
    """The ``data`` of each event an EventSource would dispatch for the stream ``raw``.

    Written straight from the spec's steps (a leading byte order mark is dropped; lines end in
    CRLF, LF or CR; an empty line dispatches; ``data`` values are joined with LF; an event the
    stream ends in the middle of is not dispatched), with none of the meter's shortcuts.
    """
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    events: list[bytes] = []
    data: list[bytes] | None = None
    for line in _EOL.split(raw)[:-1]:  # the last piece is an unfinished line
        if not line:
            if data is not None:
                events.append(b"\n".join(data))
            data = None
        elif not line.startswith(b":"):
            name, _, value = line.partition(b":")
            if name == b"data":
                data = [*(data or []), value.removeprefix(b" ")]
    return events


class Recorder(StreamMeter):
    """A meter that also lists the ``data`` of every event it dispatched."""

    __slots__ = ("seen",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.seen: list[bytes] = []

    def _payload(self, payload: bytes, now: float) -> bool:
        self.seen.append(payload)
        return super()._payload(payload, now)

    def _typed_event(self, buf: bytes, s: int, n: int, e: int, now: float) -> bool:
        if not buf.endswith(b".delta", s, n):  # a delta's data reaches _payload
            self.seen.append(buf[n + 7 if buf[n + 6] == 0x20 else n + 6 : e])
        return super()._typed_event(buf, s, n, e, now)
