"""The router in front of a real engine: llama.cpp's llama-server beside an emulator.

Opt-in (``-m realengine``) and skipped unless ``make llama-server`` has built the binary
(docs/real-engine.md). Everything runs over loopback with the official ``openai`` client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from replay.replayer import target_calibration
from replay.synth import Calibration
from router.backends.engines import parse_samples
from tests.procs import Process, start_emulator, wait_for
from tests.realengine.llama_server import MODEL, missing, start_llama_server
from tests.router.harness import base_config, client_for, get, start_router, write_config

pytestmark = [
    pytest.mark.realengine,
    pytest.mark.skipif(missing() is not None, reason=missing() or ""),
]

CHAT = "chat"
"""The client's model name: llama-server's own on ``llama``, the emulator's on ``emu``."""
EMU_MODEL = "deepseek-v4.1-flash"
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write one short sentence about the sea."}
]
SLOTS = 4


def router_config(llama: str, emu: str, *, engine: str = "llamacpp") -> dict[str, Any]:
    """``llama`` first for every class, the emulator second; load scraped every 0.2 s."""
    doc = base_config([("llama", engine, llama), ("emu", "vllm", emu)])
    doc["aliases"] = {CHAT: {"llama": MODEL, "emu": EMU_MODEL}}
    doc["health"] |= {"scrape_interval": 0.2, "scrape_stale_after": 5}
    return doc


def engine_gauges(llama: Process) -> dict[str, float]:
    text = get(llama.url + "/metrics").text
    return parse_samples(
        text, frozenset({"llamacpp:requests_processing", "llamacpp:requests_deferred"})
    )


def backend(router: Process, name: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = get(router.url + "/turnout/backends").json()
    return next(b for b in entries if b["name"] == name)


def load(router: Process) -> dict[str, Any]:
    """The llama backend's scraped load (zeros until the first scrape)."""
    scraped: dict[str, Any] | None = backend(router, "llama")["load"]
    return scraped or {"waiting": 0, "running": 0, "kv_cache_usage": None}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    log = tmp_path_factory.mktemp("llama") / "llama-server.log"
    with start_llama_server(slots=SLOTS, log=log) as server:
        yield server


@pytest.fixture(scope="module")
def emu() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=20) as e:
        yield e


@pytest.fixture(scope="module")
def router(
    llama: Process, emu: Process, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    path = write_config(tmp_path_factory.mktemp("router"), router_config(llama.url, emu.url))
    with start_router(path) as r:
        yield r


@pytest.fixture
def client(router: Process) -> openai.OpenAI:
    return client_for(router.url)


def test_chat_not_streamed(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=CHAT, messages=HELLO, max_tokens=16, temperature=0
    )
    assert raw.headers["x-turnout-backend"] == "llama"
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert 0 < reply.usage.completion_tokens <= 16
    # llama.cpp names its own model in the answer, whatever name it was sent
    assert reply.model == MODEL


def test_chat_streamed_with_usage_and_cached_tokens(client: openai.OpenAI) -> None:
    def streamed() -> tuple[str, Any]:
        text, usage = "", None
        with client.chat.completions.create(
            model=CHAT,
            messages=HELLO,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        ) as stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                if chunk.usage is not None:
                    usage = chunk.usage
        return text, usage

    first_text, first = streamed()
    again_text, again = streamed()
    assert first_text and again_text == first_text  # greedy: the same tokens both times
    assert first is not None and again is not None
    assert again.prompt_tokens == first.prompt_tokens
    # the second time the prompt is found in the slot's cache (llama.cpp's prompt cache)
    assert again.prompt_tokens_details is not None
    assert again.prompt_tokens_details.cached_tokens
    assert again.prompt_tokens_details.cached_tokens > 0


def test_completions_streamed_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(
        model=CHAT, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert whole.choices[0].text
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    pieces = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=CHAT,
            prompt="The capital of France is",
            max_tokens=8,
            temperature=0,
            stream=True,
        )
        if c.choices
    )
    assert pieces == whole.choices[0].text


