"""The router writes each finished request to the capture file (capture seam, end to end)."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config
from turnout.common.capture import CaptureRecord, parse_line

MODEL = "deepseek-v4.1-flash"


def read_records(path: Path, n: int, timeout: float = 10.0) -> list[CaptureRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_bytes().splitlines()
            if len(lines) >= n:
                return [parse_line(line) for line in lines]
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} capture lines after {timeout} s")


def test_requests_are_captured_with_route_resp_and_obs(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["capture"] = {"path": str(capture)}
        with start_router(write_config(tmp_path, doc)) as router:
            client = client_for(router.url, **{"X-Request-Id": "cap-1", "Authorization": "x"})
            chunks = list(
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "hello there"}],
                    max_tokens=5,
                    stream=True,
                )
            )
            assert chunks
            batch = client_for(router.url, **{"X-Request-Id": "cap-2", "X-Request-Class": "batch"})
            batch.completions.create(model=MODEL, prompt="abc", max_tokens=3)
            lost = client_for(router.url, **{"X-Request-Id": "cap-3"})
            with pytest.raises(openai.NotFoundError):
                lost.completions.create(model="nope", prompt="abc", max_tokens=3)
            records = {r.custom_id: r for r in read_records(capture, 3)}
    stream = records["cap-1"]
    assert stream.url == "/v1/chat/completions"
    assert stream.body["messages"] == [{"role": "user", "content": "hello there"}]
    assert "stream_options" not in stream.body  # the client's body, not the spliced one
    assert stream.route is not None and stream.resp is not None and stream.obs is not None
    assert (stream.route.policy, stream.route.request_class, stream.route.backend) == (
        "class-split",
        "interactive",
        "vllm",
    )
    assert (stream.resp.status, stream.resp.stream, stream.resp.completion_tokens) == (200, True, 5)
    assert stream.obs.ttft_ms is not None and stream.obs.e2e_ms is not None
    assert stream.obs.ttft_ms <= stream.obs.e2e_ms
    assert "authorization" not in {k.lower() for k in stream.headers}
    done = records["cap-2"]
    assert done.route is not None and done.route.backend == "deepinfer"
    assert done.headers.get("x-request-class") == "batch"
    missing = records["cap-3"]
    assert missing.route is not None and missing.route.backend is None
    assert missing.resp is not None and missing.resp.status == 404
