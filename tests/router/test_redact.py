"""Capture redaction by allow-list, and the keyed filler of ``hash`` (router.observe.redact)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.config.model import Redaction
from router.observe.redact import (
    _ascii_filler,
    _run_filler,
    hash_text,
    prompt_size,
    redact,
    redact_error,
)
from turnout.common.tokens import count_chat, count_text, response_messages

KEY = bytes(range(32))
MODES: tuple[Redaction, ...] = ("hash", "drop")

# Each leak of issue 12, as a body fragment whose secret contains "leak-<name>".
LEAKS: dict[str, dict[str, Any]] = {
    "documents": {"documents": [{"title": "leak-documents", "text": "x leak-documents"}]},
    "prediction": {"prediction": {"type": "content", "content": "leak-prediction"}},
    "tool description": {
        "tools": [
            {
                "type": "function",
                "function": {"name": "lookup", "description": "leak-tooldesc"},
            }
        ]
    },
    "tool parameter schema": {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "leak-propname": {
                                "type": "string",
                                "description": "leak-paramdesc",
                                "enum": ["leak-enum", "other"],
                            }
                        },
                        "required": ["leak-propname"],
                    },
                },
            }
        ]
    },
    "response_format schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "leak-schemaname",
                "schema": {"type": "object", "title": "leak-schematitle", "default": "leak-d"},
            },
        }
    },
    "user": {"user": "leak-user"},
    "metadata": {"metadata": {"leak-metakey": "leak-metavalue"}},
    "stop": {"stop": ["leak-stop"]},
    "stop string": {"stop": "leak-stop"},
    "chat_template_kwargs": {"chat_template_kwargs": {"enable_thinking": False, "x": "leak-ctk"}},
    "top-level system": {"system": "leak-system"},
    "content-part id": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "id": "leak-p"}]}]
    },
    "tool_call_id": {"messages": [{"role": "tool", "tool_call_id": "leak-tcid", "content": "ok"}]},
    "unknown field": {"vendor_extension": {"deep": ["leak-unknown", {"k": "leak-unknown"}]}},
    "unknown role": {"messages": [{"role": "leak-role", "content": "a"}]},
    "tool_choice name": {
        "tool_choice": {"type": "function", "function": {"name": "leak-choice"}},
    },
    # issue 26: data in the names of keys the client chose, where the API defines the object
    "top-level key name": {"leak_topkey": 1, "leak-flag": True},
    "chat_template_kwargs key name": {"chat_template_kwargs": {"leak_ctkey": True}},
    "message key name": {"messages": [{"role": "user", "content": "a", "leak_msgkey": 2}]},
    "content-part key name": {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a", "leak_pk": 0}]}]
    },
    "tool key name": {"tools": [{"type": "function", "function": {"name": "f", "leak_fk": 1}}]},
    "schema keyword name": {"guided_json": {"type": "object", "leak_keyword": 3}},
    "stream_options key name": {"stream_options": {"include_usage": True, "leak_so": True}},
}


def _written(body: dict[str, Any], mode: Redaction, key: bytes = KEY) -> bytes:
    return orjson.dumps(redact(body, mode, key))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("leak", sorted(LEAKS))
def test_no_listed_leak_reaches_the_line(leak: str, mode: Redaction) -> None:
    body = {"model": "m", "max_tokens": 5, **LEAKS[leak]}
    out = _written(body, mode)
    assert b"leak" not in out
    assert orjson.loads(out)["model"] == "m"


def _structured() -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "my password is hunter2"}]},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "result"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look it up",
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"$ref": "#/$defs/Query"}},
                        "required": ["q"],
                        "$defs": {"Query": {"type": "string", "maxLength": 9}},
                    },
                },
            }
        ],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 7,
        "max_tokens": 5,
        "logit_bias": {"50256": -100},
        "stop": ["END"],
        "metadata": {"team": "a"},
    }


def test_hash_keeps_structure_and_replaces_every_other_string() -> None:
    body = _structured()
    out = redact(body, "hash", KEY)
    text = orjson.dumps(out).decode()
    for word in ("hunter2", "password", "terse", "lookup", "Look", "result", "END", "team"):
        assert word not in text
    assert [m["role"] for m in out["messages"]] == ["system", "user", "assistant", "tool"]
    assert out["messages"][1]["content"][0]["type"] == "text"
    call = out["messages"][2]["tool_calls"][0]
    assert call["type"] == "function"
    # the same text hashes the same: a call's id still matches its answer's tool_call_id,
    # a required property its name, a $ref the $defs entry it names
    assert call["id"] == out["messages"][3]["tool_call_id"] != "call_1"
    assert call["function"]["name"] == out["tools"][0]["function"]["name"]
    params = out["tools"][0]["function"]["parameters"]
    assert list(params["properties"]) == params["required"] != ["q"]
    (defined,) = params["$defs"]
    assert params["properties"][params["required"][0]] == {"$ref": f"#/$defs/{defined}"}
    assert params["$defs"][defined] == {"type": "string", "maxLength": 9}
    for k in ("model", "tool_choice", "response_format", "stream", "stream_options"):
        assert out[k] == body[k]
    for k in ("temperature", "top_p", "seed", "max_tokens", "logit_bias"):
        assert out[k] == body[k]
    assert count_chat(out["messages"]) == count_chat(body["messages"])


def test_the_names_the_api_defines_stay_and_the_clients_do_not() -> None:
    """A body of OpenAI's and vLLM's parameters keeps every name under ``hash`` (so a replay
    sends the same parameters); a name of the client's own becomes filler, keeping the
    value's numbers, or goes with its value under ``drop``."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "name": "ann"}],
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 1, "n": 2,
        "max_completion_tokens": 64, "presence_penalty": 0.1, "repetition_penalty": 1.1,
        "ignore_eos": True, "min_tokens": 8, "priority": 3, "logprobs": True,
        "top_logprobs": 2, "parallel_tool_calls": False, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": False},
        "chat_template_kwargs": {"enable_thinking": False, "thinking": True,
                                 "reasoning_effort": "low", "my_secret_flag": 7},
        "hunter2": 5,
    }  # fmt: skip
    out = redact(body, "hash", KEY)
    *kept, hashed = out
    assert kept == list(body)[:-1] and hashed != "hunter2"
    assert len(hashed) == len("hunter2") and out[hashed] == 5
    kwargs = out["chat_template_kwargs"]
    assert list(kwargs)[:3] == ["enable_thinking", "thinking", "reasoning_effort"]
    assert "my_secret_flag" not in kwargs and 7 in kwargs.values()
    assert out["messages"][0]["role"] == "user" and set(out["messages"][0]) == {
        "role", "content", "name",
    }  # fmt: skip
    assert {k: out[k] for k in ("temperature", "top_k", "ignore_eos")} == {
        "temperature": 0.7, "top_k": 20, "ignore_eos": True,
    }  # fmt: skip
    dropped = redact(body, "drop", KEY)
    assert "hunter2" not in dropped and set(dropped) == set(body) - {"hunter2", "messages"}
    assert dropped["chat_template_kwargs"] == {
        "enable_thinking": False, "thinking": True, "reasoning_effort": "low",
    }  # fmt: skip


