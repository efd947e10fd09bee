"""The router in front of two real emulators, driven by the official openai client."""

from __future__ import annotations

import re
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say something about routers."}
]


@pytest.fixture(scope="module")
def emulators() -> Iterator[dict[str, Process]]:
    with (
        start_emulator("vllm", time_scale=50, seed=7) as vllm,
        start_emulator("deepinfer", time_scale=50, seed=7) as deepinfer,
    ):
        yield {"vllm": vllm, "deepinfer": deepinfer}


@pytest.fixture(scope="module")
def router(
    emulators: dict[str, Process], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    backends = [(n, n, e.url) for n, e in emulators.items()]
    doc = base_config(
        backends,
        listen={"host": "127.0.0.1", "port": 0, "max_body_bytes": 65536},
        aliases={"fast": {"vllm": MODEL}},
    )
    for backend in doc["backends"]:  # the fault tests below steer the emulators through it
        backend["forward_headers"] = ["X-Emulator-Fault"]
    path = write_config(tmp_path_factory.mktemp("router"), doc)
    with start_router(path) as proc:
        yield proc.url


def test_stream_chat_goes_to_vllm_and_says_so(router: str) -> None:
    client = client_for(router)
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        stream=True,
    ) as resp:
        assert resp.headers["x-turnout-backend"] == "vllm"
        assert resp.headers["x-turnout-class"] == "interactive"
        assert resp.headers["x-turnout-policy"] == "class-split"
        assert resp.headers["x-request-id"]
        chunks = list(resp.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    # the router asked for usage on the client's behalf and removed that chunk again
    assert all(c.usage is None for c in chunks)


def test_stream_with_usage_keeps_usage_chunk(router: str) -> None:
    stream = client_for(router).chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in stream if c.usage is not None]
    assert len(usage) == 1 and usage[0].completion_tokens == 6


def test_batch_class_header_steers_to_deepinfer(router: str) -> None:
    client = client_for(router, **{"X-Request-Class": "batch"})
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=4,
    )
    assert raw.headers["x-turnout-backend"] == "deepinfer"
    assert raw.headers["x-turnout-class"] == "batch"
    assert raw.parse().usage is not None


def test_flex_service_tier_is_batch(router: str) -> None:
    raw = client_for(router).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=4,
        service_tier="flex",
    )
    assert raw.headers["x-turnout-class"] == "batch"


def test_policy_header_picks_named_policy(router: str) -> None:
    client = client_for(router, **{"X-Turnout-Policy": "deepinfer-only"})
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert raw.headers["x-turnout-backend"] == "deepinfer"
    assert raw.headers["x-turnout-policy"] == "deepinfer-only"
    assert raw.parse().choices[0].text


def test_unknown_policy_is_400(router: str) -> None:
    client = client_for(router, **{"X-Turnout-Policy": "nope"})
    with pytest.raises(openai.BadRequestError) as exc:
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert "nope" in exc.value.message


def test_completions_stream(router: str) -> None:
    stream = client_for(router).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True
    )
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text


def test_embeddings(router: str) -> None:
    out = client_for(router).embeddings.create(model=MODEL, input=["a", "b c"])
    assert len(out.data) == 2 and out.data[0].embedding


def test_models_lists_backend_models_and_aliases(router: str) -> None:
    ids = {m.id for m in client_for(router).models.list()}
    assert ids == {MODEL, "fast"}


def test_alias_rewrites_model_for_the_backend(router: str) -> None:
    raw = client_for(router).chat.completions.with_raw_response.create(
        model="fast",
        messages=CHAT,
        max_tokens=3,
    )
    assert raw.headers["x-turnout-backend"] == "vllm"
    assert raw.parse().model == MODEL


