"""The stream meter gives the same figures however the bytes are split."""

from __future__ import annotations

import itertools
import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.common.sse_spec import Recorder, spec_events
from turnout.common.sse import MAX_EVENT_SIZE, StreamMeter
from turnout.common.sse_events import is_content_event


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


# --- framing by the WHATWG server-sent events spec, and a bound on what is held back ---


def _feed_all(meter: StreamMeter, chunks: list[bytes]) -> bytes:
    return b"".join(meter.feed(c, 1.0) for c in chunks) + meter.flush()


def test_an_endless_line_is_bounded_and_ends_the_stream() -> None:
    meter = StreamMeter(0.0, max_event_size=4096)
    first = _chat_stream(["a"], usage=False)[0]
    assert meter.feed(first + b"data: ", 0.0) == first
    for i in range(100):
        out = meter.feed(b"x" * 1000, float(i))
        assert len(meter._buf) <= 4096
        assert out == b""
        if meter.failure is not None:
            break
    assert meter.failure is not None and "4096" in meter.failure
    assert meter.protocol_errors == {"event_too_large": 1}
    assert len(meter._buf) == 0
    # nothing more is read, nor held back
    assert meter.feed(b"\n\ndata: [DONE]\n\n", 9.0) == b""
    assert meter.flush() == b""
    assert not meter.done


def test_the_default_bound_is_one_mib() -> None:
    meter = StreamMeter(0.0)
    meter.feed(b"data: " + b"x" * MAX_EVENT_SIZE, 0.0)
    assert meter.failure is not None
    assert MAX_EVENT_SIZE == 1 << 20


def test_event_size_limit_is_exact_however_split() -> None:
    """An event of ``max_event_size`` bytes passes, one more byte fails, wherever it is cut."""
    ok = b"data: " + b"x" * 10 + b"\n"  # 17 bytes of lines, then the empty line
    for limit, fails in ((len(ok), False), (len(ok) - 1, True)):
        raw = ok + b"\n" + b"data: [DONE]\n\n"
        for cut in range(len(raw) + 1):
            meter = StreamMeter(0.0, max_event_size=limit)
            out = _feed_all(meter, [raw[:cut], raw[cut:]])
            assert (meter.failure is not None) == fails, cut
            assert out == (b"" if fails else raw)


def test_events_before_an_oversized_one_are_returned_whole() -> None:
    head = _chat_stream(["a", "b"], usage=False)[:3]
    big = b"data: " + b"y" * 300 + b"\n\n"
    raw = b"".join([*head, big, b"data: [DONE]\n\n"])
    for cut in range(0, len(raw) + 1, 7):
        meter = StreamMeter(0.0, max_event_size=200)
        out = b"".join(meter.feed(c, 1.0) for c in (raw[:cut], raw[cut:]))
        assert out == b"".join(head)
        assert meter.figures().content_events == 1
        assert meter.failure is not None


def test_whole_events_are_returned_without_a_copy() -> None:
    events = _chat_stream(["a", "b"], usage=True)
    meter = StreamMeter(0.0, strip_usage=True)
    assert all(meter.feed(e, 1.0) is e for e in events if b'"usage"' not in e)
    both = b"".join(events[:2])
    assert meter.feed(both, 1.0) is both


def test_incomplete_events_are_held_back_until_their_end() -> None:
    """``feed`` returns whole events only, so an error event can follow it cleanly."""
    raw = b"".join(_chat_stream(["a", "b"], usage=True))
    meter = StreamMeter(0.0)
    for i in range(len(raw)):
        out = meter.feed(raw[i : i + 1], 1.0)
        assert out in (b"", *_chat_stream(["a", "b"], usage=True))


def _mixed(eols: list[bytes]) -> tuple[bytes, bytes]:
    """A stream whose line endings cycle through ``eols``, and the same without its usage."""
    it = itertools.cycle(eols)

    def ev(*lines: bytes) -> tuple[bytes, bool]:
        body = b"".join(line + next(it) for line in lines)
        blank = next(it)
        if body.endswith(b"\r") and blank == b"\n":  # CR then LF would be one line ending
            blank = b"\r\n"
        return body + blank, False

    def doc(d: object) -> bytes:
        return b"data: " + orjson.dumps(d)

    parts = [
        ev(b": hello", doc({"choices": [{"delta": {"role": "assistant", "content": ""}}]})),
        ev(b"event: message", doc({"choices": [{"delta": {"content": "a"}}]}), b"id: 1"),
        ev(b'data: {"choices": [{"delta":', b'data: {"content": "b"}}]}'),  # two data lines
        ev(doc({"choices": [{"delta": {}, "finish_reason": "stop"}]})),
        ev(b"retry: 10"),
    ]
    u = {"prompt_tokens": 3, "completion_tokens": 2}
    parts.append((ev(doc({"choices": [], "usage": u}))[0], True))
    parts.append(ev(b"data: [DONE]"))
    raw = b"".join(p for p, _ in parts)
    kept = b"".join(p for p, usage_only in parts if not usage_only)
    return raw, kept


