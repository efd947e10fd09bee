"""OpenTelemetry tracing (the optional ``otel`` extra); imported only when tracing is on.

Each request is a SERVER span that continues the client's W3C ``traceparent``, with child
spans for classification (``turnout.classify``), the policy's pick (``turnout.pick``,
admission's wait included) and each upstream attempt, a CLIENT span named and attributed after
OpenTelemetry's GenAI semantic conventions (``{gen_ai.operation.name} {gen_ai.request.model}``,
``gen_ai.*``, ``server.address``/``server.port``). Each attempt's own context goes upstream
in ``traceparent``, so an engine that traces joins the same trace under the attempt that
called it. Never a prompt, an answer or a key: only names, counts, times and statuses.

Exporters, sampling, the service name and the batch processor follow OpenTelemetry's standard
environment variables (``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_TRACES_SAMPLER``, ``OTEL_SERVICE_NAME``, ``OTEL_BSP_*`` ...), read by the SDK itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, MutableMapping, Sequence
from importlib.metadata import entry_points
from urllib.parse import urlsplit

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from policies.types import RequestInfo
from router.observe.tracing import Ending

_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({"traceparent", "tracestate"})
# gen_ai.operation.name by the router's endpoint (the conventions' well-known values).
_OPERATIONS = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
_MAX_NAME = 200  # characters of a (client-given) model name in a span name
_FLUSH_MILLIS = 500  # at exit, for the spans still queued


class OtelTracing:
    """Request traces on one OpenTelemetry tracer provider."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("turnout")

    @classmethod
    def from_env(cls, service: str) -> OtelTracing:
        """A provider with the exporters ``OTEL_TRACES_EXPORTER`` names (default ``otlp``),
        each behind a batch processor; ``service`` unless the environment names the service."""
        resource = Resource.create()
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            resource = resource.merge(Resource({"service.name": service}))
        # No exit hook: close() flushes with a bound, so a collector that is down cannot hold
        # the process past its drain.
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        names = os.environ.get("OTEL_TRACES_EXPORTER") or "otlp"
        for name in (n.strip() for n in names.split(",")):
            if name and name != "none":
                provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        return cls(provider)

    def begin(
        self, headers: Mapping[str, str], method: str, path: str, request_id: str, now: float
    ) -> OtelTrace:
        return OtelTrace(self._tracer, headers, method, path, request_id, now)

    def close(self) -> None:
        self._provider.force_flush(_FLUSH_MILLIS)


def _exporter(name: str) -> SpanExporter:
    """The exporter an ``OTEL_TRACES_EXPORTER`` name stands for (its package's entry point);
    ``otlp`` is OTLP over HTTP/protobuf (the specification's default protocol) unless a
    package registers ``otlp`` itself."""
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found and name == "otlp":
        found = entry_points(group="opentelemetry_traces_exporter", name="otlp_proto_http")
    if not found:
        raise ValueError(f"OTEL_TRACES_EXPORTER: no exporter named {name!r} is installed")
    exporter: SpanExporter = next(iter(found)).load()()
    return exporter


