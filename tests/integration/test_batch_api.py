"""The Batch API end to end: the official client against a router in front of two emulators.

Files are uploaded, batches created, run by the router itself on the batch pool, and their
output and error files read back; bad input fails the batch with its errors; a cancelled and
an expired batch end in their states with the lines they got to.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.batchkit import (
    AUTH,
    MODEL,
    batch_client,
    chat_line,
    jsonl,
    keyed,
    lines_of,
    submit,
    wait,
)
from tests.procs import Process, metric, run_replay, start_emulator
from tests.router.harness import base_config, get, post, request, start_router, write_config


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("batch-capture") / "capture.jsonl"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, capture: Path) -> Iterator[Process]:
    work = tmp_path_factory.mktemp("batch")
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["batch"] = {"data_dir": str(work / "data"), "max_concurrency": 8}
        keyed(doc)
        doc["capture"] = {"path": str(capture)}
        with start_router(write_config(work, doc)) as proc:
            yield proc


@pytest.fixture
def client(router: Process) -> openai.OpenAI:
    return batch_client(router.url, timeout=30)


def test_files_round_trip(client: openai.OpenAI) -> None:
    data = jsonl([chat_line("a")])
    f = client.files.create(file=("mine.jsonl", io.BytesIO(data)), purpose="batch")
    assert (f.object, f.purpose, f.bytes, f.filename) == ("file", "batch", len(data), "mine.jsonl")
    assert client.files.retrieve(f.id).id == f.id
    assert f.id in [x.id for x in client.files.list(purpose="batch")]
    assert client.files.content(f.id).content == data
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


def test_upload_needs_the_batch_purpose(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    assert exc.value.param == "purpose"


def test_a_batch_runs_on_the_batch_pool(
    client: openai.OpenAI, router: Process, capture: Path
) -> None:
    ids = [f"line-{i}" for i in range(30)]
    completed = metric(
        router.url, "turnout_batch_lines_total", {"outcome": "completed"}, required=True
    )
    tokens = metric(router.url, "turnout_batch_tokens_total", {"kind": "completion"}, required=True)
    batch = submit(client, [chat_line(i) for i in ids])
    assert batch.status == "in_progress" and batch.request_counts is not None
    assert batch.request_counts.total == 30
    done = wait(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == 30
    assert done.metadata == {"job": "test"}
    assert done.completed_at is not None and done.finalizing_at is not None
    out = lines_of(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(ids)
    for x in out:
        assert x["id"].startswith("batch_req_") and x["error"] is None
        assert x["response"]["status_code"] == 200
        assert x["response"]["request_id"] == x["custom_id"]
        assert x["response"]["body"]["usage"]["completion_tokens"] >= 1
    assert done.error_file_id is None
    assert client.batches.list().data[0].id == batch.id
    # Every line went through the request path: captured, as batch class, on the batch pool.
    time.sleep(1.0)  # the capture sink writes asynchronously
    captured = [json.loads(x) for x in capture.read_text().splitlines()]
    mine = [c for c in captured if c["headers"].get("x-request-id") in ids]
    assert sorted(c["custom_id"] for c in mine) == sorted(ids)
    assert {(c["route"]["class"], c["route"]["backend"]) for c in mine} == {("batch", "deepinfer")}
    # ...so replay replays the batch job from the capture.
    job = capture.parent / f"{batch.id}.jsonl"
    job.write_text("".join(json.dumps(c) + "\n" for c in mine))
    report = capture.parent / f"{batch.id}-replay.json"
    replayed = run_replay(str(job), "--target", router.url, "--out", str(report))
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(report.read_text())["runs"][0]["overall"]["completed"] == 30
    after = metric(router.url, "turnout_batch_lines_total", {"outcome": "completed"}, required=True)
    assert after == completed + 30
    assert (
        metric(router.url, "turnout_batch_tokens_total", {"kind": "completion"}, required=True)
        >= tokens + 30
    )


def _batch_series(router: Process) -> list[str]:
    text = get(router.url + "/metrics").text
    return re.findall(r"^(turnout_batch_\w+(?:\{[^}]*\})?) ", text, re.M)


def test_batches_that_come_and_go_leave_no_series_behind(
    client: openai.OpenAI, router: Process
) -> None:
    """Issue 26: one series set per batch, never removed (11,623 series after 1,650 batches).
    Now no series names a batch: a dozen more batches add none."""
    wait(client, submit(client, [chat_line("warm")]).id)
    before = _batch_series(router)
    for i in range(12):
        done = wait(client, submit(client, [chat_line(f"come-and-go-{i}")]).id)
        assert done.status == "completed"
    assert _batch_series(router) == before
    assert before and not [s for s in before if 'batch="' in s]


def test_embeddings_and_completions_batches(client: openai.OpenAI) -> None:
    emb = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": MODEL, "input": f"text {i}"}}
        for i in range(3)
    ]  # fmt: skip
    comp = [
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL, "prompt": f"count {i}", "max_tokens": 3}}
        for i in range(3)
    ]  # fmt: skip
    for rows, endpoint, key in (
        (emb, "/v1/embeddings", "data"),
        (comp, "/v1/completions", "choices"),
    ):
        done = wait(client, submit(client, rows, endpoint).id)
        assert done.status == "completed", done
        out = lines_of(client, done.output_file_id)
        assert len(out) == 3 and all(key in x["response"]["body"] for x in out)


def test_bad_input_fails_the_batch_with_every_error(client: openai.OpenAI) -> None:
    good = chat_line("ok")
    rows = jsonl([good, {**good, "method": "GET", "custom_id": "m"}])
    rows += b"{not json\n"
    rows += jsonl([{**good, "url": "/v1/embeddings", "custom_id": "u"}, good])
    f = client.files.create(file=("bad.jsonl", io.BytesIO(rows)), purpose="batch")
    b = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert b.status == "failed" and b.failed_at is not None and b.errors is not None
    found = [(e.code, e.line) for e in b.errors.data or []]
    assert found == [
        ("invalid_method", 2),
        ("invalid_json_line", 3),
        ("invalid_url", 4),
        ("duplicate_custom_id", 5),
    ]


def test_bad_requests_are_openai_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    f = client.files.create(file=("a.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id=f.id,
            endpoint="/v1/audio",  # type: ignore[arg-type]
            completion_window="24h",
        )
    assert exc.value.param == "endpoint"
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(
            input_file_id=f.id,
            endpoint="/v1/chat/completions",
            completion_window="forever",  # type: ignore[arg-type]
        )
    assert exc.value.param == "completion_window"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_a_line_the_engine_refuses_goes_to_the_error_file(client: openai.OpenAI) -> None:
    rows = [chat_line("fine"), {**chat_line("unknown"), "body": {"model": "no-such-model",
            "messages": [{"role": "user", "content": "x"}]}}]  # fmt: skip
    done = wait(client, submit(client, rows).id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    [out] = lines_of(client, done.output_file_id)
    [err] = lines_of(client, done.error_file_id)
    assert out["custom_id"] == "fine"
    assert err["custom_id"] == "unknown" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["code"] == "model_not_found"


def test_cancel(client: openai.OpenAI) -> None:
    rows = [chat_line(f"k{i}", max_tokens=400, ignore_eos=True) for i in range(60)]
    batch = submit(client, rows)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    done = wait(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert done.request_counts is not None and done.request_counts.completed < 60
    with pytest.raises(openai.APIStatusError) as exc:
        client.batches.cancel(batch.id + "x")
    assert exc.value.status_code == 404


def test_the_completion_window_is_honoured(client: openai.OpenAI) -> None:
    rows = [chat_line(f"x{i}", max_tokens=4000, ignore_eos=True) for i in range(64)]
    batch = submit(client, rows, window="2s")
    done = wait(client, batch.id)
    assert done.status == "expired" and done.expired_at is not None
    out = lines_of(client, done.output_file_id)
    err = lines_of(client, done.error_file_id)
    assert sorted(x["custom_id"] for x in out + err) == sorted(r["custom_id"] for r in rows)
    expired = [x for x in err if x["error"] and x["error"]["code"] == "batch_expired"]
    assert expired and all(x["response"] is None for x in expired)
    assert done.request_counts is not None
    assert done.request_counts.completed + done.request_counts.failed == 64


def test_hostile_requests_get_openai_errors(router: Process) -> None:
    files, batches = router.url + "/v1/files", router.url + "/v1/batches"
    form = "multipart/form-data; boundary=x"
    cases = [
        (post(files, {"purpose": "batch"}, AUTH), 415),  # JSON, not a form
        (post(files, b"--x\r\nnot a part", {**AUTH, "Content-Type": form}), 400),
        (post(files, *_form({"purpose": "batch"})), 400),  # no file
        (post(files, *_form({"purpose": "b" * 100, "file": "x"})), 413),
        (post(batches, b"{not json", AUTH), 400),
        (post(batches, b"[1, 2]", AUTH), 400),
        (request("GET", batches + "?limit=1000", headers=AUTH), 400),
        (request("GET", files + "?order=sideways", headers=AUTH), 400),
        (request("GET", files + "/file-nope/content", headers=AUTH), 404),
    ]
    for reply, status in cases:
        assert reply.status == status, (reply.status, reply.text)
        assert reply.json()["error"]["message"]


def _form(fields: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    body = b""
    for name, value in fields.items():
        extra = '; filename="f.jsonl"' if name == "file" else ""
        head = f'--B\r\nContent-Disposition: form-data; name="{name}"{extra}\r\n\r\n'
        body += f"{head}{value}\r\n".encode()
    return body + b"--B--\r\n", {**AUTH, "Content-Type": "multipart/form-data; boundary=B"}


def test_responses_lines_and_custom_ids_that_cannot_be_headers(client: openai.OpenAI) -> None:
    odd = ["two\nlines", "ünïcode", "x" * 300]
    rows = [
        {"custom_id": cid, "method": "POST", "url": "/v1/responses",
         "body": {"model": MODEL, "input": "hello", "max_output_tokens": 4}}
        for cid in odd
    ]  # fmt: skip
    done = wait(client, submit(client, rows, "/v1/responses").id)
    assert done.status == "completed", done
    out = lines_of(client, done.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(odd)
    for x in out:  # the request id is the batch's own where the custom_id cannot be a header
        assert x["response"]["request_id"].startswith(done.id + "-")
        assert x["response"]["body"]["usage"]["output_tokens"] >= 1
    usage = done.model_dump()["usage"]
    assert usage["output_tokens"] == sum(
        x["response"]["body"]["usage"]["output_tokens"] for x in out
    )