EOLS = [[b"\n"], [b"\r\n"], [b"\r"], [b"\r\n", b"\n"], [b"\n", b"\r"], [b"\r", b"\r\n", b"\n"]]


@pytest.mark.parametrize("eols", EOLS, ids=lambda e: b"+".join(e).decode("unicode_escape"))
def test_mixed_line_endings_split_at_every_byte(eols: list[bytes]) -> None:
    raw, kept = _mixed(eols)
    expected = spec_events(raw)
    assert len(expected) == 6
    whole = Recorder(0.0, keep_itl=True)
    assert _feed_all(whole, [raw]) == raw
    assert whole.seen == expected
    fig = whole.figures()
    assert (fig.content_events, fig.finish_reason, fig.completion_tokens, fig.done) == (
        2,
        "stop",
        2,
        True,
    )
    for cut in range(len(raw) + 1):
        for strip in (False, True):
            meter = Recorder(0.0, keep_itl=True, strip_usage=strip)
            out = _feed_all(meter, [raw[:cut], raw[cut:]])
            assert meter.seen == expected, cut
            assert out == (kept if strip else raw), cut
            assert meter.figures() == whole.figures()
    bytewise = Recorder(0.0, strip_usage=True)
    assert _feed_all(bytewise, [raw[i : i + 1] for i in range(len(raw))]) == kept
    assert bytewise.seen == expected


def test_crlf_then_lf_does_not_hold_the_stream() -> None:
    """``\\r\\n`` ends the first line, ``\\n`` the empty line: each event is read at once."""
    events = [e.replace(b"\n\n", b"\r\n\n") for e in _chat_stream(["a", "b"], usage=False)]
    meter = StreamMeter(0.0, track_gaps=True)
    for i, e in enumerate(events):
        assert meter.feed(e, float(i)) == e
    assert meter.figures().content_events == 2 and meter.done


def test_a_cr_at_a_chunk_end_and_its_lf_in_the_next() -> None:
    usage = _chat_stream(["a"], usage=True)[-2].replace(b"\n\n", b"\r\r\n")
    done = b"data: [DONE]\r\n\r\n"
    meter = Recorder(0.0, strip_usage=True)
    assert meter.feed(usage[:-1], 1.0) == b""  # the usage event, stripped, up to its last CR
    assert meter.feed(b"\n" + done[:-2], 2.0) == b""  # its LF is dropped with it
    assert meter.feed(done[-2:], 3.0) == done
    assert meter.figures().completion_tokens == 1 and meter.done
    kept = Recorder(0.0)
    assert kept.feed(usage[:-1], 1.0) == usage[:-1]
    assert kept.feed(b"\n" + done, 2.0) == b"\n" + done


def test_fields_by_the_spec() -> None:
    raw = (
        b"\xef\xbb\xbfdata: [DONE]\n\n"  # a byte order mark at the start is ignored
        b": data: not a field\n\n"
        b"data\n\n"  # a data field with an empty value
        b"data:x\ndata:  y\n\n"  # no space, or two of which one is kept
        b"event: usage\ndatum: z\nid\n\n"
    )
    meter = Recorder(0.0)
    assert _feed_all(meter, [raw]) == raw
    assert meter.seen == spec_events(raw) == [b"[DONE]", b"", b"x\n y"]
    assert meter.done
    for cut in range(len(raw) + 1):
        split = Recorder(0.0)
        _feed_all(split, [raw[:cut], raw[cut:]])
        assert split.seen == meter.seen, cut


# --- a hostile or sloppy upstream: fields are read as JSON, malformed ones ignored and counted ---