def test_drop_keeps_only_structure_and_stays_replayable() -> None:
    out = redact(_structured(), "drop", KEY)
    assert set(out) == {
        "model",
        "tools",
        "tool_choice",
        "response_format",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "seed",
        "max_tokens",
        "logit_bias",
    }  # messages go whole; stop and metadata held only the client's strings
    # a required name is left empty, not absent (a tool without one is refused by engines)
    assert out["tools"] == [
        {"type": "function", "function": {"name": "", "parameters": {"type": "object"}}}
    ]
    assert out["stream_options"] == {"include_usage": True} and out["tool_choice"] == "auto"


def test_token_id_prompts_are_replaced_under_hash() -> None:
    body = {"model": "m", "prompt": [15496, 11, 995, 0]}
    out = redact(body, "hash", KEY)
    assert len(out["prompt"]) == 4 and out["prompt"] != body["prompt"]
    assert all(1000 <= i < 30000 for i in out["prompt"])
    assert redact(body, "hash", KEY) == out
    assert "prompt" not in redact(body, "drop", KEY)


def test_the_filler_is_keyed() -> None:
    text = "my password is hunter2"
    filler = hash_text(text, KEY)
    assert filler == hash_text(text, KEY) and len(filler) == len(text)
    assert hash_text(text, bytes(32)) != filler  # another key, another filler
    # Guessing offline: with the algorithm but not the key, the right guess does not match,
    # nor does the old unkeyed filler (a hash of the text alone).
    guesses = ["my password is hunter1", text, "my password is letmein"]
    assert filler not in {hash_text(g, b"") for g in guesses}
    assert filler not in {_unkeyed(g) for g in guesses}


def _unkeyed(text: str) -> str:
    """The filler before keys: blake2b of the text alone picks each word character."""
    digest = hashlib.blake2b(text.encode(), digest_size=64).digest()
    alphabet = "abcdefghijklmnopqrstuvwxyz"
    return re.sub(
        r"\w",
        lambda m: alphabet[digest[m.start() % 64] % 26],
        text,
    )