class OtelTrace:
    """One request's spans (see the module docstring)."""

    __slots__ = ("_attempt", "_attempts", "_ctx", "_model", "_op", "_root", "_t0", "_tracer",
                 "_wall0")  # fmt: skip
    recording = True

    def __init__(
        self,
        tracer: Tracer,
        headers: Mapping[str, str],
        method: str,
        path: str,
        request_id: str,
        now: float,
    ) -> None:
        self._tracer = tracer
        # Every time of the trace is a monotonic reading mapped through this one anchor, the
        # request's arrival ``now`` in wall-clock nanoseconds (both clocks read together,
        # then taken back to ``now``): a span stamped by the SDK's own wall clock instead was
        # off by however long had passed since ``now``, so under load an attempt could seem
        # to start before the pick that chose it ended.
        self._t0 = now
        self._wall0 = time.time_ns() - int((time.monotonic() - now) * 1e9)
        self._root = tracer.start_span(
            f"{method} {path}",
            context=_PROPAGATOR.extract(headers),
            kind=SpanKind.SERVER,
            start_time=self._wall0,
            attributes={
                "http.request.method": method,
                "url.path": path,
                "turnout.request_id": request_id,
            },
        )
        self._ctx = trace.set_span_in_context(self._root)
        self._attempt: Span | None = None
        self._attempts = 0
        self._op = self._model = ""

    def _ns(self, t: float) -> int:
        """A monotonic reading as the wall-clock nanoseconds OpenTelemetry records."""
        return self._wall0 + int((t - self._t0) * 1e9)

    def classified(self, info: RequestInfo, start: float, end: float) -> None:
        self._op = _OPERATIONS.get(info.endpoint, info.endpoint)
        self._model = info.model[:_MAX_NAME]
        gen_ai: dict[str, str | int] = {
            "gen_ai.operation.name": self._op,
            "gen_ai.request.model": self._model,
        }
        if info.max_tokens is not None:
            gen_ai["gen_ai.request.max_tokens"] = info.max_tokens
        self._root.update_name(f"{self._op} {self._model}")
        self._root.set_attributes(gen_ai)
        span = self._tracer.start_span(
            "turnout.classify",
            context=self._ctx,
            start_time=self._ns(start),
            attributes={
                "turnout.class": info.request_class,
                "turnout.stream": info.stream,
                "turnout.prompt_tokens_estimate": info.prompt_tokens,
                **gen_ai,
            },
        )
        span.end(self._ns(end))

    def picked(self, policy: str, ranked: Sequence[str], start: float, end: float) -> None:
        span = self._tracer.start_span(
            "turnout.pick",
            context=self._ctx,
            start_time=self._ns(start),
            attributes={"turnout.policy": policy, "turnout.ranked": list(ranked)},
        )
        span.end(self._ns(end))

    def attempt(self, backend: str, url: str, headers: MutableMapping[str, str]) -> None:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self._attempts += 1
        self._attempt = span = self._tracer.start_span(
            f"{self._op} {self._model}",
            context=self._ctx,
            kind=SpanKind.CLIENT,
            start_time=self._ns(time.monotonic()),
            attributes={
                "gen_ai.operation.name": self._op,
                "gen_ai.request.model": self._model,
                "server.address": parts.hostname or "",
                "server.port": port,
                "turnout.backend": backend,
                "turnout.attempt": self._attempts,
            },
        )
        for key in [k for k in headers if k.lower() in _TRACE_HEADERS]:
            del headers[key]  # the client's context is the root's parent, not the engine's
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))

    def attempt_failed(self, status: int | None, message: str, timeout: bool) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        kind = str(status) if status is not None else "timeout" if timeout else "unreachable"
        span.set_attribute("error.type", kind)
        span.set_status(Status(StatusCode.ERROR, message))
        span.end(self._ns(time.monotonic()))

    def finish(self, ending: Ending) -> None:
        end = self._ns(ending.end)
        usage: dict[str, int | str | Sequence[str]] = {}
        if ending.input_tokens is not None:
            usage["gen_ai.usage.input_tokens"] = ending.input_tokens
        if ending.output_tokens is not None:
            usage["gen_ai.usage.output_tokens"] = ending.output_tokens
        if ending.finish_reason is not None:
            usage["gen_ai.response.finish_reasons"] = [ending.finish_reason]
        span, self._attempt = self._attempt, None
        if span is not None:
            span.set_attributes({"http.response.status_code": ending.status, **usage})
            if ending.failed and ending.reason.startswith("upstream"):
                span.set_attribute("error.type", ending.reason)
                span.set_status(Status(StatusCode.ERROR, ending.reason))
            span.end(end)
        root = self._root
        root.set_attributes(
            {
                "http.response.status_code": ending.status,
                "turnout.reason": ending.reason,
                "turnout.policy": ending.policy,
                "turnout.class": ending.request_class,
                "turnout.attempts": ending.attempts,
                **usage,
            }
        )
        if ending.backend is not None:
            root.set_attribute("turnout.backend", ending.backend)
        if ending.tenant is not None:
            root.set_attribute("turnout.tenant", ending.tenant)
        if ending.ttft is not None:
            root.set_attribute("turnout.time_to_first_token", ending.ttft)
        if ending.failed:
            root.set_attribute("error.type", ending.reason)
            root.set_status(Status(StatusCode.ERROR, ending.reason))
        root.end(end)