def _stream_with(usage: object, *, finish: bytes = b'"stop"') -> list[bytes]:
    head = _chat_stream(["a", "b"], usage=False)[:-2]  # up to the last content event
    finish_ev = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":%b}]}\n\n' % finish
    usage_ev = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    return [*head, finish_ev, usage_ev, b"data: [DONE]\n\n"]


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": "7", "completion_tokens": "1"},
        {"prompt_tokens": -7, "completion_tokens": -1},
        {"prompt_tokens": 10**12, "completion_tokens": 2**70},
        {"prompt_tokens": 7.0, "completion_tokens": True},
        {"prompt_tokens": [7], "completion_tokens": {"n": 1}},
        [7, 1],
        "7 and 1",
        42,
    ],
)
def test_malformed_usage_is_ignored_and_counted(usage: object) -> None:
    for strip in (False, True):
        meter = StreamMeter(0.0, strip_usage=strip)
        out = _feed_all(meter, _stream_with(usage))
        fig = meter.figures()
        assert fig.prompt_tokens is None and fig.completion_tokens is None
        assert meter.protocol_errors == {"bad_usage": 1}
        assert fig.tpot is not None  # from the content events, as without usage
        assert fig.finish_reason == "stop" and fig.done
        assert (b'"usage"' in out) is not strip  # still the usage-only event: still stripped


def test_a_malformed_usage_field_does_not_lose_the_other() -> None:
    meter = StreamMeter(0.0)
    _feed_all(meter, _stream_with({"prompt_tokens": 7, "completion_tokens": "2"}))
    assert (meter.prompt_tokens, meter.completion_tokens) == (7, None)
    assert meter.protocol_errors == {"bad_usage": 1}


def test_cached_prompt_tokens_are_read_and_a_bad_count_is_counted() -> None:
    usage = {"prompt_tokens": 70, "completion_tokens": 2}
    meter = StreamMeter(0.0)
    _feed_all(meter, _stream_with({**usage, "prompt_tokens_details": {"cached_tokens": 64}}))
    assert meter.figures().cached_tokens == 64 and not meter.protocol_errors
    meter = StreamMeter(0.0)  # the Responses API's names
    _feed_all(meter, _stream_with({**usage, "input_tokens_details": {"cached_tokens": 16}}))
    assert meter.figures().cached_tokens == 16
    meter = StreamMeter(0.0)
    _feed_all(meter, _stream_with({**usage, "prompt_tokens_details": {"cached_tokens": -1}}))
    assert meter.figures().cached_tokens is None and meter.protocol_errors == {"bad_usage": 1}
    assert meter.figures().prompt_tokens == 70  # the rest is still read


def test_non_utf8_finish_reason_is_ignored_and_counted() -> None:
    events = _stream_with({"prompt_tokens": 7, "completion_tokens": 2}, finish=b'"st\xffp"')
    events[-3] = events[-3].replace(b"}]}", b'}],"usage":{"prompt_tokens":7}}')
    meter = StreamMeter(0.0, track_gaps=False)
    out = _feed_all(meter, events)
    assert out == b"".join(events)  # forwarded as received
    assert meter.finish_reason is None
    assert meter.protocol_errors == {"bad_utf8": 1, "bad_finish_reason": 1}
    assert (meter.prompt_tokens, meter.completion_tokens) == (7, 2)  # the rest is still read


@pytest.mark.parametrize("finish", [b"5", b'{"r":"stop"}', b'"' + b"x" * 65 + b'"', b'"st\\nop"'])
def test_a_finish_reason_that_is_not_a_word_is_ignored_and_counted(finish: bytes) -> None:
    meter = StreamMeter(0.0)
    _feed_all(meter, _stream_with({"prompt_tokens": 7, "completion_tokens": 2}, finish=finish))
    assert meter.finish_reason is None
    assert meter.protocol_errors == {"bad_finish_reason": 1}
    assert meter.completion_tokens == 2


def test_non_utf8_content_still_counts_as_content() -> None:
    meter = StreamMeter(0.0, keep_itl=True)
    meter.feed(b'data: {"choices":[{"delta":{"content":"\xff\xfe"}}]}\n\n', 1.0)
    assert meter.first_content == 1.0
    assert meter.protocol_errors == {"bad_utf8": 1}


@pytest.mark.parametrize(
    ("payload", "kind"),
    [
        (b'{"choices":[],"usage":{"prompt_tokens":', "bad_json"),
        (b'{"choices":[{"delta":{"content":"a"}}', "bad_json"),
        (b'{"choices":5,"usage":{"prompt_tokens":7}}', "bad_json"),
        (b'{"choices":["a"],"finish_reason":"stop"}', "bad_json"),
        (b'["usage": 1]', "bad_json"),
    ],
)
def test_malformed_json_is_counted_not_raised(payload: bytes, kind: str) -> None:
    meter = StreamMeter(0.0)
    assert meter.feed(b"data: " + payload + b"\n\n", 1.0)
    assert meter.protocol_errors == {kind: 1}
    assert meter.first_content is None


