"""Capture keeps secrets, end to end: a real router (two workers) under ``redaction: hash``."""

from __future__ import annotations

import secrets
from pathlib import Path

from tests.integration.test_router_capture import MODEL, read_records
from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config


def test_secrets_outside_the_prompt_do_not_reach_the_capture_file(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    key = tmp_path / "capture.key"
    key.write_text(secrets.token_hex(32) + "\n")
    with start_emulator("vllm", time_scale=50) as vllm:
        doc = base_config([("vllm", "vllm", vllm.url)])
        doc["capture"] = {"path": str(capture), "redaction": "hash", "hash_key_file": str(key)}
        with start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router:
            for i in range(8):  # a client (connection) each: both workers take some
                client = client_for(router.url, **{"X-Request-Id": f"sec-{i}"})
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "my password is hunter2"}],
                    max_tokens=3,
                    metadata={"note": "hunter2 in metadata"},
                    tools=[
                        {
                            "type": "function",
                            "function": {
                                "name": "lookup",
                                "description": "hunter2 in a tool description",
                                "parameters": {"type": "object", "properties": {}},
                            },
                        }
                    ],
                )
        records = read_records(capture, 8)
    assert b"hunter2" not in capture.read_bytes()
    assert {r.custom_id for r in records} == {f"sec-{i}" for i in range(8)}
    # one configured key: the same text has the same filler whichever worker wrote it
    assert len({str(r.body["messages"]) for r in records}) == 1
    assert len({str(r.body["metadata"]) for r in records}) == 1
    tool = records[0].body["tools"][0]
    assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
