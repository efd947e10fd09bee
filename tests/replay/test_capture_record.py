"""The capture record schema: round trip, Batch-line compatibility, rejection of bad lines."""

from __future__ import annotations

import orjson
import pytest

from turnout.common.capture import (
    CaptureFormatError,
    CaptureRecord,
    Observed,
    Response,
    Route,
    dump_line,
    iso_utc,
    parse_line,
)


def test_round_trip_keeps_every_field() -> None:
    rec = CaptureRecord(
        custom_id="req-1",
        url="/v1/chat/completions",
        body={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        t_offset_ms=12.3456,
        ts=iso_utc(0.5),
        headers={"x-request-class": "batch"},
        route=Route("adaptive", "batch", "vllm", 1),
        resp=Response(200, True, "stop", 7, 3, None, cached_tokens=4),
        obs=Observed(1.5, 2.5, 10.0, 0.25),
    )
    line = dump_line(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    doc = orjson.loads(line)
    assert list(doc)[:4] == ["custom_id", "method", "url", "body"]
    assert doc["route"]["class"] == "batch"
    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    assert doc["resp"]["usage"] == usage
    assert doc["ts"] == "1970-01-01T00:00:00.500000Z"
    back = parse_line(line)
    assert back == _fields(rec, t_offset_ms=12.346)


def _fields(rec: CaptureRecord, **kw: object) -> CaptureRecord:
    d = {k: getattr(rec, k) for k in CaptureRecord.__dataclass_fields__}
    d.update(kw)
    return CaptureRecord(**d)


def test_a_batch_input_line_is_a_record() -> None:
    rec = parse_line(b'{"custom_id":"a","method":"POST","url":"/v1/completions","body":{}}')
    assert rec.t_offset_ms is None and rec.route is None and rec.resp is None


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1]",
        b'{"url":"/v1/completions","body":{}}',
        b'{"custom_id":"a","url":"v1","body":{}}',
        b'{"custom_id":"a","url":"/v1/x","body":"s"}',
        b'{"custom_id":"a","url":"/v1/x","body":{},"t_offset_ms":"1"}',
        b'{"custom_id":"a","url":"/v1/x","body":{},"resp":{"status":true}}',
        b'{"custom_id":"a","url":"/v1/x","body":{},"route":[]}',
    ],
)
def test_bad_lines_are_rejected(line: bytes) -> None:
    with pytest.raises(CaptureFormatError):
        parse_line(line)
