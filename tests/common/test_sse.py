"""The stream meter gives the same figures however the bytes are split."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given
from hypothesis import strategies as st

from common.sse import StreamMeter, is_content_event


def _chat_stream(tokens: list[str], *, usage: bool) -> list[bytes]:
    def ev(doc: object) -> bytes:
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    events = [ev({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    events.append(b": keep-alive\n\n")
    for t in tokens:
        delta = {"index": 0, "delta": {"content": t}, "finish_reason": None}
        events.append(ev({"choices": [delta]}))
    events.append(ev({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    if usage:
        u = {"prompt_tokens": 7, "completion_tokens": len(tokens), "total_tokens": 7 + len(tokens)}
        events.append(ev({"choices": [], "usage": u}))
    events.append(b"data: [DONE]\n\n")
    return events


def test_content_detection() -> None:
    assert is_content_event(b'{"choices":[{"delta":{"content":"hi"}}]}')
    assert is_content_event(b'{"choices":[{"text":"hi"}]}')
    assert not is_content_event(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}')
    assert not is_content_event(b'{"choices":[{"delta":{},"finish_reason":"stop"}]}')
    # an escaped key inside a string is not a key
    assert not is_content_event(b'{"choices":[{"delta":{"content":""}}],"x":"\\"text\\":\\"y"}')


def test_figures_and_strip() -> None:
    events = _chat_stream(["a", "b", "c"], usage=True)
    meter = StreamMeter(0.0, keep_itl=True, strip_usage=True)
    out = b"".join(meter.feed(e, float(i)) for i, e in enumerate(events))
    fig = meter.figures()
    assert fig.ttft == 2.0
    assert fig.itls == [1.0, 1.0]
    assert fig.completion_tokens == 3 and fig.prompt_tokens == 7
    assert fig.finish_reason == "length"
    assert fig.done
    assert out == b"".join(_chat_stream(["a", "b", "c"], usage=False))


@given(
    tokens=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30),
)
def test_any_split_same_figures(tokens: list[str], cuts: list[int]) -> None:
    raw = b"".join(_chat_stream(tokens, usage=True))
    whole = StreamMeter(0.0)
    whole.feed(raw, 1.0)
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    split = StreamMeter(0.0, strip_usage=True)
    forwarded = b"".join(split.feed(raw[a:b], 1.0) for a, b in itertools.pairwise(points))
    a, b = whole.figures(), split.figures()
    assert (a.content_events, a.completion_tokens, a.finish_reason, a.done) == (
        b.content_events,
        b.completion_tokens,
        b.finish_reason,
        b.done,
    )
    assert a.content_events == len(tokens)
    assert forwarded == b"".join(_chat_stream(tokens, usage=False))


def test_crlf_framing_and_flush() -> None:
    lf = b"".join(_chat_stream(["a", "b"], usage=True))
    crlf = lf.replace(b"\n", b"\r\n")
    meter = StreamMeter(0.0, strip_usage=True)
    out = meter.feed(crlf[:-3], 1.0) + meter.flush()
    assert meter.figures().completion_tokens == 2
    assert meter.figures().content_events == 2
    assert out == b"".join(_chat_stream(["a", "b"], usage=False)).replace(b"\n", b"\r\n")[:-3]


def test_without_gap_tracking_first_token_and_usage_still_measured() -> None:
    events = _chat_stream(["a", "b", "c"], usage=True)
    meter = StreamMeter(0.0, track_gaps=False)
    for i, e in enumerate(events):
        meter.feed(e, float(i))
    fig = meter.figures()
    assert fig.ttft == 2.0
    assert fig.content_events == 1
    assert fig.completion_tokens == 3
    assert fig.tpot == (fig.e2e - 2.0) / 2  # type: ignore[operator]
