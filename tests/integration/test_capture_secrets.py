"""Capture keeps secrets, end to end: a real router (two workers) under ``redaction: hash``."""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import orjson

from tests.integration.test_router_capture import MODEL, read_records
from tests.procs import run_replay, start_emulator
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
                leaky = {"x-api-key": "hunter2", "api-key": "hunter2", "X-Session-Token": "hunter2"}
                client = client_for(router.url, **{"X-Request-Id": f"sec-{i}", **leaky})
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
                    # names of the client's own (issue 26), beside ones a template reads
                    extra_body={
                        "hunter2_field": 1,
                        "chat_template_kwargs": {"hunter2_flag": True, "enable_thinking": False},
                    },
                )
            records = read_records(capture, 8)
            assert b"hunter2" not in capture.read_bytes()
            # still a capture to replay: every request goes through again
            out = tmp_path / "report.json"
            p = run_replay(str(capture), "--target", router.url, "--out", str(out))
            assert p.returncode == 0, p.stderr
            overall = orjson.loads(out.read_bytes())["runs"][0]["overall"]
            assert (overall["completed"], overall["failed"]) == (8, 0)
    assert {r.custom_id for r in records} == {f"sec-{i}" for i in range(8)}
    # one configured key: the same text has the same filler whichever worker wrote it
    assert len({str(r.body["messages"]) for r in records}) == 1
    assert len({str(r.body["metadata"]) for r in records}) == 1
    tool = records[0].body["tools"][0]
    assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object"
    assert records[0].body["chat_template_kwargs"]["enable_thinking"] is False


def test_a_config_that_would_capture_a_credential_header_does_not_start(tmp_path: Path) -> None:
    """``capture.headers`` naming a key or a token: check-config and serve both
    refuse it, naming the entry, and the router never listens."""
    doc = base_config([("vllm", "vllm", "http://127.0.0.1:9")])
    listed = ["x-request-id", "x-api-key", "api-key", "x-session-token", "Authorization"]
    doc["capture"] = {"path": str(tmp_path / "capture.jsonl"), "headers": listed}
    path = write_config(tmp_path, doc)
    for command in (["check-config", str(path)], ["serve", "--config", str(path), "--port", "0"]):
        res = subprocess.run([sys.executable, "-m", "turnout", *command],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert res.returncode == 2, (command, res.stderr)
        for i, name in enumerate(listed[1:], 1):
            assert f"capture.headers[{i}]: {name!r} may carry a credential" in res.stderr
        assert "listening" not in res.stdout
    assert not (tmp_path / "capture.jsonl").exists()
