"""The Batch API tests' client side: input files, submitting, waiting, reading results."""

from __future__ import annotations

import hashlib
import io
import json
import re
import time
from typing import Any

import openai
from openai.types import Batch

from tests.router.harness import get

MODEL = "deepseek-v4.1-flash"
KEY = "k-batch-tests"
"""The API key the Batch API tests call with (a key the router does not know gets 401)."""
AUTH = {"Authorization": f"Bearer {KEY}"}


def keyed(doc: dict[str, Any], *keys: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with :data:`KEY` configured (by its digest: the config holds no secret), and
    ``keys`` beside it."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    doc["api_keys"] = [{"name": "tests", "sha256": digest}, *keys]
    return doc


def paced(doc: dict[str, Any], ttft_slo: float) -> dict[str, Any]:
    """``doc`` (backends vllm and deepinfer) under round-robin, with an adaptive policy whose
    interactive TTFT SLO of ``ttft_slo`` s paces the batches (router.batch.pacing)."""
    doc["policies"]["adaptive"] = {
        "type": "adaptive",
        "params": {
            "low_ttft": ["vllm"],
            "high_throughput": ["deepinfer"],
            "slo": {"interactive": {"ttft_s": ttft_slo, "tpot_s": 600.0}},
        },
    }
    doc["default_policy"] = "round-robin"
    return doc


def batch_client(url: str, key: str = KEY, **options: Any) -> openai.OpenAI:
    """The official client on ``url`` with ``key``, without retries."""
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, **options)


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def chat_line(custom_id: str, max_tokens: int = 4, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"say {custom_id}"}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **body},
    }


def submit(
    client: openai.OpenAI, rows: list[dict[str, Any]], endpoint: str = "/v1/chat/completions",
    window: str = "24h",
) -> Batch:  # fmt: skip
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    return client.batches.create(
        input_file_id=f.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window=window,  # type: ignore[arg-type]
        metadata={"job": "test"},
    )


def wait(client: openai.OpenAI, batch_id: str, timeout: float = 60.0) -> Batch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {b.status} after {timeout} s")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def served(url: str) -> int:
    """Requests an emulator finished (its E2E histogram's count)."""
    text = get(url + "/metrics").text
    pattern = r"^vllm:e2e_request_latency_seconds_count\S* (\S+)$"
    return sum(int(float(m)) for m in re.findall(pattern, text, re.M))


def answered_once(
    client: openai.OpenAI, batch_id: str, rows: list[dict[str, Any]], engines: list[str],
    in_flight: int,
) -> None:  # fmt: skip
    """The batch completes with every line answered exactly once, and the ``engines`` served
    each line once, plus at most the ``in_flight`` lines a killed router had running (the
    engine may have finished those after the router was gone; none already answered)."""
    done = wait(client, batch_id, timeout=90)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(rows), 0)
    ids = [x["custom_id"] for x in lines_of(client, done.output_file_id)]
    assert sorted(ids) == sorted(r["custom_id"] for r in rows)
    total = sum(served(url) for url in engines)
    assert len(rows) <= total <= len(rows) + in_flight, total