def _spaced(events: list[bytes]) -> list[bytes]:
    """The same events with JSON as Python's json module writes it: a space after , and :."""
    return [
        b"data: " + json.dumps(orjson.loads(e[6:])).encode() + b"\n\n"
        if e.startswith(b"data: {")
        else e
        for e in events
    ]


def test_spaced_json_is_read_as_json() -> None:
    spaced = _spaced(_chat_stream(["a", "b", "c"], usage=True))
    assert b'"choices": []' in spaced[-2]
    meter = StreamMeter(0.0, keep_itl=True, strip_usage=True)
    out = _feed_all(meter, spaced)
    assert out == b"".join(_spaced(_chat_stream(["a", "b", "c"], usage=False)))
    fig = meter.figures()
    assert (fig.content_events, fig.prompt_tokens, fig.completion_tokens) == (3, 7, 3)
    assert fig.finish_reason == "length"
    meter = StreamMeter(0.0)
    meter.feed(b'data: { "choices" : [ { "delta" : { "content" : "a" } } ] }\n\n', 1.0)
    assert meter.first_content == 1.0


def test_error_events_are_read_as_json() -> None:
    meter = StreamMeter(0.0)
    meter.feed(b'data: { "error" : { "message" : "boom", "code" : 500 } }\n\n', 1.0)
    assert meter.error == {"message": "boom", "code": 500}
    meter = StreamMeter(0.0)
    meter.feed(b'data: {"error": "boom"}\n\n', 1.0)
    assert meter.error == {"message": "boom"}
    meter = StreamMeter(0.0)
    meter.feed(b'data: {"error": {"message": "bo\n\n', 1.0)  # cut short, still an error
    assert meter.error is not None and "bo" in str(meter.error["message"])
    assert meter.protocol_errors == {"bad_json": 1}


def test_a_content_key_outside_a_choice_delta_is_not_content() -> None:
    logprobs = b'{"choices":[{"delta":{"content":""},"logprobs":{"content":[{"token":"a"}]}}]}'
    assert not is_content_event(logprobs)
    assert not is_content_event(b'{"choices":[],"usage":{"content":"x"}}')
    assert is_content_event(b'{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}')
    assert is_content_event(b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}')
    assert not is_content_event(b'{"choices":[{"delta":{"content":"a"}')  # not JSON


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (b'{"choices":[],"usage":{"prompt_tokens":"7","completion_tokens":-1}}', {"bad_usage": 1}),
        (b'{"choices":[],"usage":[7,1]}', {"bad_usage": 1}),
        (
            b'{"choices":[{"finish_reason":"st\xffp"}],"usage":{"prompt_tokens":7}}',
            {"bad_utf8": 1, "bad_finish_reason": 1},
        ),
        (
            b'{"choices":[{"finish_reason":7}],"usage":{"prompt_tokens":7}}',
            {"bad_finish_reason": 1},
        ),
        (b"<html>502 Bad Gateway</html>", {"bad_json": 1}),
        (b"[7]", {"bad_json": 1}),
    ],
)
def test_a_malformed_body_is_counted_not_raised(body: bytes, errors: dict[str, int]) -> None:
    meter = StreamMeter(0.0)
    meter.feed_body(body, 1.0)
    assert meter.protocol_errors == errors
    assert meter.prompt_tokens in (None, 7)
    assert meter.completion_tokens is None
    assert meter.finish_reason is None
    assert meter.figures(2.0).e2e == 2.0


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_events_of_many_short_lines(eol: bytes) -> None:
    """Past a few lines the blank-line search changes method: same events, however split."""
    lines = [b": c", b"data: {", b'data: "choices": [{"delta": {"content": "a"}}]', b"data: }"]
    event = eol.join([*lines[:1] * 20, *lines[1:], b"id: 1", *lines[:1] * 20]) + eol + eol
    raw = event * 2 + b"data: x" + eol * 15 + b"data: [DONE]" + eol + eol
    expected = spec_events(raw)
    assert len(expected) == 4
    for cut in range(len(raw) + 1):
        meter = Recorder(0.0, track_gaps=True)
        assert _feed_all(meter, [raw[:cut], raw[cut:]]) == raw
        assert meter.seen == expected, cut
        assert meter.figures().content_events == 2 and meter.done
