"""Model retrieval, /tokenize and /detokenize through the router, in front of two real
emulators serving different models, driven by the official openai client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, post, start_router, write_config
from turnout.common.tokens import count_chat, count_text

BIG = "deepseek-v4.1-flash"
SMALL = "small-model"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_client.py"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with (
        start_emulator("vllm", time_scale=50) as big,
        start_emulator("deepinfer", time_scale=50, args=("--model", SMALL)) as small,
    ):
        doc = base_config(
            [("big", "vllm", big.url), ("small", "deepinfer", small.url)],
            aliases={"org/fast": {"big": BIG}},
        )
        doc["backends"][0]["models"] = [BIG]
        doc["backends"][1]["models"] = [SMALL]
        path = write_config(tmp_path_factory.mktemp("router"), doc)
        with start_router(path) as proc:
            yield proc.url


def test_models_retrieve_answers_from_the_backends_lists(router: str) -> None:
    client = client_for(router)
    assert {m.id for m in client.models.list()} == {BIG, SMALL, "org/fast"}
    model = client.models.retrieve(SMALL)
    assert model.id == SMALL and model.object == "model"
    assert client.models.retrieve("org/fast").id == "org/fast"  # an id holding a slash


def test_models_retrieve_unknown_is_a_404_in_openai_shape(router: str) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client_for(router).models.retrieve("no-such-model")
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "model_not_found" and "no-such-model" in body["message"]


def test_tokenize_goes_to_a_backend_serving_the_model(router: str) -> None:
    for model, backend in ((SMALL, "small"), (BIG, "big"), ("org/fast", "big")):
        reply = post(router + "/tokenize", {"model": model, "prompt": "Hello, world!"})
        assert reply.status == 200, reply.text
        assert reply.headers["x-turnout-backend"] == backend
        assert reply.json()["count"] == count_text("Hello, world!") == len(reply.json()["tokens"])
    messages = [{"role": "user", "content": "Name three rivers."}]
    reply = post(router + "/tokenize", {"model": SMALL, "messages": messages})
    assert reply.json()["count"] == count_chat(messages)


def test_detokenize_round_trips_generated_text(router: str) -> None:
    client = client_for(router)
    text = client.completions.create(model=SMALL, prompt="go", max_tokens=20).choices[0].text
    ids = post(router + "/tokenize", {"model": SMALL, "prompt": text}).json()["tokens"]
    reply = post(router + "/detokenize", {"model": SMALL, "tokens": ids})
    assert reply.status == 200 and reply.json() == {"prompt": text}


def test_tokenize_without_a_model_goes_to_any_backend(router: str) -> None:
    reply = post(router + "/tokenize", {"prompt": "one two"})
    assert reply.status == 200 and reply.json()["count"] == 2


@pytest.mark.parametrize(
    ("path", "body", "status", "code"),
    [
        ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model_not_found"),
        ("/tokenize", b"not json", 400, None),
        ("/tokenize", b"[1, 2]", 400, None),
        ("/tokenize", {"model": 5, "prompt": "x"}, 400, "invalid_type"),
        ("/detokenize", {"model": SMALL, "tokens": [-3]}, 400, None),
    ],
)
def test_bad_tokenizer_requests_get_openai_errors(
    router: str, path: str, body: bytes | dict[str, object], status: int, code: str | None
) -> None:
    reply = post(router + path, body)
    assert reply.status == status, reply.text
    err = reply.json()["error"]
    assert err["message"] and err["type"]
    if code is not None:
        assert err["code"] == code


def test_n_above_one_where_the_backend_cannot_serve_it_is_a_clear_400(router: str) -> None:
    # The emulator, like an engine built without it, refuses n > 1: the client gets its 400.
    with pytest.raises(openai.BadRequestError) as info:
        client_for(router).chat.completions.create(
            model=SMALL, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "n" and "`n` > 1" in body["message"]


def test_the_openai_client_example_runs_against_the_router(router: str) -> None:
    argv = [sys.executable, str(EXAMPLE), "--base-url", router + "/v1", "--requests", "3"]
    argv += ["--model", SMALL, "--policy", "round-robin"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"model {SMALL} at {router}/v1"
    kinds = [line.split()[0] for line in lines[1:]]
    assert kinds == ["interactive", "interactive", "batch", "headers", "responses"]
    assert all("backend=small" in line for line in lines[1:])
