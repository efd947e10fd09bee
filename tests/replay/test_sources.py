"""Trace parsers on the public samples in shared/traces, plus detection and bad rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.capture import CaptureRecord, Response, dump_line
from replay.sources import Source, SourceError, detect_format

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
MOONCAKE = TRACES / "mooncake" / "synthetic_trace.jsonl"
AZURE = TRACES / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"
BURST = TRACES / "formats" / "burstgpt-format-synthetic.csv"
BATCH = TRACES / "formats" / "openai-batch-synthetic.jsonl"

needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason="shared/traces not present")


@needs_traces
@pytest.mark.parametrize(
    ("path", "fmt"),
    [(MOONCAKE, "mooncake"), (AZURE, "azure"), (BURST, "burstgpt"), (BATCH, "openai-batch")],
)
def test_detection(path: Path, fmt: str) -> None:
    assert detect_format(str(path)) == fmt


@needs_traces
def test_mooncake() -> None:
    src = Source(str(MOONCAKE), model="m")
    items = list(src)
    assert len(items) == 3993 and src.skipped == 0
    first = items[0]
    assert first.synth is not None and first.synth.prompt_tokens == 40160
    assert first.synth.hash_ids[:3] == (0, 1, 2)
    body = first.record.body
    assert body["max_tokens"] == 6 and body["min_tokens"] == 6 and body["ignore_eos"] is True
    assert body["model"] == "m" and body["stream"] is True
    assert items[-1].record.t_offset_ms == pytest.approx(1_022_025.0)


@needs_traces
def test_azure_timestamps_are_relative_to_the_first_row() -> None:
    items = list(Source(str(AZURE)))
    assert len(items) == 19366  # the file has no trailing newline: the last row counts
    assert items[0].record.t_offset_ms == 0.0
    # 18:15:46.6805900 -> 18:15:50.9951690
    assert items[1].record.t_offset_ms == pytest.approx(4314.579, abs=1e-3)
    assert items[-1].synth is not None and items[-1].synth.prompt_tokens == 197
    assert items[-1].record.body["max_tokens"] == 183


@needs_traces
def test_burstgpt_zero_response_rows_are_skipped_and_counted() -> None:
    src = Source(str(BURST))
    items = list(src)
    assert len(items) == 39 and src.skipped == 1
    assert "0 response tokens" in src.errors[0]
    assert items[0].record.t_offset_ms == 0.0 and items[1].record.t_offset_ms == 2000.0


@needs_traces
def test_batch_lines_have_no_arrival_times() -> None:
    items = list(Source(str(BATCH)))
    assert len(items) == 12
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