def test_non_word_characters_do_not_keep_their_shape() -> None:
    ssn = "123-45-6789"
    fillers = [hash_text(ssn, bytes([i]) * 32) for i in range(40)]
    for f in fillers:
        assert len(f) == len(ssn) and count_text(f) == count_text(ssn)
        assert f.isascii() and not any(c.isdigit() for c in (f[3], f[6]))
    # which symbol stands at a dash's place is the key's choice, not the text's
    assert len({f[3] for f in fillers}) > 10 and len({f[6] for f in fillers}) > 10
    assert sum(f[3] == "-" for f in fillers) < 8
    devanagari = "नमस्ते दुनिया"  # letters, and vowel signs and a virama (not word characters)
    hashed = hash_text(devanagari, KEY)
    assert hashed[6] == " " and all(c.isascii() for c in hashed)
    assert count_text(hashed) == count_text(devanagari)


_ANY_TEXT = st.text(st.characters(exclude_categories=()))


@given(_ANY_TEXT)
def test_filler_keeps_length_whitespace_and_token_count(text: str) -> None:
    filler = hash_text(text, KEY)
    assert len(filler) == len(text)
    assert count_text(filler) == count_text(text)
    assert [c for c in filler if c.isspace()] == [c for c in text if c.isspace()]
    assert all(c.isascii() for c in filler if not c.isspace())
    filler.encode("utf-8")  # even a lone surrogate becomes writable filler


@settings(deadline=None, max_examples=60)
@given(st.text(st.characters(max_codepoint=127)), st.integers(0, 3))
def test_ascii_text_gets_the_filler_of_the_per_run_rule(text: str, slices: int) -> None:
    """The masks over whole slices and the call per run make the same filler, across the
    slices' edges too (``slices`` of 64 KiB put in front)."""
    text = "ab, c\t" * (slices * 65536 // 6) + text
    stream = hashlib.shake_256(text.encode()).digest(len(text))
    assert _ascii_filler(text.encode("ascii"), stream) == _run_filler(text, stream)


@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "user", "assistant", "tool"]),
                "content": st.one_of(
                    _ANY_TEXT,
                    st.lists(
                        st.fixed_dictionaries(
                            {
                                "type": st.sampled_from(["text", "image_url"]),
                                "text": _ANY_TEXT,
                            }
                        ),
                        max_size=3,
                    ),
                ),
            }
        ),
        max_size=4,
    ),
    _ANY_TEXT,
)
def test_hash_keeps_prompt_token_counts(messages: list[dict[str, Any]], prompt: str) -> None:
    chat = redact({"model": "m", "messages": messages}, "hash", KEY)
    assert count_chat(chat["messages"]) == count_chat(messages)
    completion = redact({"model": "m", "prompt": prompt}, "hash", KEY)
    assert count_text(completion["prompt"]) == count_text(prompt)


def test_identical_texts_stay_identical_under_one_key() -> None:
    system = {"role": "system", "content": "You are a helpful assistant. Be brief."}
    a = redact({"model": "m", "messages": [system, {"role": "user", "content": "a"}]}, "hash", KEY)
    b = redact({"model": "m", "messages": [system, {"role": "user", "content": "b"}]}, "hash", KEY)
    assert a["messages"][0] == b["messages"][0] != system


def test_a_body_too_deep_to_write_is_refused() -> None:
    nested: Any = "x"
    for _ in range(300):
        nested = [nested]
    for mode in MODES:
        with pytest.raises(ValueError, match="nested deeper"):
            redact({"model": "m", "metadata": nested}, mode, KEY)


@pytest.mark.parametrize("mode", ["hash", "drop"])
def test_an_engines_error_message_quoting_the_prompt_is_redacted(mode: Redaction) -> None:
    """pydantic-style engine errors quote the input (``input_value='my password is …'``)."""
    error = {
        "message": "1 validation error: input_value='my password is hunter2'",
        "type": "BadRequestError",
        "code": 400,
        "param": "messages[0].content: my password is hunter2",
    }
    out = redact_error(error, mode, KEY)
    assert "hunter2" not in orjson.dumps(out).decode()
    assert out["type"] == "BadRequestError" and out["code"] == 400
    assert ("message" in out) is (mode == "hash")
    assert redact_error(error, "none", KEY) == error


def test_a_responses_body_keeps_its_item_structure_and_prompt_size() -> None:
    message = {"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "my leak-secret plan"}]}  # fmt: skip
    body = {"model": "m", "instructions": "leak-system prompt.", "input": [message]}
    hashed = redact(body, "hash", KEY)
    assert b"leak" not in orjson.dumps(hashed)
    item = hashed["input"][0]
    assert (item["type"], item["role"], item["content"][0]["type"]) == (
        "message",
        "user",
        "input_text",
    )
    size = count_chat(response_messages([message], body["instructions"]))
    assert count_chat(response_messages(hashed["input"], hashed["instructions"])) == size
    assert redact(body, "drop", KEY) == {"model": "m"}
    assert prompt_size(body) == size  # what a dropped line keeps for replay to synthesize
