"""Tracing configured the way operators configure it: a real router process whose environment
names OpenTelemetry's console exporter, in front of a real emulator. Its stdout must then
carry the request's spans, one trace continuing the client's, and nothing of the prompt."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config

MODEL = "deepseek-v4.1-flash"
PROMPT = "orange heron counts the ledger"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"


def spans_in(lines: list[str]) -> list[dict[str, Any]]:
    """The console exporter's spans: indented JSON objects one after another."""
    text, decoder, at, out = "\n".join(lines), json.JSONDecoder(), 0, []
    while (start := text.find("{", at)) >= 0:
        span, at = decoder.raw_decode(text, start)
        out.append(span)
    return out


def test_the_environment_turns_tracing_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "router-under-test")
    stdout: list[str] = []
    with start_emulator("vllm", time_scale=50) as emu:
        doc = base_config([("vllm", "vllm", emu.url)], access_log={"enabled": False})
        with start_router(write_config(tmp_path, doc), lines=stdout) as router:
            client = client_for(router.url, traceparent=f"00-{CLIENT_TRACE}-b7ad6b7169203331-01")
            stream = client.chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            deadline = time.monotonic() + 10
            while len(spans_in(stdout)) < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
    spans = spans_in(stdout)
    assert sorted(s["name"] for s in spans) == sorted(
        [f"chat {MODEL}", f"chat {MODEL}", "turnout.classify", "turnout.pick"]
    )
    assert {s["context"]["trace_id"] for s in spans} == {f"0x{CLIENT_TRACE}"}
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"router-under-test"}
    (root,) = [s for s in spans if s["kind"] == "SpanKind.SERVER"]
    assert root["attributes"]["turnout.reason"] == "ok"
    assert root["attributes"]["gen_ai.usage.output_tokens"] == 4
    assert PROMPT not in "\n".join(stdout)
