"""API keys over a real router: 401/403/429 as OpenAI errors, limits, overrides, admin."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, request, start_router, write_config
from turnout.common.capture import parse_line

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
KEYS = {
    "admin": "k-admin-1",
    "web": "k-web-2",
    "rpm": "k-rpm-3",
    "tpm": "k-tpm-4",
    "pin": "k-pin-5",
}


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auth-capture") / "capture.jsonl"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, capture: Path) -> Iterator[Process]:
    tmp = tmp_path_factory.mktemp("auth")
    (tmp / "rpm.key").write_text(KEYS["rpm"] + "\n")
    mp = pytest.MonkeyPatch()
    mp.setenv("SY_HARDENING_WEB_KEY", KEYS["web"])
    try:
        with start_emulator("vllm", time_scale=20) as emu:
            doc = base_config([("vllm", "vllm", emu.url)])
            doc["require_api_key"] = True
            doc["capture"] = {"path": str(capture)}
            doc["api_keys"] = [
                {"name": "ops", "sha256": hashlib.sha256(KEYS["admin"].encode()).hexdigest(),
                 "admin": True},
                {"name": "web", "env": "SY_HARDENING_WEB_KEY", "models": [MODEL],
                 "max_concurrency": 1},
                {"name": "rpm", "file": str(tmp / "rpm.key"), "requests_per_minute": 2},
                {"name": "tpm", "sha256": hashlib.sha256(KEYS["tpm"].encode()).hexdigest(),
                 "tokens_per_minute": 300},
                {"name": "pin", "sha256": hashlib.sha256(KEYS["pin"].encode()).hexdigest(),
                 "policy": "round-robin", "class": "batch"},
            ]  # fmt: skip
            with start_router(write_config(tmp, doc)) as proc:
                yield proc
    finally:
        mp.undo()


def client(router: Process, key: str, **headers: str) -> openai.OpenAI:
    """Close it (``with``): its pooled connections would otherwise outlive the test."""
    return openai.OpenAI(
        base_url=router.url + "/v1",
        api_key=key,
        max_retries=0,
        timeout=30,
        default_headers=headers,
    )


def chat(router: Process, key: str, model: str = MODEL, max_tokens: int = 4) -> ChatCompletion:
    with client(router, key) as c:
        return c.chat.completions.create(model=model, messages=CHAT, max_tokens=max_tokens)


def test_missing_and_wrong_keys_are_401(router: Process) -> None:
    with pytest.raises(openai.AuthenticationError) as exc:
        chat(router, "k-wrong")
    assert exc.value.code == "invalid_api_key"
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2}
    reply = request("POST", router.url + "/v1/chat/completions", body)  # no Authorization
    assert reply.status == 401
    assert reply.json()["error"]["type"] == "authentication_error"


def test_model_outside_the_key_list_is_403(router: Process) -> None:
    with pytest.raises(openai.PermissionDeniedError) as exc:
        chat(router, KEYS["web"], model="other-model")
    assert exc.value.code == "model_not_allowed"
    chat(router, KEYS["admin"])  # a key without a list may use anything served


def test_requests_per_minute_is_429_with_retry_after(router: Process) -> None:
    chat(router, KEYS["rpm"])
    chat(router, KEYS["rpm"])
    with pytest.raises(openai.RateLimitError) as exc:
        chat(router, KEYS["rpm"])
    assert int(exc.value.response.headers["retry-after"]) >= 1
    assert exc.value.code == "rate_limit_exceeded"


def test_tokens_per_minute(router: Process) -> None:
    chat(router, KEYS["tpm"], max_tokens=280)  # the charge fits the full bucket
    with pytest.raises(openai.RateLimitError):
        chat(router, KEYS["tpm"], max_tokens=280)


def test_max_concurrency(router: Process) -> None:
    with client(router, KEYS["web"]) as c:
        stream = c.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            # Long enough (about 1.2 s at this time scale) to outlast building the second
            # client on a loaded machine; closed below as soon as it has made its point.
            max_tokens=2000,
            stream=True,
            extra_body={"min_tokens": 2000},
        )
        try:
            next(iter(stream))
            with pytest.raises(openai.RateLimitError):
                chat(router, KEYS["web"])
        finally:
            stream.close()
    deadline = time.monotonic() + 10
    while True:  # the slot frees when the router sees the disconnect
        try:
            chat(router, KEYS["web"])
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_key_policy_and_class_overrides(router: Process) -> None:
    with client(router, KEYS["pin"]) as c:
        raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2)
    assert raw.headers["x-turnout-policy"] == "round-robin"
    assert raw.headers["x-turnout-class"] == "batch"
    claims = {"X-Turnout-Policy": "class-split", "X-Request-Class": "interactive"}
    with client(router, KEYS["pin"], **claims) as c:
        raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=2)
    # the key's own policy and class win: its holder cannot claim another's priority
    assert raw.headers["x-turnout-policy"] == "round-robin"
    assert raw.headers["x-turnout-class"] == "batch"


def test_admin_endpoints_need_the_admin_key(router: Process) -> None:
    url = router.url + "/turnout/backends"
    assert request("GET", url).status == 401
    reply = request("GET", url, headers={"Authorization": f"Bearer {KEYS['web']}"})
    assert reply.status == 403 and reply.json()["error"]["type"] == "permission_error"
    reply = request("GET", url, headers={"Authorization": f"Bearer {KEYS['admin']}"})
    assert reply.status == 200 and reply.json()[0]["name"] == "vllm"
    assert request("GET", router.url + "/health").status == 200
    assert request("GET", router.url + "/metrics").status == 200  # metrics_require_admin is off


def test_the_policy_list_answers_every_caller_the_request_path_takes(router: Process) -> None:
    # The request path names every policy to such a caller anyway (an unknown X-Turnout-Policy
    # is a 400 listing them), so the list is no admin secret: replay checks --policy there.
    url = router.url + "/turnout/policies"
    assert request("GET", url).status == 401
    assert request("GET", url, headers={"Authorization": "Bearer k-unknown"}).status == 401
    reply = request("GET", url, headers={"Authorization": f"Bearer {KEYS['web']}"})
    assert reply.status == 200
    assert {p["name"] for p in reply.json()} >= {"class-split", "round-robin"}


def test_keys_are_never_captured(router: Process, capture: Path) -> None:
    ids = ["tenant-a1", "tenant-a2", "tenant-p1"]
    for rid, key in zip(ids, (KEYS["admin"], KEYS["admin"], KEYS["pin"]), strict=True):
        with client(router, key, **{"X-Request-Id": rid}) as c:
            c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
    deadline = time.monotonic() + 10
    while True:
        raw = capture.read_bytes().splitlines() if capture.exists() else []
        lines = {rec.custom_id: rec for rec in map(parse_line, raw)}
        if all(rid in lines for rid in ids):
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    text = capture.read_text()
    assert not any(key in text for key in KEYS.values())
    assert "Bearer" not in text
    # each line names its tenant by a keyed hash: stable per key, distinct across keys,
    # neither the key, its digest nor its configured name
    tenants = [lines[rid].route.tenant for rid in ids]  # type: ignore[union-attr]
    assert tenants[0] is not None and tenants[0] == tenants[1] != tenants[2]
    digest = hashlib.sha256(KEYS["admin"].encode()).hexdigest()
    assert tenants[0] not in digest and tenants[0] not in ("ops", "pin")
