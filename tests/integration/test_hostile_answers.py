"""Response heads a hostile backend (tests/misbehaving.py) gets wrong, through a real router
process (issue 26): an encoding the router did not ask for, a redirect naming an internal
host, an interim answer with content, a protocol switch, a status outside HTTP. None of it
reaches the client: it gets a 502 in OpenAI's error JSON, or, with another backend to fail
over to, that backend's answer; the backend's protocol error is counted by kind, and no
metric ever carries the status it sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.misbehaving import INTERIM_BODY, INTERNAL_HOST, SECRET
from tests.procs import Process, start_emulator, start_misbehaving
from tests.router.harness import (
    Reply,
    base_config,
    client_for,
    get,
    post,
    start_router,
    write_config,
)

EMULATED = "deepseek-v4.1-flash"
KINDS = {
    "gzip-answer": "bad_encoding",
    "gzip-label": "bad_encoding",
    "redirect": "redirect",
    "interim-body": "bad_interim",
    "switching-protocols": "bad_interim",
    "status-999": "bad_status",
}
LEAKS = (SECRET, INTERNAL_HOST, INTERIM_BODY.decode(), "gzip")


@pytest.fixture(scope="module")
def backend() -> Iterator[Process]:
    with start_misbehaving() as proc:
        yield proc


@pytest.fixture(scope="module")
def router(backend: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    doc = base_config([("bad", "vllm", backend.url)])
    doc["health"]["failures_to_eject"] = 1000  # these tests look at answers, not ejection
    with start_router(write_config(tmp_path_factory.mktemp("answers"), doc)) as proc:
        yield proc


@pytest.fixture(scope="module")
def good() -> Iterator[Process]:
    with start_emulator("vllm", time_scale=50) as emu:
        yield emu


def spare_config(backend: Process, good: Process, **health: Any) -> dict[str, Any]:
    """``bad`` first, then an emulator that serves every mode's name as its own model."""
    doc = base_config([("bad", "vllm", backend.url), ("good", "vllm", good.url)])
    doc["aliases"] = {mode: {"bad": mode, "good": EMULATED} for mode in [*KINDS, "ok"]}
    doc["health"] = {**doc["health"], "failures_to_eject": 1000, **health}
    return doc


@pytest.fixture(scope="module")
def spared(
    backend: Process, good: Process, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Process]:
    doc = spare_config(backend, good)
    with start_router(write_config(tmp_path_factory.mktemp("spared"), doc)) as proc:
        yield proc


def chat(router: Process, model: str, stream: bool) -> Reply:
    doc = {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    return post(router.url + "/v1/chat/completions", doc, {"Accept-Encoding": "gzip"})


def counted(router: Process, name: str, backend: str, kind: str) -> float:
    text = get(router.url + "/metrics").text
    found = re.search(rf'{name}\{{backend="{backend}",kind="{kind}"\}} (\S+)', text)
    return float(found[1]) if found else 0.0


def failovers(router: Process) -> float:
    text = get(router.url + "/metrics").text
    found = re.search(r'turnout_failovers_total\{backend="bad",policy="class-split"\} (\S+)', text)
    return float(found[1]) if found else 0.0


PROTOCOL = "turnout_upstream_protocol_errors_total"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", list(KINDS))
def test_a_broken_head_gets_the_client_a_clean_502(
    router: Process, mode: str, stream: bool
) -> None:
    before = counted(router, PROTOCOL, "bad", KINDS[mode])
    reply = chat(router, mode, stream)
    assert reply.status == 502, reply.content
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["error"]["code"] == "upstream_protocol_error"
    assert "content-encoding" not in reply.headers and "location" not in reply.headers
    for leak in LEAKS:
        assert leak not in reply.text and leak not in str(reply.headers)
    assert counted(router, PROTOCOL, "bad", KINDS[mode]) == before + 1
    metrics = get(router.url + "/metrics").text
    assert 'code="999"' not in metrics and 'code="307"' not in metrics
    served = r'turnout_requests_total\{backend="bad",[^}]*code="502"[^}]*reason="upstream_broken"'
    assert re.search(served, metrics)


@pytest.mark.parametrize("stream", [False, True])
def test_interim_early_hints_are_skipped(router: Process, stream: bool) -> None:
    client = client_for(router.url)
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        parts = client.chat.completions.create(model="early-hints", messages=messages, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    else:
        answer = client.chat.completions.create(model="early-hints", messages=messages)
        text = answer.choices[0].message.content or ""
    assert text == "hi there"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", list(KINDS))
def test_a_broken_head_fails_over_to_the_next_backend(
    spared: Process, mode: str, stream: bool
) -> None:
    before = counted(spared, PROTOCOL, "bad", KINDS[mode]), failovers(spared)
    reply = chat(spared, mode, stream)
    assert reply.status == 200 and reply.headers["x-turnout-backend"] == "good", reply.content
    assert "content-encoding" not in reply.headers and "location" not in reply.headers
    assert INTERIM_BODY not in reply.content
    after = counted(spared, PROTOCOL, "bad", KINDS[mode]), failovers(spared)
    assert after == (before[0] + 1, before[1] + 1)


def test_a_broken_head_counts_against_the_backend_at_once(
    backend: Process, good: Process, tmp_path: Path
) -> None:
    doc = spare_config(backend, good, failures_to_eject=1, cooldown=60)
    with start_router(write_config(tmp_path, doc)) as router:
        assert chat(router, "status-999", False).status == 200
        states = {b["name"]: b["breaker"] for b in get(router.url + "/turnout/backends").json()}
    assert states == {"bad": "open", "good": "closed"}
