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
