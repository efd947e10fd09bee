"""Trace parsers on small hand-written files in each public format, plus detection and bad rows.

The fixtures (tests/fixtures/traces, made-up rows) stand in for the public traces, so these
tests read nothing outside the repository.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from replay.sources import Source, SourceError, detect_format
from tests.fixtures import AZURE, BURSTGPT, MOONCAKE, OPENAI_BATCH
from turnout.common.capture import CaptureRecord, Response, dump_line


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (MOONCAKE, "mooncake"),
        (AZURE, "azure"),
        (BURSTGPT, "burstgpt"),
        (OPENAI_BATCH, "openai-batch"),
    ],
)
def test_detection(path: Path, fmt: str) -> None:
    assert detect_format(str(path)) == fmt


def test_mooncake() -> None:
    src = Source(str(MOONCAKE), model="m")
    items = list(src)
    assert len(items) == 12 and src.skipped == 0
    first = items[0]
    assert first.synth is not None and first.synth.prompt_tokens == 1500
    assert first.synth.hash_ids == (0, 1, 2)
    body = first.record.body
    assert body["max_tokens"] == 6 and body["min_tokens"] == 6 and body["ignore_eos"] is True
    assert body["model"] == "m" and body["stream"] is True
    assert first.record.resp is not None and first.record.resp.completion_tokens == 6
    assert [i.record.custom_id for i in items[:2]] == ["mooncake-0", "mooncake-1"]
    assert items[-1].record.t_offset_ms == pytest.approx(12_345.0)


def test_azure_timestamps_are_relative_to_the_first_row() -> None:
    items = list(Source(str(AZURE)))
    assert len(items) == 23  # the file has no trailing newline: the last row counts
    assert items[0].record.t_offset_ms == 0.0
    # 23:59:58.1000000 -> 23:59:58.4250000
    assert items[1].record.t_offset_ms == pytest.approx(325.0, abs=1e-3)
    # seven fractional digits: 23:59:59.9999999 is 1,899.9999 ms after the first row
    assert items[3].record.t_offset_ms == pytest.approx(1899.9999, abs=1e-3)
    # across midnight (and from 29 February into March): 2024-03-01 00:00:12.4
    assert items[-1].record.t_offset_ms == pytest.approx(14_300.0, abs=1e-3)
    assert items[-1].synth is not None and items[-1].synth.prompt_tokens == 905
    assert items[-1].record.body["max_tokens"] == 38


def test_burstgpt_zero_response_rows_are_skipped_and_counted() -> None:
    src = Source(str(BURSTGPT))
    items = list(src)
    assert len(items) == 11 and src.skipped == 1
    assert "0 response tokens" in src.errors[0]
    # the trace starts at 5 s: offsets count from the first row
    assert items[0].record.t_offset_ms == 0.0 and items[1].record.t_offset_ms == 2000.0
    assert items[0].synth is not None and items[0].synth.prompt_tokens == 620
    assert items[0].record.body["max_tokens"] == 88


def test_batch_lines_have_no_arrival_times() -> None:
    items = list(Source(str(OPENAI_BATCH)))
    assert len(items) == 6
    assert all(i.record.t_offset_ms is None and i.synth is None for i in items)
    assert items[0].record.custom_id == "job-0"


def test_capture_with_a_torn_last_line_and_a_dropped_prompt(tmp_path: Path) -> None:
    path = tmp_path / "cap.jsonl"
    whole = CaptureRecord(
        "a", "/v1/chat/completions", {"model": "m", "messages": []}, t_offset_ms=0.0
    )
    dropped = CaptureRecord(
        "b",
        "/v1/chat/completions",
        {"model": "m"},
        t_offset_ms=5.0,
        resp=Response(prompt_tokens=99),
    )
    path.write_bytes(dump_line(whole) + dump_line(dropped) + b'{"custom_id": "c", "ur')
    src = Source(str(path))
    assert src.format == "capture"
    items = list(src)
    assert [i.record.custom_id for i in items] == ["a", "b"]
    assert items[1].synth is not None and items[1].synth.prompt_tokens == 99
    assert src.skipped == 1


def test_unknown_content_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(SourceError):
        detect_format(str(path))
    (tmp_path / "e").write_text("")
    with pytest.raises(SourceError):
        detect_format(str(tmp_path / "e"))
