"""The Batch API tests' client side: input files, submitting, waiting, reading results."""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

import openai
from openai.types import Batch

from tests.router.harness import get

MODEL = "deepseek-v4.1-flash"


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
