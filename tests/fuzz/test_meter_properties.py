"""Property test: any split of a stream, at any arrival times, meters like the whole events.

The reference feeds each event whole, stamped with the time its last byte arrived; the meter
fed the same bytes in arbitrary chunks must report exactly the same figures.
"""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from common.sse import StreamMeter
from tests.common.sse_spec import Recorder, spec_events


def _ev(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


events = st.one_of(
    st.text(max_size=6).map(lambda t: _ev({"choices": [{"index": 0, "delta": {"content": t}}]})),
    st.text(max_size=6).map(lambda t: _ev({"choices": [{"index": 0, "text": t}]})),
    st.sampled_from(["stop", "length"]).map(
        lambda r: _ev({"choices": [{"index": 0, "delta": {}, "finish_reason": r}]})
    ),
    st.integers(0, 10**6).map(
        lambda n: _ev({"choices": [], "usage": {"prompt_tokens": n, "completion_tokens": n // 3}})
    ),
    st.just(_ev({"error": {"message": "boom", "type": "x", "param": None, "code": None}})),
    st.just(b": keep-alive\n\n"),
)


@settings(max_examples=300)
@given(
    body=st.lists(events, max_size=25).map(lambda es: [*es, b"data: [DONE]\n\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=40),
    strip=st.booleans(),
)
def test_any_split_meters_like_whole_events(
    body: list[bytes], cuts: list[int], strip: bool
) -> None:
    raw = b"".join(body)
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    chunks = [(raw[a:b], float(i)) for i, (a, b) in enumerate(itertools.pairwise(points))]
    split = StreamMeter(0.0, keep_itl=True, strip_usage=strip)
    forwarded = b"".join(split.feed(data, t) for data, t in chunks)
    # When does each event's last byte arrive?
    ends = list(itertools.accumulate(len(e) for e in body))
    reference = StreamMeter(0.0, keep_itl=True, strip_usage=strip)
    kept = []
    for event, end in zip(body, ends, strict=True):
        arrival = next(i for i, (_, b) in enumerate(itertools.pairwise(points)) if b >= end)
        kept.append(reference.feed(event, float(arrival)))
    assert split.figures(99.0) == reference.figures(99.0)
    assert forwarded == (b"".join(kept) if strip else raw)


ENDINGS = (b"\n", b"\r\n", b"\r")
OTHER_LINES = (b"event: message", b"id: 7", b": note", b"retry: 5")


@st.composite
def framed(draw: st.DrawFn, event: bytes) -> bytes:
    """``event`` with line endings drawn from CR, LF and CRLF, other fields, split data."""
    lines = event[:-2].split(b"\n")
    if lines[0].startswith(b"data: {") and b"," in lines[0] and draw(st.booleans()):
        i = lines[0].index(b",") + 1  # JSON split between two tokens: joined with LF, the same
        lines = [lines[0][:i], b"data: " + lines[0][i:]]
    lines = [*draw(st.lists(st.sampled_from(OTHER_LINES), max_size=2)), *lines]
    out = b"".join(line + draw(st.sampled_from(ENDINGS)) for line in lines)
    blank = draw(st.sampled_from(ENDINGS))
    if out.endswith(b"\r") and blank == b"\n":  # that CR and LF would be one line ending
        blank = b"\r\n"
    return out + blank


@settings(max_examples=300)
@given(
    body=st.lists(events.flatmap(framed), max_size=20).flatmap(
        lambda es: framed(b"data: [DONE]\n\n").map(lambda done: [*es, done])
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=40),
    strip=st.booleans(),
)
def test_mixed_line_endings_any_split_meter_like_whole_events(
    body: list[bytes], cuts: list[int], strip: bool
) -> None:
    raw = b"".join(body)
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    split = Recorder(0.0, keep_itl=True, strip_usage=strip)
    forwarded = b"".join(split.feed(raw[a:b], 1.0) for a, b in itertools.pairwise(points))
    reference = Recorder(0.0, keep_itl=True, strip_usage=strip)
    kept = b"".join(reference.feed(event, 1.0) for event in body)
    assert split.seen == reference.seen == spec_events(raw)
    assert split.figures(9.0) == reference.figures(9.0)
    assert forwarded == (kept if strip else raw)
    assert split.flush() == b""
