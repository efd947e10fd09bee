"""/v1/responses through the in-process router against a fake engine: its typed events are
relayed as sent and metered, and a stream that ends without ``response.completed`` is an
error the client hears of."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import openai
import pytest
from openai.types.responses import ResponseStreamEvent

from router.app import STATE
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.test_handler import config


def _sample(ip: InProcess, name: str) -> float:
    text = ip.app[STATE].metrics.render().decode()
    found = re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def _client(ip: InProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=ip.url + "/v1", api_key="x", max_retries=0)


async def test_typed_events_are_relayed_and_metered_from_the_last_event(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.release.clear()  # hold the stream after its first delta
    async with in_process_router(tmp_path, config(), engine) as ip:
        client = _client(ip)
        stream = await client.responses.create(model=MODEL, input="hello", stream=True)
        events = []
        async for event in stream:
            events.append(event)
            if event.type == "response.output_text.delta" and not engine.release.is_set():
                # The first delta is the first content: the prompt no longer waits for prefill.
                assert ip.app[STATE].pool.by_name["fake"].outstanding_prompt == 0
                engine.release.set()
        await client.close()
        assert [e.type for e in events] == [
            "response.created",
            *["response.output_text.delta"] * 3,
            "response.output_text.done",
            "response.completed",
        ]
        assert engine.bodies[0]["input"] == "hello"
        assert "stream_options" not in engine.bodies[0]  # usage comes without asking
        # TTFT once; TPOT and output tokens from response.completed's usage.
        assert _sample(ip, "turnout_time_to_first_token_seconds_count") == 1
        assert _sample(ip, "turnout_time_per_output_token_seconds_count") == 1
        assert _sample(ip, "turnout_output_tokens_total") == 3
        assert _sample(ip, "turnout_prompt_tokens_total") == 7


async def _read(ip: InProcess, seen: list[ResponseStreamEvent]) -> None:
    """Stream a response into ``seen`` with the official client."""
    client = _client(ip)
    try:
        stream = await client.responses.create(model=MODEL, input="hello", stream=True)
        async for event in stream:
            seen.append(event)
    finally:
        await client.close()


async def test_a_stream_without_usage_is_still_served_and_timed(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config(), FakeEngine(usage=False)) as ip:
        seen: list[ResponseStreamEvent] = []
        await _read(ip, seen)
        deltas = [e.delta for e in seen if e.type == "response.output_text.delta"]
        assert "".join(deltas) == "a b c"
        assert _sample(ip, "turnout_time_to_first_token_seconds_count") == 1
        assert _sample(ip, "turnout_stream_aborts_total") == 0


async def test_a_stream_cut_before_response_completed_ends_with_an_error(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config(), FakeEngine(cut=True)) as ip:
        seen: list[ResponseStreamEvent] = []
        with pytest.raises(openai.APIError, match="before its last event"):
            await _read(ip, seen)
        assert seen[-1].type == "response.output_text.done"  # whole events before the error
        for _ in range(50):  # the handler's bookkeeping runs after the client's last byte
            if _sample(ip, "turnout_stream_aborts_total") == 1:
                break
            await asyncio.sleep(0.01)
        assert _sample(ip, "turnout_stream_aborts_total") == 1


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": ["not an item"]}, "input"),
        ({"model": MODEL, "input": "x", "instructions": ["a"]}, "instructions"),
        ({"model": MODEL, "input": "x", "max_output_tokens": -1}, "max_output_tokens"),
    ],
)
async def test_bad_responses_requests_are_refused_before_any_backend(
    tmp_path: Path, body: dict[str, object], param: str
) -> None:
    engine = FakeEngine()
    async with in_process_router(tmp_path, config(), engine) as ip:
        client = _client(ip)
        with pytest.raises(openai.BadRequestError) as info:
            await client.post("/responses", body=body, cast_to=object)
        await client.close()
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == param
    assert engine.bodies == []


async def test_tpot_of_n_choices_is_per_choice(tmp_path: Path) -> None:
    """Three choices of two tokens each, 0.2 s apart: usage says 6 tokens, but each choice
    took 0.2 s for its one token after the first, and that is the TPOT."""
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, config(), engine) as ip:
        client = _client(ip)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], n=3, stream=True
        )
        await engine.streaming.wait()
        await asyncio.sleep(0.2)
        engine.release.set()
        chunks = [c async for c in stream]
        await client.close()
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1, 2}
        assert _sample(ip, "turnout_output_tokens_total") == 6
        assert _sample(ip, "turnout_time_per_output_token_seconds_count") == 1
        # Over all six tokens it would be about 0.2 / 5; per choice it is at least 0.2.
        assert _sample(ip, "turnout_time_per_output_token_seconds_sum") >= 0.2


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": "2"}),
        ("/completions", {"prompt": "x", "n": True}),
        ("/responses", {"input": "x", "n": 2}),
        ("/embeddings", {"input": "x", "n": 2}),
    ],
)
async def test_an_n_that_cannot_be_served_is_refused(
    tmp_path: Path, path: str, body: dict[str, object]
) -> None:
    engine = FakeEngine()
    async with in_process_router(tmp_path, config(), engine) as ip:
        client = _client(ip)
        with pytest.raises(openai.BadRequestError) as info:
            await client.post(path, body={"model": MODEL, **body}, cast_to=object)
        await client.close()
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == "n" and "'n'" in err["message"]
    assert engine.bodies == []
