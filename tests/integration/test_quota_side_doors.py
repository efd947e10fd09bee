"""Quotas without side doors, over a real router in front of an emulator and a scripted
hostile backend (tests/misbehaving.py). Each test is an attack that worked before:

- a backend reporting ``max_model_len: 1`` made every answer cost one token;
- usage of ``n`` choices was bounded by one context length;
- a client that left a non-streamed request before its answer was refunded in full;
- ``/tokenize`` and ``/detokenize`` skipped the key's model list, rate and concurrency;
- a key over its quota still had its body read and parsed before the 429.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.procs import Process, start_emulator, start_misbehaving
from tests.router.harness import base_config, post, request, start_router, write_config

MODEL = "deepseek-v4.1-flash"
OTHER = "other-model"
"""An alias of the emulator's model that the restricted key may not use."""
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
KEYS = {name: f"sk-{name}-side-door" for name in ("ops", "tpm", "tok", "once", "single", "small")}


def _key(name: str, **limits: Any) -> dict[str, Any]:
    return {"name": name, "sha256": hashlib.sha256(KEYS[name].encode()).hexdigest(), **limits}


def _router_doc(emulator: str, hostile: str, *keys: dict[str, Any]) -> dict[str, Any]:
    doc = base_config([("emu", "vllm", emulator), ("hostile", "vllm", hostile)])
    doc["aliases"] = {OTHER: {"emu": MODEL}}
    doc["api_keys"] = [_key("ops", admin=True), *keys]
    doc["require_api_key"] = True
    return doc


def _client(router: Process, key: str, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=router.url + "/v1", api_key=KEYS[key], max_retries=0, timeout=timeout
    )


def _backends(router: Process) -> dict[str, dict[str, Any]]:
    """``/turnout/backends``, by name (asked with the admin key)."""
    auth = {"Authorization": f"Bearer {KEYS['ops']}"}
    listed = request("GET", router.url + "/turnout/backends", headers=auth).json()
    return {b["name"]: b for b in listed}


def _wait_backend(router: Process, backend: str, field: str, value: object) -> None:
    """Until ``/turnout/backends`` shows ``field`` of ``backend`` at ``value``."""
    deadline = time.monotonic() + 10
    while (shown := _backends(router)[backend])[field] != value:
        assert time.monotonic() < deadline, shown
        time.sleep(0.05)


def _wait_idle(router: Process) -> None:
    deadline = time.monotonic() + 10
    while any(b["inflight"] for b in _backends(router).values()):
        assert time.monotonic() < deadline, "requests still in flight"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with start_emulator("vllm", time_scale=20) as emu, start_misbehaving() as hostile:
        doc = _router_doc(
            emu.url,
            hostile.url,
            _key("tpm", tokens_per_minute=200_000),
            _key("tok", models=[MODEL], requests_per_minute=5),
            _key("once", requests_per_minute=1),
            _key("single", max_concurrency=1),
            _key("small", tokens_per_minute=1000),
        )
        with start_router(write_config(tmp_path_factory.mktemp("side-doors"), doc)) as proc:
            yield proc


def test_a_backend_reporting_a_context_of_one_cannot_switch_off_token_limits(
    tmp_path: Path,
) -> None:
    with (
        start_emulator("vllm", time_scale=50) as emu,
        start_misbehaving("--max-model-len", "1") as hostile,
    ):
        doc = _router_doc(emu.url, hostile.url, _key("tpm", tokens_per_minute=40_000))
        with start_router(write_config(tmp_path, doc)) as router:
            _wait_backend(router, "hostile", "context_tokens", 1)
            client = _client(router, "tpm")
            served, refused = 0, 0
            for _ in range(30):
                try:
                    reply = client.chat.completions.create(
                        model="full-budget", messages=HI, max_tokens=16_000
                    )
                except openai.RateLimitError as exc:
                    assert exc.code == "rate_limit_exceeded"
                    refused += 1
                    continue
                assert reply.usage is not None and reply.usage.completion_tokens == 16_000
                served += 1
    # 16,000 tokens an answer through 40,000 a minute: two, or three with the refill.
    assert 2 <= served <= 3 and refused == 30 - served


def test_n_choices_are_charged_per_choice(router: Process) -> None:
    client = _client(router, "tpm")

    def eight() -> ChatCompletion:
        return client.chat.completions.create(
            model="full-budget", messages=HI, n=8, max_tokens=16_000
        )

    reply = eight()
    assert reply.usage is not None and reply.usage.completion_tokens == 128_000
    # Billed 128,005 of 200,000 (one context length, 32,768, before): no room for another.
    with pytest.raises(openai.RateLimitError):
        eight()


