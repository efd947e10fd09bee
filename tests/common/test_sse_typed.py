"""The stream meter on the Responses API's typed events (``event:`` lines, no ``[DONE]``)."""

from __future__ import annotations

import itertools

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.common.sse_spec import Recorder, spec_events
from turnout.common.sse import StreamMeter

_ITEM = {"item_id": "msg_1", "output_index": 0, "content_index": 0}


def _ev(kind: str, **fields: object) -> bytes:
    doc = orjson.dumps({"type": kind, "sequence_number": 0, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + doc + b"\n\n"


def _response(status: str, usage: object, **extra: object) -> dict[str, object]:
    return {"id": "resp_1", "object": "response", "status": status, "usage": usage, **extra}


def _stream(tokens: list[str], *, usage: bool = True, last: bytes | None = None) -> list[bytes]:
    started = _response("in_progress", None, output=[], text={"format": {"type": "text"}})
    part = {"type": "output_text", "text": "", "annotations": []}
    events = [
        _ev("response.created", response=started),
        _ev("response.in_progress", response=started),
        _ev("response.output_item.added", output_index=0, item={"content": [], "id": "msg_1"}),
        _ev("response.content_part.added", **_ITEM, part=part),
    ]
    events += [_ev("response.output_text.delta", **_ITEM, delta=t) for t in tokens]
    text = "".join(tokens)
    events.append(_ev("response.output_text.done", **_ITEM, text=text))
    counts = {"input_tokens": 9, "output_tokens": len(tokens)} if usage else None
    done = _response("completed", counts, output=[{"content": [{"text": text}]}])
    events.append(last if last is not None else _ev("response.completed", response=done))
    return events


def test_first_content_is_the_first_delta_and_the_last_event_ends_it() -> None:
    events = _stream(["a", " b", " c"])
    meter = StreamMeter(0.0, track_gaps=False)
    out = b"".join(meter.feed(e, float(i)) for i, e in enumerate(events))
    fig = meter.figures()
    assert out == b"".join(events)  # forwarded as sent
    assert fig.ttft == 4.0  # not response.created, nor the empty part added before it
    assert fig.done and fig.finish_reason == "stop"
    assert (fig.prompt_tokens, fig.completion_tokens) == (9, 3)
    assert fig.tpot == (8.0 - 4.0) / 2
    assert meter.data_events == 3  # the deltas only: what a settlement counts without usage


def test_without_usage_the_deltas_are_counted() -> None:
    meter = StreamMeter(0.0, keep_itl=True)
    for i, e in enumerate(_stream(["a", " b", " c", " d"], usage=False)):
        meter.feed(e, float(i))
    fig = meter.figures()
    assert fig.completion_tokens is None and fig.content_events == 4 == meter.data_events
    assert fig.itls == [1.0, 1.0, 1.0] and fig.done


def test_an_incomplete_response_is_cut_at_length() -> None:
    cut = _response(
        "incomplete",
        {"input_tokens": 9, "output_tokens": 2},
        incomplete_details={"reason": "max_output_tokens"},
    )
    meter = StreamMeter(0.0)
    meter.feed(b"".join(_stream(["a", "b"], last=_ev("response.completed", response=cut))), 1.0)
    assert meter.figures().finish_reason == "length" and meter.done


def test_error_and_failed_events_are_errors() -> None:
    error = _ev("error", code="server_error", message="engine died", param=None)
    meter = StreamMeter(0.0)
    meter.feed(b"".join(_stream(["a"], last=error)), 1.0)
    assert meter.error == {"message": "engine died", "code": "server_error", "param": None}
    assert not meter.done
    failed = _response("failed", None, error={"code": "server_error", "message": "oom"})
    meter = StreamMeter(0.0)
    meter.feed(b"".join(_stream(["a"], last=_ev("response.failed", response=failed))), 1.0)
    assert meter.error == {"code": "server_error", "message": "oom"} and meter.done


def test_a_malformed_last_event_is_counted_not_raised() -> None:
    meter = StreamMeter(0.0)
    bad = _ev("response.completed", response="nope")
    meter.feed(b"".join(_stream(["a"], last=bad)), 1.0)
    assert meter.done and meter.protocol_errors == {"bad_json": 1}
    bad_usage = _ev("response.completed", response=_response("completed", {"output_tokens": -4}))
    meter = StreamMeter(0.0)
    meter.feed(b"".join(_stream(["a"], last=bad_usage)), 1.0)
    assert meter.completion_tokens is None and meter.protocol_errors == {"bad_usage": 1}


def test_a_whole_response_body_is_metered() -> None:
    body = _response(
        "completed",
        {"input_tokens": 5, "output_tokens": 4},
        output=[{"type": "message", "content": [{"type": "output_text", "text": "one two, x"}]}],
    )
    meter = StreamMeter(0.0)
    meter.feed_body(orjson.dumps(body), 2.0)
    fig = meter.figures()
    assert (fig.prompt_tokens, fig.completion_tokens, fig.finish_reason) == (5, 4, "stop")
    assert meter.body_tokens is None  # the body's own usage: the router counts nothing
    del body["usage"]
    meter = StreamMeter(0.0)
    meter.feed_body(orjson.dumps(body), 2.0)
    assert meter.body_tokens == 4


@settings(deadline=None)  # a wall-clock limit per example fails on a loaded machine
@given(
    tokens=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=30),
    crlf=st.booleans(),
)
def test_any_split_reads_the_events_the_spec_dispatches(
    tokens: list[str], cuts: list[int], crlf: bool
) -> None:
    raw = b"".join(_stream(tokens))
    if crlf:  # CR LF line endings take the general path, not the typed event's shortcut
        raw = raw.replace(b"\n", b"\r\n")
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    meter = Recorder(0.0)
    out = b"".join(meter.feed(raw[a:b], 1.0) for a, b in itertools.pairwise(points))
    assert out == raw
    assert meter.seen == spec_events(raw)
    fig = meter.figures()
    assert fig.done and fig.content_events == len(tokens) and fig.completion_tokens == len(tokens)


def test_tpot_is_per_choice_when_n_choices_stream_side_by_side() -> None:
    def chunk(i: int, text: str) -> bytes:
        doc = {"choices": [{"index": i, "delta": {"content": text}, "finish_reason": None}]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}}
    events = [chunk(0, "a"), chunk(1, "b"), chunk(0, "c"), chunk(1, "d"), chunk(0, "e")]
    events += [chunk(1, "f"), b"data: " + orjson.dumps(usage) + b"\n\n", b"data: [DONE]\n\n"]
    for choices, expected in ((2, (7.0 - 0.0) / 2), (1, 7.0 / 5)):
        meter = StreamMeter(0.0, track_gaps=False, choices=choices)
        for t, e in enumerate(events):
            meter.feed(e, float(t))
        assert meter.figures().tpot == expected


def test_typed_events_without_their_event_lines_are_read_by_their_data() -> None:
    events = [e.split(b"\n", 1)[1] for e in _stream(["a", " b"])]  # `data:` lines alone
    meter = StreamMeter(0.0, track_gaps=False)
    for i, e in enumerate(events):
        meter.feed(e, float(i))
    fig = meter.figures()
    assert fig.ttft == 4.0 and fig.done and fig.completion_tokens == 2
