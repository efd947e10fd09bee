"""With API keys required, files and batches belong to the key that created them: another key
gets 404 for them and sees none of them listed; a batch's lines run under its creator's key
(its allowed models apply), and without a key the Batch API answers 401."""

from __future__ import annotations

import io
from collections.abc import Iterator

import openai
import pytest

from tests.batchkit import chat_line, jsonl, lines_of, wait
from tests.procs import Process, start_emulator
from tests.router.harness import base_config, start_router, write_config


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    work = tmp_path_factory.mktemp("batch-keys")
    mp = pytest.MonkeyPatch()
    mp.setenv("SY_BATCH_KEY_A", "k-alice")
    mp.setenv("SY_BATCH_KEY_B", "k-bob")
    try:
        with start_emulator("deepinfer", time_scale=50) as engine:
            doc = base_config([("deepinfer", "deepinfer", engine.url)])
            doc["api_keys"] = [
                {"name": "alice", "env": "SY_BATCH_KEY_A"},
                {"name": "bob", "env": "SY_BATCH_KEY_B", "models": ["some-other-model"]},
            ]
            doc["require_api_key"] = True
            doc["batch"] = {"data_dir": str(work / "data")}
            with start_router(write_config(work, doc)) as proc:
                yield proc
    finally:
        mp.undo()


def client(router: Process, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0)


def submit(c: openai.OpenAI, name: str) -> str:
    data = jsonl([chat_line(f"{name}-1"), chat_line(f"{name}-2")])
    f = c.files.create(file=(f"{name}.jsonl", io.BytesIO(data)), purpose="batch")
    return c.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def test_owners_see_only_their_own(router: Process) -> None:
    alice, bob = client(router, "k-alice"), client(router, "k-bob")
    batch_id = submit(alice, "alice")
    done = wait(alice, batch_id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 2
    for call in (
        lambda: bob.batches.retrieve(batch_id),
        lambda: bob.batches.cancel(batch_id),
        lambda: bob.files.retrieve(done.input_file_id),
        lambda: bob.files.content(str(done.output_file_id)),
        lambda: bob.files.delete(done.input_file_id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch_id not in [b.id for b in bob.batches.list()]
    assert done.input_file_id not in [f.id for f in bob.files.list()]
    with pytest.raises(openai.AuthenticationError):
        client(router, "k-mallory").files.list()


def test_lines_run_under_the_creators_key(router: Process) -> None:
    bob = client(router, "k-bob")  # bob may not use the model his lines name
    done = wait(bob, submit(bob, "bob"))
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (0, 2)
    errors = lines_of(bob, done.error_file_id)
    assert {e["response"]["status_code"] for e in errors} == {403}
