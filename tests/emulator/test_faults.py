"""Every fault knob, per request (X-Emulator-Fault) and per process (CLI), plus disconnects."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import openai
import pytest
from openai import Stream
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tests.emulator.conftest import client_for
from tests.procs import Emulator, metric, start_emulator

MODEL = "deepseek-v4.1-flash"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a story."}]


def _chat(
    client: openai.OpenAI, fault: str | None = None, max_tokens: int = 20, stream: bool = False
) -> ChatCompletion | Stream[ChatCompletionChunk]:
    headers = {"X-Emulator-Fault": fault} if fault else {}
    return client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=max_tokens,
        extra_headers=headers,
        extra_body={"ignore_eos": True},
        stream=stream,
    )


@pytest.mark.parametrize("status", [429, 500, 503])
def test_status_header_answers_with_that_error(emu: Emulator, status: int) -> None:
    with pytest.raises(openai.APIStatusError) as info:
        _chat(client_for(emu), f"status={status}")
    assert info.value.status_code == status
    assert isinstance(info.value.body, dict) and "Injected" in str(info.value.body["message"])


def test_bad_fault_header_is_a_400(vllm: Emulator) -> None:
    with pytest.raises(openai.BadRequestError):
        _chat(client_for(vllm), "status=200; explode=1")


def test_drop_after_aborts_the_stream(emu: Emulator) -> None:
    got: list[str] = []
    with pytest.raises(Exception) as info:  # the transport's own error type
        stream = _chat(client_for(emu), "drop_after=5", stream=True)
        assert isinstance(stream, Stream)
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got.append(chunk.choices[0].delta.content)
    assert not isinstance(info.value, AssertionError)
    tokens = len(re.findall(r"\w+|[^\w\s]", "".join(got)))
    assert 5 <= tokens < 20  # stopped right after the chunk that reached 5 tokens


def test_stall_delays_the_response(vllm: Emulator) -> None:
    start = time.monotonic()
    _chat(client_for(vllm), "stall=0.4; drop_after=1000")
    assert time.monotonic() - start >= 0.4


def test_disconnect_frees_the_slot() -> None:
    with start_emulator("vllm", time_scale=1) as emu:
        client = client_for(emu)
        stream = client.completions.create(
            model=MODEL, prompt="go", max_tokens=5000, stream=True, extra_body={"ignore_eos": True}
        )
        it = iter(stream)
        for _ in range(3):
            next(it)
        assert metric(emu.url, "vllm:num_requests_running", required=True) == 1
        stream.close()
        deadline = time.monotonic() + 10
        while (
            metric(emu.url, "vllm:num_requests_running", required=True) != 0
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert metric(emu.url, "vllm:num_requests_running", required=True) == 0
        assert metric(emu.url, "vllm:kv_cache_usage_perc", required=True) == 0


@pytest.fixture(scope="module")
def faulty() -> Iterator[Emulator]:
    args = ["--error-rate", "1", "--error-status", "500"]
    with start_emulator("deepinfer", time_scale=100, args=args) as emu:
        yield emu


def test_cli_error_rate(faulty: Emulator) -> None:
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            _chat(client_for(faulty))


def test_cli_drop_after_and_stall() -> None:
    with start_emulator(
        "vllm", time_scale=100, args=["--drop-after", "2", "--stall", "0.2"]
    ) as emu:
        start = time.monotonic()
        with pytest.raises(openai.APIConnectionError):
            _chat(client_for(emu))  # non-streamed: the connection drops, no response
        assert time.monotonic() - start >= 0.2


def _await_metric(emu: Emulator, name: str, value: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while (got := metric(emu.url, name, required=True)) != value:
        assert time.monotonic() < deadline, f"{name} is {got}, not {value}, after {timeout} s"
        time.sleep(0.01)


def test_max_waiting_rejects_with_503() -> None:
    args = ["--max-waiting", "1", "--set", "max_num_seqs=1", "--set", "ranks=1"]
    with start_emulator("vllm", time_scale=1, args=args) as emu:
        client = client_for(emu)
        results: list[object] = []

        def long_request() -> None:
            try:  # about a second each: the third request finds the first still running
                results.append(_chat(client, max_tokens=80))
            except openai.APIError as exc:
                results.append(exc)

        threads = [threading.Thread(target=long_request) for _ in range(2)]
        threads[0].start()
        _await_metric(emu, "vllm:num_requests_running", 1)  # one running,
        threads[1].start()
        _await_metric(emu, "vllm:num_requests_waiting", 1)  # then one waiting
        assert metric(emu.url, "vllm:num_requests_running", required=True) == 1
        with pytest.raises(openai.APIStatusError) as info:
            _chat(client)
        assert info.value.status_code == 503
        for t in threads:
            t.join(30)
        assert len(results) == 2 and not any(isinstance(r, Exception) for r in results)