def _normalise(data: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', data)


def test_sse_bytes_identical_to_direct_with_usage(
    router: str, emulators: dict[str, Process]
) -> None:
    body = {
        "model": MODEL,
        "messages": CHAT,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"X-Request-Id": "same-id-usage"}
    direct = post(emulators["vllm"].url + "/v1/chat/completions", body, headers=headers)
    via = post(
        router + "/v1/chat/completions",
        body,
        headers={**headers, "X-Turnout-Policy": "vllm-only"},
    )
    assert via.status == direct.status == 200
    assert via.headers["x-request-id"] == "same-id-usage"
    assert b"[DONE]" in direct.content and b'"usage"' in direct.content
    assert _normalise(via.content) == _normalise(direct.content)


def test_sse_bytes_without_usage_are_the_engines_minus_the_injected_usage_event(
    router: str, emulators: dict[str, Process]
) -> None:
    """The router asks the engine for usage on the client's behalf; the client must get exactly
    what the engine sends a client that did not ask, without the injected usage event."""
    raw = (
        b'{"model":"deepseek-v4.1-flash","messages":[{"role":"user","content":"Hi"}],'
        b'"max_tokens":9,"stream":true}'
    )
    headers = {"X-Request-Id": "same-id-no-usage"}
    direct = post(emulators["vllm"].url + "/v1/chat/completions", raw, headers=headers)
    via = post(
        router + "/v1/chat/completions",
        raw,
        headers={**headers, "X-Turnout-Policy": "vllm-only"},
    )
    assert b'"usage"' not in direct.content
    assert b'"usage"' not in via.content
    assert _normalise(via.content) == _normalise(direct.content)


def test_non_stream_bytes_identical_to_direct(router: str, emulators: dict[str, Process]) -> None:
    body = {"model": MODEL, "prompt": "abc def", "max_tokens": 7}
    headers = {"X-Request-Id": "same-id-nonstream"}
    direct = post(emulators["deepinfer"].url + "/v1/completions", body, headers=headers)
    via = post(
        router + "/v1/completions",
        body,
        headers={**headers, "X-Turnout-Policy": "deepinfer-only"},
    )
    assert _normalise(via.content) == _normalise(direct.content)
    assert via.headers["content-type"] == direct.headers["content-type"]


def test_emulator_503_passes_through_after_failover(router: str) -> None:
    client = client_for(router, **{"X-Emulator-Fault": "status=503"})
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    assert exc.value.status_code == 503
    metrics = get(router + "/metrics").text
    assert re.search(
        r'turnout_failovers_total\{backend="vllm",policy="class-split"\} [1-9]', metrics
    )


def test_mid_stream_failure_ends_with_error_event(router: str) -> None:
    resp = post(
        router + "/v1/chat/completions",
        {"model": MODEL, "messages": CHAT, "max_tokens": 50, "stream": True},
        headers={"X-Emulator-Fault": "drop_after=3"},
    )
    assert resp.status == 200
    events = [e for e in resp.content.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert events[-2].startswith(b'data: {"error"')
    client = client_for(router, **{"X-Emulator-Fault": "drop_after=3"})
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=50,
        stream=True,
    )
    with stream, pytest.raises(openai.APIError):  # closed even though iteration raises
        for _ in stream:
            pass


BAD = [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (b'{"messages": []}', 400, "model"),
    (b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    (b'{"model": "deepseek-v4.1-flash"}', 400, "messages"),
    (b'{"model": "deepseek-v4.1-flash", "messages": "hi"}', 400, "messages"),
    (
        b'{"model": "deepseek-v4.1-flash", "messages": [{"content": "x"}], "stream": "yes"}',
        400,
        "stream",
    ),
    (
        b'{"model": "deepseek-v4.1-flash", "messages": [{"content": "x"}], "max_tokens": -1}',
        400,
        "max_tokens",
    ),
    (b'{"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    (b'{"model": "m", "prompt": "' + b"x" * 70000 + b'"}', 413, None),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_input_gets_openai_error(
    router: str, body: bytes, status: int, param: str | None
) -> None:
    resp = post(router + "/v1/chat/completions", body)
    assert resp.status == status
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param
    assert resp.headers["x-request-id"]


def test_unknown_route_and_method_are_openai_errors(router: str) -> None:
    resp = get(router + "/v1/nothing")
    assert resp.status == 404 and "error" in resp.json()
    resp = get(router + "/v1/chat/completions")
    assert resp.status == 405 and "error" in resp.json()


def test_bad_class_header_is_400(router: str) -> None:
    client = client_for(router, **{"X-Request-Class": "urgent"})
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)


def test_operational_endpoints(router: str) -> None:
    assert get(router + "/health").json()["status"] == "ok"
    assert get(router + "/ready").status == 200
    backends = get(router + "/turnout/backends").json()
    assert [b["name"] for b in backends] == ["vllm", "deepinfer"]
    assert all(b["healthy"] and b["inflight"] == 0 for b in backends)
    # each engine's own /metrics was scraped with its kind's metric names
    for b in backends:
        load = b["load"]
        assert set(load) == {"waiting", "running", "kv_cache_usage", "kv_cache_tokens"}
        assert all(isinstance(v, float) and v >= 0 for v in load.values())
    policies = get(router + "/turnout/policies").json()
    # no policy of this config declares SLOs: none to judge goodput by
    assert {"name": "class-split", "type": "class-split", "default": True, "slo": None} in policies
    assert sum(p["default"] for p in policies) == 1


def test_metrics_are_labelled_per_policy_backend_class(router: str) -> None:
    client_for(router).chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3)
    text = get(router + "/metrics").text
    assert re.search(
        r'turnout_requests_total\{backend="vllm",class="interactive",code="200",'
        r'policy="class-split",reason="ok"\} [1-9]',
        text,
    )
    assert 'turnout_time_to_first_token_seconds_bucket{backend="vllm"' in text
    assert re.search(r'turnout_output_tokens_total\{backend="vllm".*\} [1-9]', text)
    assert 'turnout_backend_up{backend="deepinfer"} 1.0' in text
    assert 'turnout_policy_decision_seconds_count{policy="class-split"}' in text


def test_request_id_is_generated_and_sent_upstream(router: str) -> None:
    raw = client_for(router).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=2,
    )
    rid = raw.headers["x-request-id"]
    assert rid.startswith("req-")
    assert raw.parse().id == f"chatcmpl-{rid}"  # the emulator names its answer after the id
    given = client_for(router, **{"X-Request-Id": "mine-1"}).completions.with_raw_response
    out = given.create(model=MODEL, prompt="x", max_tokens=2)
    assert out.headers["x-request-id"] == "mine-1"
    assert out.parse().id.endswith("mine-1")
