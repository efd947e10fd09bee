"""The emulator's OpenAI surface, exercised with the official client over loopback."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from functools import partial

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from emulator.profiles import load_profile
from router.backends.engines import parse_load
from tests.emulator.conftest import client_for
from tests.procs import Emulator, metric, start_emulator, wait_for
from turnout.common.tokens import count_chat, count_text

MODEL = "deepseek-v4.1-flash"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Name three rivers, please."}
]


def test_chat_stream_with_usage(emu: Emulator) -> None:
    client = client_for(emu)
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert usage.completion_tokens == 40 == count_text(text)
    assert usage.prompt_tokens == count_chat(MESSAGES)


def test_chat_whole_and_max_completion_tokens_wins(emu: Emulator) -> None:
    client = client_for(emu)
    resp = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=50,
        max_completion_tokens=7,
        extra_body={"min_tokens": 7},
    )
    assert resp.usage is not None and resp.usage.completion_tokens == 7
    assert count_text(resp.choices[0].message.content or "") == 7
    assert resp.choices[0].finish_reason == "length"
    assert resp.id.startswith("chatcmpl-")


def test_completions_stream_and_whole(emu: Emulator) -> None:
    client = client_for(emu)
    prompt = "Once upon a time, in a land far away,"
    whole = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, extra_body={"ignore_eos": True}
    )
    assert whole.usage is not None
    assert whole.usage.prompt_tokens == count_text(prompt)
    assert whole.usage.completion_tokens == 30 == count_text(whole.choices[0].text)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=30, stream=True, extra_body={"ignore_eos": True}
    )
    parts = [c.choices[0].text for c in stream if c.choices]
    assert count_text("".join(parts)) == 30
    assert whole.id.startswith("cmpl-")


def test_natural_stop_respects_min_tokens(emu: Emulator) -> None:
    client = client_for(emu)
    resp = client.completions.create(
        model=MODEL, prompt="x", max_tokens=2000, extra_body={"min_tokens": 3}
    )
    assert resp.usage is not None
    n = resp.usage.completion_tokens
    assert 3 <= n <= 2000
    assert resp.choices[0].finish_reason == ("length" if n == 2000 else "stop")


def _raw_post(emu: Emulator, path: str, body: dict[str, object], rid: str) -> bytes:
    req = urllib.request.Request(
        emu.url + path,
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json", "X-Request-Id": rid},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return bytes(resp.read())


def test_same_request_id_and_seed_give_same_bytes(emu: Emulator) -> None:
    body: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 25,
                               "stream": True, "ignore_eos": True}  # fmt: skip
    a = _raw_post(emu, "/v1/chat/completions", body, "req-42")
    b = _raw_post(emu, "/v1/chat/completions", body, "req-42")
    assert b'"id":"chatcmpl-req-42"' in a
    strip = [line.split(b'"created":')[0] + line.split(b',"model"')[-1] for line in a.split(b"\n")]
    strip_b = [
        line.split(b'"created":')[0] + line.split(b',"model"')[-1] for line in b.split(b"\n")
    ]
    assert strip == strip_b
    other = _raw_post(emu, "/v1/chat/completions", {**body, "max_tokens": 26}, "req-42")
    assert other.split(b"\n")[2] != a.split(b"\n")[2]  # another body, another text


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "nope", "prompt": "hi"}, 404, "nope"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 40000}, 400, "32768"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "n": 2}, 400, "n"),
        ({"model": MODEL, "prompt": 5}, 400, "prompt"),
        (
            {"model": MODEL, "prompt": "hi", "stream_options": {"include_usage": True}},
            400,
            "stream",
        ),
    ],
)
def test_bad_requests_get_openai_errors(
    vllm: Emulator, body: dict[str, object], status: int, needle: str
) -> None:
    client = client_for(vllm)
    with pytest.raises(openai.APIStatusError) as info:
        client.post("/completions", body=body, cast_to=object)
    assert info.value.status_code == status
    err = info.value.body  # the client unwraps {"error": ...}
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "param", "code"}
    assert needle in err["message"]


def test_context_error_names_both_numbers(vllm: Emulator) -> None:
    client = client_for(vllm)
    prompt = "word " * 32000
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=1000)
    message = str(info.value)
    assert "32768" in message and "33000" in message


def test_unknown_fields_are_ignored(vllm: Emulator) -> None:
    client = client_for(vllm)
    resp = client.completions.create(
        model=MODEL, prompt="hi", max_tokens=3, extra_body={"frobnicate": {"a": 1}, "top_k": 5}
    )
    assert resp.usage is not None and resp.usage.completion_tokens <= 3


def test_models_card(emu: Emulator) -> None:
    models = client_for(emu).models.list().data
    assert [m.id for m in models] == [MODEL]
    card = models[0].model_dump()
    assert card["owned_by"] == "vllm" and card["object"] == "model"
    assert card["root"] == MODEL and card["max_model_len"] == 32768


def test_embeddings_are_deterministic(vllm: Emulator) -> None:
    client = client_for(vllm)
    a = client.embeddings.create(model=MODEL, input=["alpha beta", "gamma"])
    b = client.embeddings.create(model=MODEL, input="alpha beta", encoding_format="float")
    assert len(a.data) == 2 and a.usage.prompt_tokens == 3
    assert a.data[0].embedding == pytest.approx(b.data[0].embedding, abs=1e-6)
    assert a.data[0].embedding != a.data[1].embedding
    assert sum(v * v for v in b.data[0].embedding) == pytest.approx(1.0, rel=1e-4)


def test_tokenize_health_and_metrics(vllm: Emulator) -> None:
    doc = orjson.loads(_raw_post(vllm, "/tokenize", {"prompt": "Hello, world!"}, "t"))
    assert doc["count"] == 4 == len(doc["tokens"]) and doc["max_model_len"] == 32768
    chat = orjson.loads(_raw_post(vllm, "/tokenize", {"messages": MESSAGES}, "t"))
    assert chat["count"] == count_chat(MESSAGES)
    with urllib.request.urlopen(vllm.url + "/health", timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(vllm.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
    ):
        assert f'{name}{{model_name="{MODEL}"' in text or f"{name}{{le=" in text, name
    # what a router sizes its prefix record by: the profile's whole KV cache
    profile = load_profile("vllm")
    whole = profile.kv_blocks_per_rank * profile.kv_block_size * profile.ranks
    assert parse_load(text, "vllm").kv_cache_tokens == whole == 1048576


def test_detokenize_spells_back_its_own_output(vllm: Emulator) -> None:
    text = client_for(vllm).completions.create(model=MODEL, prompt="go", max_tokens=30)
    generated = text.choices[0].text
    ids = orjson.loads(_raw_post(vllm, "/tokenize", {"prompt": generated}, "t"))["tokens"]
    back = orjson.loads(_raw_post(vllm, "/detokenize", {"model": MODEL, "tokens": ids}, "d"))
    assert back == {"prompt": generated}
    # a word outside the emulator's vocabulary has a stable id it cannot spell back
    odd = orjson.loads(_raw_post(vllm, "/tokenize", {"prompt": "the zebra, again"}, "t"))
    assert odd["count"] == 4
    back = orjson.loads(_raw_post(vllm, "/detokenize", {"tokens": odd["tokens"]}, "d"))
    assert back["prompt"].startswith("the <unk>,")


@pytest.mark.parametrize(
    ("body", "param"),
    [({"tokens": "1 2"}, "tokens"), ({"tokens": [1, 2.5]}, "tokens"), ({"tokens": [-1]}, "tokens"),
     ({"tokens": [100_000]}, "tokens"), ({"model": "other", "tokens": [5]}, "model")],
)  # fmt: skip
def test_detokenize_refuses_what_is_not_a_token_list(
    vllm: Emulator, body: dict[str, object], param: str
) -> None:
    with pytest.raises(urllib.error.HTTPError) as info:
        _raw_post(vllm, "/detokenize", body, "d")
    err = orjson.loads(info.value.read())["error"]
    assert info.value.code in (400, 404) and err["param"] == param and err["message"]


def test_priority_field_orders_waiting_requests() -> None:
    """One running slot; a later request with priority -1 overtakes earlier priority-5 ones,
    which keep their arrival order between them."""
    args = ["--set", "ranks=1", "--set", "max_num_seqs=1", "--set", "scheduling_policy=priority"]
    with start_emulator("vllm", time_scale=2, args=args) as emu:
        client = client_for(emu)
        done: list[str] = []

        def send(tag: str, priority: int) -> None:
            client.completions.create(
                model=MODEL, prompt=tag, max_tokens=20,
                extra_body={"ignore_eos": True, "priority": priority},
            )  # fmt: skip
            done.append(tag)

        def waiting() -> float:
            return metric(emu.url, "vllm:num_requests_waiting", required=True)

        threads: list[threading.Thread] = []
        # "first" holds the slot until its stream is closed, however slow the machine is,
        # and each request is seen waiting before the next is sent: no timing to guess.
        with client.completions.create(
            model=MODEL, prompt="first", max_tokens=4000, stream=True,
            extra_body={"ignore_eos": True, "priority": 0},
        ) as first:  # fmt: skip
            next(iter(first))
            for n, (tag, priority) in enumerate((("batch0", 5), ("batch1", 5), ("urgent", -1)), 1):
                threads.append(threading.Thread(target=send, args=(tag, priority)))
                threads[-1].start()
                assert wait_for(partial(_is, waiting, n)), (n, waiting())
        for t in threads:  # the slot is free: the queue is served by priority, then arrival
            t.join(60)
        assert done == ["urgent", "batch0", "batch1"], done


def _is(read: Callable[[], float], value: float) -> bool:
    return read() == value


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/v1/completions", None, 405),
        ("POST", "/v1/nothing", b"{}", 404),
        ("POST", "/v1/completions", b"{" + b" " * (9 * 1024 * 1024) + b"}", 413),
        ("POST", "/v1/completions", b"not json", 400),
    ],
)
def test_transport_level_errors_are_openai_json(
    vllm: Emulator, method: str, path: str, body: bytes | None, status: int
) -> None:
    req = urllib.request.Request(vllm.url + path, data=body, method=method)
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == status
    doc = orjson.loads(info.value.read())
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["code"] == status