def test_router_counts_tokens_of_a_stream_that_asked_no_usage(
    client: openai.OpenAI, router: Process
) -> None:
    def output_tokens() -> float:
        text = get(router.url + "/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("turnout_output_tokens_total{") and 'backend="llama"' in line
        )

    before = output_tokens()
    chunks = list(
        client.chat.completions.create(
            model=CHAT, messages=HELLO, max_tokens=12, temperature=0, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)  # the router asked, and stripped the answer
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content
    assert 0 < output_tokens() - before <= 12


def test_unknown_model_is_refused_although_llama_cpp_answers_any(
    client: openai.OpenAI, llama: Process
) -> None:
    direct = client_for(llama.url).chat.completions.create(
        model="no-such-model", messages=HELLO, max_tokens=2
    )
    assert direct.model == MODEL  # the engine itself does not check the name
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
    assert err.value.code == "model_not_found"


def test_prompt_over_the_slot_context_is_the_clients_error(
    client: openai.OpenAI, router: Process
) -> None:
    too_long: list[ChatCompletionMessageParam] = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=CHAT, messages=too_long, max_tokens=2)
    # llama.cpp's own error, passed through: no failover to the emulator, no ejection
    assert err.value.response.headers["x-turnout-backend"] == "llama"
    assert err.value.type == "exceed_context_size_error"
    assert backend(router, "llama")["healthy"]


async def test_load_is_scraped_from_llamacpp_metrics(router: Process, llama: Process) -> None:
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)

    async def hold(i: int) -> None:
        stream = await client.chat.completions.create(
            model=CHAT,
            messages=[{"role": "user", "content": f"Count slowly from one to a thousand ({i})."}],
            max_tokens=1000,
            stream=True,
            extra_headers={"X-Turnout-Policy": "llama-only"},
        )
        async with stream:
            async for _ in stream:
                pass

    async def eventually(predicate: Callable[[], bool]) -> bool:
        return await asyncio.to_thread(wait_for, predicate)

    # two more streams than slots: llama.cpp queues those two
    streams = [asyncio.create_task(hold(i)) for i in range(SLOTS + 2)]
    try:
        assert await eventually(lambda: engine_gauges(llama)["llamacpp:requests_deferred"] == 2)
        assert engine_gauges(llama)["llamacpp:requests_processing"] == SLOTS
        # ... and the router reads the same from the llamacpp:* series
        assert await eventually(
            lambda: (load(router)["running"], load(router)["waiting"]) == (SLOTS, 2)
        )
        assert load(router)["kv_cache_usage"] is None  # this llama.cpp exports no KV gauge
    finally:
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
        await client.close()
    assert await eventually(lambda: engine_gauges(llama)["llamacpp:requests_processing"] == 0)
    assert await eventually(lambda: load(router)["running"] == 0)


def test_client_closing_mid_stream_frees_the_slot(
    client: openai.OpenAI, router: Process, llama: Process
) -> None:
    stream = client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=2000,
        stream=True,
    )
    got = 0
    for chunk in stream:
        got += bool(chunk.choices and chunk.choices[0].delta.content)
        if got >= 3:
            break
    assert engine_gauges(llama)["llamacpp:requests_processing"] == 1
    stream.close()
    # llama.cpp notices the closed connection and releases the slot long before 2000 tokens
    assert wait_for(lambda: engine_gauges(llama)["llamacpp:requests_processing"] == 0, 10)
    assert wait_for(lambda: backend(router, "llama")["inflight"] == 0, 10)
    assert 'code="499"' in get(router.url + "/metrics").text


def test_unknown_kind_read_by_its_series_and_a_killed_engine_fails_over(
    emu: Process, tmp_path: Path
) -> None:
    # its own llama-server, so the kill in the failover test below leaves the module's alone
    with start_llama_server(slots=2) as server:
        doc = router_config(server.url, emu.url, engine="llama-cpp-by-another-name")
        with start_router(write_config(tmp_path, doc)) as r:
            assert wait_for(lambda: backend(r, "llama")["load"] is not None, 20)
            load = backend(r, "llama")["load"]
            assert (load["waiting"], load["running"]) == (0.0, 0.0)
            # killed: traffic for the shared model goes to the emulator
            server.proc.kill()
            server.proc.wait(10)
            raw = client_for(r.url).chat.completions.with_raw_response.create(
                model=CHAT, messages=HELLO, max_tokens=4
            )
            assert raw.headers["x-turnout-backend"] == "emu"
            assert raw.parse().model == EMU_MODEL
            assert wait_for(lambda: not backend(r, "llama")["healthy"], 10)
            streamed = client_for(r.url).chat.completions.with_raw_response.create(
                model=CHAT, messages=HELLO, max_tokens=4, stream=True
            )
            assert streamed.headers["x-turnout-backend"] == "emu"
            assert any(c.choices for c in streamed.parse())


async def test_replayer_fits_llama_cpp_tokenizer(llama: Process) -> None:
    # llama.cpp's /tokenize takes text, not chat messages: the replayer renders the template
    # with /apply-template first instead of falling back to the documented rule
    async with aiohttp.ClientSession() as session:
        fitted = await target_calibration(session, llama.url)
    assert fitted != Calibration()
    assert fitted.overhead > 0
    assert 0.5 < fitted.per_word < 3
