"""Property test: any split of a stream, at any arrival times, meters like the whole events.

The reference feeds each event whole, stamped with the time its last byte arrived; the meter
fed the same bytes in arbitrary chunks must report exactly the same figures.
"""

from __future__ import annotations

import itertools
import json

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.common.sse_spec import Recorder, spec_events
from turnout.common.answer_fields import MAX_USAGE_TOKENS, PROTOCOL_ERRORS
from turnout.common.sse import MAX_EVENT_SIZE, StreamMeter


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


def _spaced(event: bytes) -> bytes:
    """``event`` with its JSON written with a space after every , and : (Python's json)."""
    if not event.startswith(b"data: {"):
        return event
    return b"data: " + json.dumps(orjson.loads(event[6:-2])).encode() + b"\n\n"


@given(body=st.lists(events, max_size=25), strip=st.booleans())
def test_json_spacing_does_not_change_what_is_metered_or_stripped(
    body: list[bytes], strip: bool
) -> None:
    compact = StreamMeter(0.0, keep_itl=True, strip_usage=strip)
    spaced = StreamMeter(0.0, keep_itl=True, strip_usage=strip)
    for i, event in enumerate(body):
        assert bool(compact.feed(event, float(i))) == bool(spaced.feed(_spaced(event), float(i)))
    assert compact.figures(99.0) == spaced.figures(99.0)


# What a hostile upstream may send: any bytes, or SSE and JSON pieces in any order.
PIECES = (b"\r", b"\n", b"\r\n", b"data:", b"data: ", b":", b" ", b"x", b"\xff", b"\xef\xbb\xbf",
          b"{", b"}", b"[", b"]", b",", b'"', b"1", b"-1", b'"s"', b'"\xff"', b"null", b"[DONE]",
          b'"usage":', b'"prompt_tokens":', b'"completion_tokens":', b'"choices":[]',
          b'"finish_reason":', b'"content":"a"', b'"error":')  # fmt: skip
LINES = (b"", b"", b"data: x", b"data", b": c", b"id: 1", b"x\xff", b'data: {"content":"a"}')
hostile = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(PIECES), max_size=150).map(b"".join),
    st.lists(st.tuples(st.sampled_from(LINES), st.sampled_from(ENDINGS)), max_size=80).map(
        lambda lines: b"".join(line + eol for line, eol in lines)
    ),
)


@settings(max_examples=500)
@example(raw=b"\xef\xbb\xbf\r", cuts=[1], limit=3, strip=False)  # a BOM split over chunks
@given(
    raw=hostile,
    cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=40),
    limit=st.integers(min_value=1, max_value=80) | st.just(MAX_EVENT_SIZE),
    strip=st.booleans(),
)
def test_hostile_bytes_never_raise_and_stay_bounded(
    raw: bytes, cuts: list[int], limit: int, strip: bool
) -> None:
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    split = Recorder(0.0, strip_usage=strip, max_event_size=limit)
    out = []
    for a, b in itertools.pairwise(points):
        out.append(split.feed(raw[a:b], 1.0))
        assert len(split._buf) <= limit
    forwarded = b"".join(out) + split.flush()
    whole = Recorder(0.0, strip_usage=strip, max_event_size=limit)
    assert forwarded == whole.feed(raw, 1.0) + whole.flush()
    assert split.seen == whole.seen
    assert (split.failure, split.protocol_errors) == (whole.failure, whole.protocol_errors)
    assert split.figures(2.0) == whole.figures(2.0)
    expected = spec_events(raw)
    if split.failure is None:
        assert split.seen == expected
        assert strip or forwarded == raw
    else:
        assert split.seen == expected[: len(split.seen)]
        assert strip or raw.startswith(forwarded)
        assert split.protocol_errors["event_too_large"] == 1
    assert set(split.protocol_errors) <= set(PROTOCOL_ERRORS)
    _assert_sane(split)


def _assert_sane(meter: StreamMeter) -> None:
    """Whatever was received, the figures have the types the router's bookkeeping expects."""
    for n in (meter.prompt_tokens, meter.completion_tokens):
        assert n is None or (type(n) is int and 0 <= n <= MAX_USAGE_TOKENS)
    assert meter.finish_reason is None or isinstance(meter.finish_reason, str)
    assert meter.error is None or isinstance(meter.error, dict)
    fig = meter.figures(3.0)
    assert fig.tpot is None or isinstance(fig.tpot, float)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)
usages = json_values | st.fixed_dictionaries(
    {}, optional={"prompt_tokens": json_values, "completion_tokens": json_values}
)


@settings(max_examples=300)
@given(usage=usages, finish=json_values, strip=st.booleans())
def test_malformed_usage_and_finish_never_raise(usage: object, finish: object, strip: bool) -> None:
    def ev(doc: object) -> bytes:
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    finish_ev = ev({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    usage_ev = ev({"choices": [], "usage": usage})
    meter = StreamMeter(0.0, strip_usage=strip)
    out = meter.feed(finish_ev + usage_ev + b"data: [DONE]\n\n", 1.0)
    _assert_sane(meter)
    assert meter.done
    assert (usage_ev in out) is not (strip and usage is not None)
    body = StreamMeter(0.0)
    body.feed_body(
        json.dumps({"choices": [{"finish_reason": finish}], "usage": usage}).encode(), 1.0
    )
    _assert_sane(body)
    assert (body.prompt_tokens, body.completion_tokens) == (
        meter.prompt_tokens,
        meter.completion_tokens,
    )
