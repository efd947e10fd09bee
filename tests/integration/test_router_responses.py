"""The Responses API through the router in front of two real emulators, driven by the
official openai client: streamed and not, classified and routed, captured, and replayed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_router_capture import read_records
from tests.procs import run_replay, start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config
from turnout.common.capture import CaptureRecord, parse_line
from turnout.common.tokens import count_chat, count_text

MODEL = "deepseek-v4.1-flash"
INSTRUCTIONS = "Answer briefly."
INPUT = "Say something about routers."
PROMPT = count_chat(
    [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": INPUT}]
)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("responses")
    capture = tmp / "capture.jsonl"
    with (
        start_emulator("vllm", time_scale=50, seed=5) as vllm,
        start_emulator("deepinfer", time_scale=50, seed=5) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["capture"] = {"path": str(capture)}
        with start_router(write_config(tmp, doc)) as proc:
            yield proc.url, capture


def test_a_whole_response_is_routed_and_reports_usage(router: tuple[str, Path]) -> None:
    client = client_for(router[0], **{"X-Request-Id": "resp-whole"})
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=INPUT, instructions=INSTRUCTIONS, max_output_tokens=9
    )
    assert raw.headers["x-turnout-backend"] == "vllm"
    assert raw.headers["x-turnout-class"] == "interactive"
    response = raw.parse()
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None and response.usage.input_tokens == PROMPT
    assert response.usage.output_tokens == count_text(response.output_text) >= 1


def test_a_streamed_response_sends_vllms_typed_events(router: tuple[str, Path]) -> None:
    client = client_for(router[0], **{"X-Request-Id": "resp-stream"})
    stream = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": [{"type": "input_text", "text": INPUT}]}],
        max_output_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    text = "".join(e.delta for e in deltas)
    assert len(deltas) == kinds.count("response.output_text.delta") >= 1
    assert {(e.item_id, e.output_index, e.content_index) for e in deltas} == {
        (events[2].item.id, 0, 0)  # type: ignore[union-attr]
    }
    completed = events[-1].response  # type: ignore[union-attr]
    assert completed.output_text == text and completed.status == "incomplete"
    assert completed.usage is not None and completed.usage.output_tokens == 12 == count_text(text)


def test_the_stream_helper_assembles_the_final_response(router: tuple[str, Path]) -> None:
    client = client_for(router[0], **{"X-Request-Class": "batch", "X-Request-Id": "resp-batch"})
    with client.responses.stream(model=MODEL, input=INPUT, max_output_tokens=6) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.output_tokens == count_text(final.output_text)


def _records(capture: Path) -> dict[str, CaptureRecord]:
    ids = {"resp-whole", "resp-stream", "resp-batch"}
    records = {r.custom_id: r for r in read_records(capture, 3)}
    assert ids <= set(records)
    return {k: records[k] for k in ids}


def test_responses_are_captured_and_replay_measures_them(
    router: tuple[str, Path], tmp_path: Path
) -> None:
    url, capture = router
    records = _records(capture)
    stream = records["resp-stream"]
    assert stream.url == "/v1/responses" and stream.resp is not None and stream.obs is not None
    assert (stream.resp.status, stream.resp.stream, stream.resp.finish_reason) == (
        200,
        True,
        "length",
    )
    assert stream.resp.completion_tokens == 12
    assert stream.obs.ttft_ms is not None and stream.obs.tpot_ms is not None
    assert stream.obs.ttft_ms <= stream.obs.e2e_ms  # type: ignore[operator]
    whole = records["resp-whole"]
    assert whole.resp is not None and whole.resp.prompt_tokens == PROMPT
    assert whole.route is not None and whole.route.backend == "vllm"
    batch = records["resp-batch"].route
    assert batch is not None and (batch.request_class, batch.backend) == ("batch", "deepinfer")

    mine = tmp_path / "mine.jsonl"
    mine.write_bytes(
        b"".join(line + b"\n" for line in capture.read_bytes().splitlines() if b"resp-" in line)
    )
    results = tmp_path / "results.jsonl"
    p = run_replay(str(mine), "--target", url, "--speed", "50", "--results", str(results))
    assert p.returncode == 0, p.stderr
    replayed = {r.custom_id: r for r in map(parse_line, results.read_bytes().splitlines())}
    assert set(replayed) == {"resp-whole", "resp-stream", "resp-batch"}
    again = replayed["resp-stream"]
    assert again.url == "/v1/responses" and again.resp is not None and again.obs is not None
    assert (again.resp.status, again.resp.completion_tokens) == (200, 12)
    assert again.obs.ttft_ms is not None and again.obs.tpot_ms is not None
    assert again.obs.itl_ms is not None and len(again.obs.itl_ms) >= 1
    assert replayed["resp-whole"].resp.prompt_tokens == PROMPT  # type: ignore[union-attr]
