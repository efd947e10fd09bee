"""Wire compatibility of the ``pd`` policy's two hops with vLLM's disaggregated protocol.

A scripted fake vLLM prefill engine and decode engine (tests/scripted_pd.py) keep the exact
bodies the router sends each hop; error answers of either hop reach the client as OpenAI
errors with the engine's status.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from router.proxy.pd import TO_DECODE
from tests.procs import Process, start_process
from tests.router.harness import base_config, client_for, get, start_router, write_config
from tests.scripted_pd import ERROR_MESSAGE, MODEL, PARAMS

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


@contextlib.contextmanager
def scripted(role: str, *args: str) -> Iterator[Process]:
    argv = [sys.executable, "-m", "tests.scripted_pd", "--role", role, *args]
    with start_process(argv, "scripted listening on") as proc:
        yield proc


@contextlib.contextmanager
def pair(
    tmp_path: Path, prefill: Sequence[str] = (), decode: Sequence[str] = ()
) -> Iterator[tuple[Process, Process, Process]]:
    with scripted("prefill", *prefill) as p, scripted("decode", *decode) as d:
        doc = base_config([("p0", "vllm", p.url), ("d0", "vllm", d.url)])
        doc["policies"]["split"] = {"type": "pd", "params": {"prefill": ["p0"], "decode": ["d0"]}}
        doc["default_policy"] = "split"
        with start_router(write_config(tmp_path, doc)) as router:
            yield router, p, d


def bodies(engine: Process) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = get(engine.url + "/bodies").json()
    return out


def test_both_hops_of_a_streamed_chat_carry_vllms_fields(tmp_path: Path) -> None:
    with pair(tmp_path) as (router, p, d):
        stream = client_for(router.url).chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=50,
            stream=True,
            stream_options={"include_usage": True},
            temperature=0.5,
            extra_body={"min_tokens": 3},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "hello there" and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 2
        (prefill,) = bodies(p)
        (decode,) = bodies(d)
    assert prefill == {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 1,
        "stream": False,
        "temperature": 0.5,
        "kv_transfer_params": TO_DECODE,
    }
    assert TO_DECODE == {"do_remote_decode": True, "do_remote_prefill": False,
                         "remote_engine_id": None, "remote_block_ids": None,
                         "remote_host": None, "remote_port": None}  # fmt: skip
    assert decode == {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
        "min_tokens": 3,
        "kv_transfer_params": PARAMS,
    }


def test_the_router_asks_the_decode_hop_for_usage_the_client_did_not(tmp_path: Path) -> None:
    with pair(tmp_path) as (router, p, d):
        client = client_for(router.url)
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_completion_tokens=9, stream=True,
        ))  # fmt: skip
        assert all(c.usage is None for c in chunks)  # asked for by the router, stripped
        whole = client.responses.create(model=MODEL, input="hi", max_output_tokens=30)
        assert whole.output_text == "hello there"
        first, second = bodies(p)
        decode_stream, decode_whole = bodies(d)
    assert first["max_tokens"] == 1 and first["max_completion_tokens"] == 1
    assert decode_stream["max_completion_tokens"] == 9 and "max_tokens" not in decode_stream
    assert "stream_options" not in first and first["stream"] is False
    assert decode_stream["stream_options"] == {"include_usage": True}
    assert decode_stream["kv_transfer_params"] == PARAMS
    assert second["max_output_tokens"] == 1 and second["kv_transfer_params"] == TO_DECODE
    assert decode_whole["max_output_tokens"] == 30 and decode_whole["kv_transfer_params"] == PARAMS


def test_a_clients_own_kv_transfer_params_never_reach_an_engine(tmp_path: Path) -> None:
    hostile = {"do_remote_prefill": True, "remote_host": "169.254.169.254", "remote_port": 80}
    with pair(tmp_path) as (router, p, d):
        client_for(router.url).chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            extra_body={"kv_transfer_params": hostile},
        )
        (prefill,) = bodies(p)
        (decode,) = bodies(d)
    assert prefill["kv_transfer_params"] == TO_DECODE and decode["kv_transfer_params"] == PARAMS


@pytest.mark.parametrize(
    ("hop", "status", "error"),
    [
        ("prefill", 400, openai.BadRequestError),
        ("prefill", 503, openai.APIStatusError),
        ("decode", 400, openai.BadRequestError),
        ("decode", 500, openai.InternalServerError),
    ],
)
def test_an_error_answer_of_either_hop_reaches_the_client(
    tmp_path: Path, hop: str, status: int, error: type[openai.APIStatusError]
) -> None:
    args = ["--status", str(status)]
    with pair(tmp_path, **{hop: args}) as (router, _, d):
        with pytest.raises(error) as exc:
            client_for(router.url).chat.completions.create(model=MODEL, messages=MESSAGES)
        sent = len(bodies(d))
    assert exc.value.status_code == status
    body = exc.value.body
    assert isinstance(body, dict) and ERROR_MESSAGE in str(body.get("message"))
    assert sent == (0 if hop == "prefill" else 1)  # a failed prefill never reaches decode
