"""Tracing through a real in-process router and fake engines, into the SDK's in-memory
exporter: the span tree, its GenAI attributes, and the traceparent each engine received.
Whether OpenTelemetry is imported at all without its environment is checked in a fresh
interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from policies.testing import make_request
from router.app import STATE
from router.observe.otel import OtelTracing
from router.observe.tracing import Ending
from tests.procs import ROOT
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.harness import base_config

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "a secret prompt"}]
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    out = InMemorySpanExporter()
    yield out
    out.shutdown()


def traced(ip: InProcess, exporter: InMemorySpanExporter) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    ip.app[STATE].tracing = OtelTracing(provider)


def config(names: list[str], **overrides: Any) -> dict[str, Any]:
    doc = base_config([(n, "vllm", "fake" if n == "fake" else f"fake:{n}") for n in names])
    doc["health"]["scrape_metrics"] = False
    doc["health"]["failures_to_eject"] = 100
    doc.update(overrides)
    return doc


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    out: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {})[key]


def traceparent(span: ReadableSpan) -> str:
    """The W3C header that names ``span`` as the parent."""
    ctx = span.context
    assert ctx is not None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


async def test_a_request_is_a_span_tree_continued_upstream(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with in_process_router(tmp_path, config(["fake"])) as ip:
        traced(ip, exporter)
        parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
        async with openai.AsyncOpenAI(
            base_url=ip.url + "/v1", api_key="x", max_retries=0
        ) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=CHAT, stream=True, max_tokens=8,
                extra_headers={"traceparent": parent, "tracestate": "vendor=1"},
            )  # fmt: skip
            assert [c async for c in stream]
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {f"chat {MODEL}", "turnout.classify", "turnout.pick"}
    root, attempt = sorted(spans[f"chat {MODEL}"], key=lambda s: s.kind != SpanKind.SERVER)
    assert root.kind == SpanKind.SERVER and attempt.kind == SpanKind.CLIENT
    assert root.context is not None and attempt.context is not None
    # The root continues the client's trace; every other span is the root's child.
    assert f"{root.context.trace_id:032x}" == CLIENT_TRACE
    assert root.parent is not None and f"{root.parent.span_id:016x}" == CLIENT_SPAN
    for child in (attempt, spans["turnout.classify"][0], spans["turnout.pick"][0]):
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context is not None and child.context.trace_id == root.context.trace_id
    # The engine saw the attempt's context, not the client's, and the client's tracestate.
    (seen,) = ip.engine.headers
    assert seen["traceparent"] == traceparent(attempt)
    assert seen["tracestate"] == "vendor=1"
    assert len(seen.getall("traceparent")) == 1
    assert (
        dict(root.attributes or {}).items()
        >= {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": MODEL,
            "gen_ai.request.max_tokens": 8,
            "gen_ai.usage.input_tokens": 7,
            "gen_ai.usage.output_tokens": 2,
            "gen_ai.response.finish_reasons": ("stop",),
            "http.request.method": "POST",
            "http.response.status_code": 200,
            "turnout.policy": "class-split",
            "turnout.class": "interactive",
            "turnout.backend": "fake",
            "turnout.attempts": 1,
            "turnout.reason": "ok",
        }.items()
    )
    port = int(ip.app[STATE].config.backends[0].url.rsplit(":", 1)[1])
    assert (
        dict(attempt.attributes or {}).items()
        >= {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": MODEL,
            "server.address": "127.0.0.1",
            "server.port": port,
            "turnout.backend": "fake",
            "http.response.status_code": 200,
            "gen_ai.usage.output_tokens": 2,
        }.items()
    )
    assert attr(spans["turnout.classify"][0], "turnout.class") == "interactive"
    assert attr(spans["turnout.pick"][0], "turnout.ranked") == ("fake",)
    assert root.status.status_code == attempt.status.status_code == StatusCode.UNSET
    # Ordered in time: classification, then the pick, then the attempt, all within the root.
    cls, pick = spans["turnout.classify"][0], spans["turnout.pick"][0]
    assert root.start_time is not None and root.end_time is not None
    assert root.start_time <= cls.start_time <= cls.end_time <= pick.start_time  # type: ignore[operator]
    assert pick.end_time <= attempt.start_time <= attempt.end_time <= root.end_time  # type: ignore[operator]
    text = repr([s.to_json() for s in exporter.get_finished_spans()])
    assert "secret prompt" not in text


async def test_each_failed_attempt_is_an_error_span_of_its_own(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    broken = FakeEngine(error_status=503)
    doc = config(["broken", "fake"])
    async with in_process_router(tmp_path, doc, others={"broken": broken}) as ip:
        traced(ip, exporter)
        async with openai.AsyncOpenAI(
            base_url=ip.url + "/v1", api_key="x", max_retries=0
        ) as client:
            await client.chat.completions.create(model=MODEL, messages=CHAT)
    spans = exporter.get_finished_spans()
    attempts = sorted(
        (s for s in spans if s.kind == SpanKind.CLIENT),
        key=lambda s: attr(s, "turnout.attempt"),
    )
    assert [attr(a, "turnout.backend") for a in attempts] == ["broken", "fake"]
    first, second = attempts
    assert first.status.status_code == StatusCode.ERROR
    assert attr(first, "error.type") == "503"
    assert second.status.status_code == StatusCode.UNSET
    # Each engine saw its own attempt's span as the parent.
    (seen_broken,), (seen_fake,) = broken.headers, ip.engine.headers
    for seen, span in ((seen_broken, first), (seen_fake, second)):
        assert seen["traceparent"] == traceparent(span)
    (root,) = [s for s in spans if s.kind == SpanKind.SERVER]
    assert attr(root, "turnout.attempts") == 2
    assert root.status.status_code == StatusCode.UNSET  # served after the failover


async def test_a_rejection_is_a_root_span_with_its_reason(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    async with in_process_router(tmp_path, config(["fake"])) as ip:
        traced(ip, exporter)
        async with openai.AsyncOpenAI(
            base_url=ip.url + "/v1", api_key="x", max_retries=0
        ) as client:
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="no-such-model", messages=CHAT)
    spans = by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat no-such-model", "turnout.classify"}
    (root,) = spans["chat no-such-model"]
    assert attr(root, "turnout.reason") == "unknown_model"
    assert attr(root, "http.response.status_code") == 404
    assert root.status.status_code == StatusCode.UNSET  # the client's error, not the service's
    assert not ip.engine.bodies


def test_span_times_share_one_clock_however_late_the_trace_begins(
    exporter: InMemorySpanExporter,
) -> None:
    """A request that arrived 50 ms before its trace began (the task was not scheduled, say):
    the pick still ends before the attempt it chose starts, and the root starts at arrival.
    The attempt's times once came from the SDK's wall clock, the others' from monotonic
    readings anchored when the trace began, and the two disagreed by those 50 ms."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    arrived = time.monotonic() - 0.05
    wall_arrived = time.time_ns() - 50_000_000
    trace = OtelTracing(provider).begin({}, "POST", "/v1/chat/completions", "r1", arrived)
    t = time.monotonic()
    trace.classified(make_request(), t, time.monotonic())
    t = time.monotonic()
    trace.picked("p", ["fake"], t, time.monotonic())
    trace.attempt("fake", "http://127.0.0.1:9/v1/chat/completions", {})
    trace.attempt_failed(503, "busy", timeout=False)
    trace.attempt("fake", "http://127.0.0.1:9/v1/chat/completions", {})
    ending = Ending(time.monotonic(), 200, "ok", False, "p", "interactive", "fake", 2, None,
                    None, None, None, None)  # fmt: skip
    trace.finish(ending)
    spans = by_name(exporter.get_finished_spans())
    (root,) = [s for s in spans["chat m"] if s.kind == SpanKind.SERVER]
    first, second = sorted(
        (s for s in spans["chat m"] if s.kind == SpanKind.CLIENT),
        key=lambda s: attr(s, "turnout.attempt"),
    )
    (cls,), (pick,) = spans["turnout.classify"], spans["turnout.pick"]
    stamps = [root.start_time, cls.start_time, cls.end_time, pick.start_time, pick.end_time,
             first.start_time, first.end_time, second.start_time, second.end_time,
             root.end_time]  # fmt: skip
    times = [t for t in stamps if t is not None]
    assert len(times) == len(stamps) and times == sorted(times), stamps
    assert root.start_time is not None
    assert abs(root.start_time - wall_arrived) < 10_000_000  # within 10 ms of the arrival


def tracing_in_fresh_interpreter(env: dict[str, str]) -> str:
    code = (
        "import sys; from router.observe.tracing import tracing_from_env; "
        "t = tracing_from_env(); print(type(t).__name__, 'opentelemetry' in sys.modules)"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=clean | env, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_without_its_environment_opentelemetry_is_not_even_imported() -> None:
    assert tracing_in_fresh_interpreter({}) == "NoTracing False"
    assert tracing_in_fresh_interpreter({"OTEL_TRACES_EXPORTER": "none"}) == "NoTracing False"
    on = {"OTEL_TRACES_EXPORTER": "console"}
    assert tracing_in_fresh_interpreter(on) == "OtelTracing True"
    off = on | {"OTEL_SDK_DISABLED": "true"}
    assert tracing_in_fresh_interpreter(off) == "NoTracing False"