def test_a_client_that_leaves_before_the_answer_pays_the_budget(tmp_path: Path) -> None:
    """It leaves with a reset (a client that merely shuts its sending side is still
    answered: router.server.wire), while the engine generates its 30,000 tokens."""
    with start_emulator("vllm", time_scale=20) as emu, start_misbehaving() as hostile:
        doc = _router_doc(emu.url, hostile.url, _key("tpm", tokens_per_minute=40_000))
        with start_router(write_config(tmp_path, doc)) as router:
            body = json.dumps(
                {
                    "model": MODEL,
                    "messages": HI,
                    "max_tokens": 30_000,
                    "min_tokens": 30_000,
                    "ignore_eos": True,
                }
            ).encode()
            with socket.create_connection(_addr(router), timeout=5) as sock:
                sock.sendall(_head("/v1/chat/completions", "tpm", body))
                _wait_backend(router, "emu", "inflight", 1)
                _reset(sock)
            _wait_idle(router)
            # Charged its 30,000-token budget (refunded in full before): the next one waits.
            with pytest.raises(openai.RateLimitError):
                _client(router, "tpm").chat.completions.create(
                    model=MODEL, messages=HI, max_tokens=30_000
                )


def _tokenize(router: Process, key: str, **body: Any) -> tuple[int, dict[str, Any]]:
    reply = post(router.url + "/tokenize", body, {"Authorization": f"Bearer {KEYS[key]}"})
    return reply.status, reply.json()


def test_tokenizer_calls_keep_the_keys_model_list_and_rate(router: Process) -> None:
    status, doc = _tokenize(router, "tok", model=OTHER, prompt="hello")
    assert status == 403 and doc["error"]["code"] == "model_not_allowed"
    status, doc = _tokenize(router, "tok", prompt="hello")  # no model: any backend's
    assert status == 403 and doc["error"]["code"] == "model_not_allowed"
    statuses = [_tokenize(router, "tok", model=MODEL, prompt="hello")[0] for _ in range(20)]
    # 5 a minute: the refused calls above took none of them.
    assert 5 <= statuses.count(200) <= 6 and statuses.count(429) == 20 - statuses.count(200)
    detokenized = post(
        router.url + "/detokenize",
        {"model": MODEL, "tokens": [1, 2]},
        {"Authorization": f"Bearer {KEYS['tok']}"},
    )
    assert detokenized.status == 429


def test_tokenizer_calls_take_a_concurrent_slot(router: Process) -> None:
    held = socket.create_connection(_addr(router), timeout=5)
    try:  # a call the hostile backend never answers holds the key's one slot
        held.sendall(_head("/tokenize", "single", b'{"model": "hang", "prompt": "x"}'))
        _wait_backend(router, "hostile", "inflight", 1)
        status, doc = _tokenize(router, "single", model=MODEL, prompt="hello")
        assert status == 429 and "requests open" in doc["error"]["message"]
    finally:
        _reset(held)  # the client leaves: the slot is freed
    _wait_idle(router)
    assert _tokenize(router, "single", model=MODEL, prompt="hello")[0] == 200


def _addr(router: Process) -> tuple[str, int]:
    parts = urlsplit(router.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _reset(sock: socket.socket) -> None:
    """Leave with a reset, not a half-close (which asks for the answer still)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _head(path: str, key: str, body: bytes, length: int | None = None) -> bytes:
    """A request's head and ``body``; ``length``: the Content-Length declared (default: the
    body's)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEYS[key]}\r\n"
        f"Content-Length: {len(body) if length is None else length}\r\n\r\n"
    ).encode() + body


def _refused_before_the_body(router: Process, key: str) -> dict[str, Any]:
    """Send the head of an 8 MiB request and 1 KiB of it: the answer must come without the
    rest (the router did not wait for, read or parse it)."""
    with socket.create_connection(_addr(router), timeout=5) as sock:
        sock.sendall(_head("/v1/chat/completions", key, b"{" + b" " * 1023, 8 << 20))
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)  # times out (5 s) if the router waits for the body
            assert chunk, data
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429"), head
    assert b"retry-after:" in head.lower() and b"connection: close" in head.lower()
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["code"] == "rate_limit_exceeded"
    return error


def test_over_its_request_rate_the_body_is_not_read(router: Process) -> None:
    _client(router, "once").chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
    assert "requests per minute" in _refused_before_the_body(router, "once")["message"]


def test_over_its_token_rate_the_body_is_not_read(router: Process) -> None:
    # 2,000 tokens used of 1,000 a minute: the key is in debt.
    _client(router, "small").chat.completions.create(
        model="full-budget", messages=HI, max_tokens=2000
    )
    assert "tokens per minute" in _refused_before_the_body(router, "small")["message"]


def test_at_its_concurrency_the_body_is_not_read(router: Process) -> None:
    held = socket.create_connection(_addr(router), timeout=5)
    try:  # a request the hostile backend never answers holds the key's one slot
        body = b'{"model": "hang", "messages": [{"role": "user", "content": "hi"}]}'
        held.sendall(_head("/v1/chat/completions", "single", body))
        _wait_backend(router, "hostile", "inflight", 1)
        assert "requests open" in _refused_before_the_body(router, "single")["message"]
    finally:
        _reset(held)
    _wait_idle(router)
