"""Classification order and request validation."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from policies.types import Endpoint, RequestClass, RequestInfo
from router.config.model import ClassificationSettings, Rule
from router.control.classify import classify, parse_body, with_prefix
from router.server.errors import RouterError

RULES = ClassificationSettings(
    default="interactive",
    rules=(
        Rule("batch", stream=False, max_tokens_at_least=1024),
        Rule("batch", prompt_tokens_at_least=100),
        Rule("batch", endpoint="embeddings"),
    ),
)


def info_of(
    doc: dict[str, Any],
    *,
    endpoint: Endpoint = "chat",
    header: str | None = None,
    key: RequestClass | None = None,
    settings: ClassificationSettings = RULES,
) -> RequestInfo:
    parsed = classify(
        orjson.dumps(doc),
        endpoint,
        request_id="r",
        header_class=header,
        key_class=key,
        session_key=None,
        settings=settings,
    )
    return parsed.info


def run(doc: dict[str, Any], **how: Any) -> str:
    """The class ``doc`` gets (``how``: :func:`info_of`'s options)."""
    return info_of(doc, **how).request_class


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_order_header_then_key_then_tier_then_rules() -> None:
    big = chat(max_tokens=4096)
    assert run(big) == "batch"  # rule
    assert run(big, header="interactive") == "interactive"  # header beats everything
    assert run(big, key="interactive") == "interactive"  # key beats tier and rules
    assert run(chat(service_tier="flex")) == "batch"
    assert run(chat(service_tier="flex"), key="interactive") == "interactive"
    assert run(chat(), header=" Batch ") == "batch"


def test_rules_need_all_conditions() -> None:
    assert run(chat(max_tokens=4096, stream=True)) == "interactive"
    assert run(chat(max_completion_tokens=2000, max_tokens=10)) == "batch"
    assert run(chat(max_tokens=1023)) == "interactive"
    long = [{"role": "user", "content": "word " * 200}]
    assert run({"model": "m", "messages": long, "stream": True}) == "batch"
    assert run({"model": "m", "input": "x"}, endpoint="embeddings") == "batch"


def test_header_ignored_when_not_honoured() -> None:
    settings = ClassificationSettings(honor_header=False, flex_is_batch=False)
    assert run(chat(service_tier="flex"), header="batch", settings=settings) == "interactive"


def test_bad_class_header() -> None:
    with pytest.raises(RouterError) as exc:
        run(chat(), header="urgent")
    assert exc.value.status == 400


def test_request_info_fields() -> None:
    doc = chat(max_tokens=7, stream=True, stream_options={"include_usage": True})
    parsed = classify(
        orjson.dumps(doc),
        "chat",
        request_id="rid",
        header_class=None,
        key_class=None,
        session_key="s",
        settings=RULES,
    )
    info = parsed.info
    assert (info.request_id, info.model, info.stream, info.max_tokens) == ("rid", "m", True, 7)
    assert info.prompt_tokens == 4 + 1 + 2  # message overhead + "hi" + reply overhead
    assert info.session_key == "s" and info.prefix_hash is not None
    assert parsed.include_usage


def test_n_choices_multiply_the_output_to_plan_for() -> None:
    info = info_of(chat(max_tokens=10, n=3))
    assert info.choices == 3 and info.expected_output_tokens == 30
    assert info_of(chat()).expected_output_tokens == 256


def test_a_responses_request_counts_as_the_chat_it_renders_to() -> None:
    message = {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    doc = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 2000, "input": [message]}
    info = info_of(doc, endpoint="responses")
    assert info.prompt_tokens == (4 + 3) + (4 + 1) + 2  # system, user, reply overheads
    assert info.max_tokens == 2000 and info.endpoint == "responses"
    assert run({"model": "m", "input": "hi", "max_output_tokens": 2000}, endpoint="responses") == (
        "batch"  # the max_tokens rule sees max_output_tokens
    )


def test_completion_prompt_as_token_ids() -> None:
    parsed = classify(
        b'{"model":"m","prompt":[1,2,3,4]}',
        "completions",
        request_id="r",
        header_class=None,
        key_class=None,
        session_key=None,
        settings=RULES,
    )
    assert parsed.info.prompt_tokens == 4


@pytest.mark.parametrize(
    ("body", "endpoint", "param"),
    [
        (b"", "chat", None),
        (b"nope", "chat", None),
        (b'"x"', "chat", None),
        (b'{"messages":[{"content":"x"}]}', "chat", "model"),
        (b'{"model":"","messages":[{"content":"x"}]}', "chat", "model"),
        (b'{"model":"m","messages":[]}', "chat", "messages"),
        (b'{"model":"m","messages":["x"]}', "chat", "messages"),
        (b'{"model":"m"}', "completions", "prompt"),
        (b'{"model":"m","prompt":5}', "completions", "prompt"),
        (b'{"model":"m"}', "embeddings", "input"),
        (b'{"model":"m","prompt":"x","stream":1}', "completions", "stream"),
        (b'{"model":"m","prompt":"x","max_tokens":true}', "completions", "max_tokens"),
        (
            b'{"model":"m","prompt":"x","max_completion_tokens":1.5}',
            "completions",
            "max_completion_tokens",
        ),
        (b'{"model":"m","prompt":"x","stream_options":[]}', "completions", "stream_options"),
    ],
)
def test_bad_bodies_are_400_with_param(body: bytes, endpoint: Endpoint, param: str | None) -> None:
    with pytest.raises(RouterError) as exc:
        parse_body(body, endpoint)
    assert exc.value.status == 400
    assert exc.value.param == param


def test_the_prefix_is_hashed_only_for_a_policy_that_reads_it() -> None:
    body = orjson.dumps(chat(messages=[{"role": "user", "content": "x" * 2000}]))
    args: dict[str, Any] = dict(
        request_id="r", header_class=None, key_class=None, session_key=None, settings=RULES
    )
    hashed = classify(body, "chat", **args).info
    assert hashed.prefix_hash is not None and len(hashed.prefix_blocks) == 7
    lazy = classify(body, "chat", prefix=False, **args)
    assert lazy.info.prefix_hash is None and lazy.info.prefix_blocks == ()
    assert with_prefix(lazy) == hashed  # hashed later, as a shadow policy may need it
