"""Client API keys: the key's class steers the request (headers override it only where the key
allows); unknown keys get 401 when required."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    mp = pytest.MonkeyPatch()
    mp.setenv("SY_TEST_KEY_EVALS", "k-evals")
    mp.setenv("SY_TEST_KEY_WEB", "k-web")
    mp.setenv("SY_TEST_KEY_OPS", "k-ops")
    try:
        with (
            start_emulator("vllm", time_scale=50) as vllm,
            start_emulator("deepinfer", time_scale=50) as deepinfer,
        ):
            doc = base_config(
                [("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)]
            )
            doc["api_keys"] = [
                {"name": "evals", "env": "SY_TEST_KEY_EVALS", "class": "batch"},
                {"name": "web", "env": "SY_TEST_KEY_WEB"},
                {
                    "name": "ops",
                    "env": "SY_TEST_KEY_OPS",
                    "class": "batch",
                    "allow_overrides": True,
                },
            ]
            doc["require_api_key"] = True
            with start_router(write_config(tmp_path_factory.mktemp("keys"), doc)) as proc:
                yield proc
    finally:
        mp.undo()


def client(router: Process, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=router.url + "/v1", api_key=key, max_retries=0, default_headers=headers
    )


def test_key_class_steers(router: Process) -> None:
    raw = client(router, "k-evals").chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=2,
    )
    assert raw.headers["x-turnout-class"] == "batch"
    assert raw.headers["x-turnout-backend"] == "deepinfer"


def test_key_without_class_uses_the_rules(router: Process) -> None:
    raw = client(router, "k-web").chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=2,
    )
    assert raw.headers["x-turnout-class"] == "interactive"


def test_the_keys_class_beats_the_header(router: Process) -> None:
    """A batch key cannot claim interactive priority with a header."""
    c = client(router, "k-evals", **{"X-Request-Class": "interactive"})
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert raw.headers["x-turnout-class"] == "batch"


def test_a_key_that_allows_overrides_follows_the_header(router: Process) -> None:
    c = client(router, "k-ops", **{"X-Request-Class": "interactive"})
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert raw.headers["x-turnout-class"] == "interactive"


def test_a_key_without_a_class_takes_the_header(router: Process) -> None:
    c = client(router, "k-web", **{"X-Request-Class": "batch"})
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert raw.headers["x-turnout-class"] == "batch"


def test_unknown_key_is_401(router: Process) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        client(router, "wrong").chat.completions.create(model=MODEL, messages=CHAT)
    assert exc.value.code == "invalid_api_key"
