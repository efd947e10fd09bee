"""The one metrics facade: it owns its CollectorRegistry (tests build a fresh one each).

Names and labels are docs/router.md's tables (Metrics). Request and session ids never become
labels.
Everything here is called once per request (or per probe), never per streamed chunk. It is
also the policies' :class:`~policies.base.PipelineObserver`: a pipeline policy binds one
series per plugin when it is built, and per request only observes (a sample) into it.

With ``turnout serve --workers N`` every worker records into prometheus-client's multiprocess
files (:func:`router.observe.sharing.share_between_workers`, set up by the parent before it
forks), and whichever worker a scrape reaches merges all of them: counters and histograms are
summed over every worker that ever ran (so they never go backwards), and each gauge is merged
as its meaning requires (see its ``multiprocess_mode``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from policies.types import REQUEST_CLASSES, RequestInfo
from router.observe.hops import HopMetrics
from router.observe.outcomes import EARLY_REJECTIONS, LATE_REJECTIONS

# Fine enough to read a P95 TTFT anywhere from 1 ms to 60 s.
TTFT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0,
    60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
)  # fmt: skip
DECISION_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
)  # fmt: skip

_REQ = ("policy", "backend", "class")
PLUGIN_SAMPLE = 16
"""``turnout_policy_plugin_duration_seconds`` observes one run in this many of each
pipeline plugin, its first run included: an observation costs more than most plugins take,
and a pipeline runs three or more a request, while a sample shows their cost as well."""


CAPTURE_DROP_REASONS = (
    "queue_full", "queue_bytes", "not_running", "sink_gone", "unencodable", "error",
)  # fmt: skip
"""Why the capture writer (router.observe.capture) may not write a request."""

_M = TypeVar("_M", Counter, Histogram)


class _Series(Generic[_M]):
    """A metric's children by label values, each resolved by ``labels()`` once: that call
    takes a lock and builds its key every time, and some series are hit on every request."""

    __slots__ = ("_children", "_metric")

    def __init__(self, metric: _M) -> None:
        self._metric: _M = metric
        self._children: dict[tuple[str, ...], _M] = {}

    def __call__(self, *values: str) -> _M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class _Sampled:
    """Passes on the first of every :data:`PLUGIN_SAMPLE` values it is called with."""

    __slots__ = ("_observe", "_runs")

    def __init__(self, observe: Callable[[float], None]) -> None:
        self._observe = observe
        self._runs = 0

    def __call__(self, seconds: float) -> None:
        if self._runs % PLUGIN_SAMPLE == 0:
            self._observe(seconds)
        self._runs += 1


@dataclass(frozen=True, slots=True)
class _Children:
    """The per-request series of one (policy, backend, class) label set."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram
    prompt: Counter
    output: Counter


class Metrics:
    """Prometheus metrics of one router process."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(
        self, registry: CollectorRegistry | None = None, *, workers_dir: Path | None = None
    ) -> None:
        """``workers_dir``: the directory of
        :func:`~router.observe.sharing.share_between_workers`; :meth:`render` then shows
        every worker's figures merged."""
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._exposed = r
        if workers_dir is not None:
            self._exposed = CollectorRegistry()
            MultiProcessCollector(self._exposed, path=str(workers_dir))  # type: ignore[no-untyped-call]
        self._live: list[tuple[Gauge, Callable[[], float]]] = []
        self.hops = HopMetrics(r, TTFT_BUCKETS)
        """A pd policy's hops (router.observe.hops)."""
        self._children: dict[tuple[str, str, str], _Children] = {}
        self._requests = Counter(
            "turnout_requests_total",
            "Requests by outcome: the status the client got and why (reason).",
            [*_REQ, "code", "reason"],
            registry=r,
        )
        self._ttft = Histogram(
            "turnout_time_to_first_token_seconds",
            "Request arrival to the first content chunk sent to the client (served requests).",
            _REQ,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._tpot = Histogram(
            "turnout_time_per_output_token_seconds",
            "(E2E - TTFT) / (output tokens - 1) (served requests).",
            _REQ,
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            "turnout_e2e_request_latency_seconds",
            "Request arrival to the response's last byte (served requests).",
            _REQ,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self._prompt = Counter(
            "turnout_prompt_tokens_total", "Prompt tokens (engine usage).", _REQ, registry=r
        )
        self._output = Counter(
            "turnout_output_tokens_total", "Output tokens (engine usage).", _REQ, registry=r
        )
        # Every worker reads the router-wide figure (router.backends.shared): the freshest wins.
        self._inflight = Gauge(
            "turnout_inflight_requests",
            "Requests open on a backend.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # Workers probe on their own: down if any worker sees it down.
        self._up = Gauge(
            "turnout_backend_up",
            "1 if the backend is healthy.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemin",
        )
        self._failovers = Counter(
            "turnout_failovers_total",
            "Attempts that failed before the first byte (backend: the one that failed).",
            ["policy", "backend"],
            registry=r,
        )
        self._decision = Histogram(
            "turnout_policy_decision_seconds",
            "Time a policy took to rank the candidates.",
            ["policy"],
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self._plugin = Histogram(
            "turnout_policy_plugin_duration_seconds",
            "Time one filter, scorer or picker of a pipeline policy took for one request, "
            f"sampled: the first run of each and one in {PLUGIN_SAMPLE} after it.",
            ["policy", "plugin", "kind"],
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self._filter_rejections = Counter(
            "turnout_policy_filter_rejections_total",
            "Requests for which this filter removed every remaining candidate (answered 503).",
            ["policy", "filter"],
            registry=r,
        )
        self._aborts = Counter(
            "turnout_stream_aborts_total",
            "Streams the upstream broke after bytes had reached the client.",
            _REQ,
            registry=r,
        )
        # The tail defences (router.proxy.tail): per policy, backend and class.
        tail = (
            ("turnout_hedges_total", "Hedged copies sent (backend: the copy's)."),
            ("turnout_hedges_won_total", "Requests whose hedged copy produced the first token."),
            ("turnout_hedges_cancelled_total", "Attempts of hedged requests cut (backend: cut)."),
            ("turnout_hedge_wasted_tokens_total",
             "Prompt tokens and streamed content events of cut attempts of hedged requests."),
            ("turnout_first_token_deadlines_missed_total",
             "Attempts cut at their first-token deadline (backend: the late one)."),
        )  # fmt: skip
        self._tail = {name: Counter(name, doc, _REQ, registry=r) for name, doc in tail}
        self._protocol_errors = Counter(
            "turnout_upstream_protocol_errors_total",
            "What backends got wrong in their answers (ignored, or the request failed), by kind.",
            ["backend", "kind"],
            registry=r,
        )
        self._slo_met = Counter(
            "turnout_slo_attained_total",
            "Requests that met their class's TTFT and TPOT targets.",
            ["policy", "class"],
            registry=r,
        )
        self._slo_missed = Counter(
            "turnout_slo_missed_total",
            "Requests that failed or missed their class's TTFT or TPOT target.",
            ["policy", "class"],
            registry=r,
        )
        self._prediction_error = Gauge(
            "turnout_policy_ttft_prediction_error_ratio",
            "Mean absolute percentage error (a ratio) of the TTFT a policy predicted for a "
            "backend against the TTFT observed, over its recent streamed requests.",
            ["policy", "backend"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self._queued = Gauge(
            "turnout_admission_queue_length",
            "Requests waiting for a backend slot (every eligible backend saturated).",
            ["class"],
            registry=r,
            multiprocess_mode="livesum",  # each worker has its own queues
        )
        self._shadow_requests = Counter(
            "turnout_shadow_requests_total",
            "Mirrored requests by answer (code 0: none); policy: the served policy mirrored.",
            [*_REQ, "code"],
            registry=r,
        )
        self._shadow_ttft = Histogram(
            "turnout_shadow_time_to_first_token_seconds",
            "Mirrored requests: sent to the first content chunk.",
            _REQ,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._shadow_e2e = Histogram(
            "turnout_shadow_e2e_request_latency_seconds",
            "Mirrored requests: sent to the answer's last byte.",
            _REQ,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self._shadow_dropped = Counter(
            "turnout_shadow_dropped_total",
            "Requests sampled for mirroring but dropped (shadow concurrency bound reached).",
            ["policy"],
            registry=r,
        )
        self._panic = Counter(
            "turnout_panic_routing_total",
            "Routing decisions made in panic mode: every backend serving the model was out, "
            "so all of them were offered (model: other for a name no backend lists).",
            ["model"],
            registry=r,
        )
        self._dropped = Counter(
            "turnout_capture_dropped_total",
            "Sampled requests not captured, by reason (queue_full, queue_bytes, not_running, "
            "sink_gone, unencodable, error).",
            ["reason"],
            registry=r,
        )
        self._degraded = Counter(
            "turnout_capture_degraded_total",
            "Requests captured with their body replaced, by reason (unencodable).",
            ["reason"],
            registry=r,
        )
        self._refused = Counter(
            "turnout_connections_refused_total",
            "Client connections answered 503 and closed: the connection cap was reached.",
            registry=r,
        )
        self._limits_local = Counter(
            "turnout_limits_local_total",
            "Requests whose limits were decided without the shared limits store (Redis "
            "unreachable), by outcome: allowed or refused by this router's own buckets "
            "(on_error: allow), or denied for the outage (on_error: deny).",
            ["outcome"],
            registry=r,
        )
        self._limits_up = Gauge(
            "turnout_limits_store_up",
            "1 while the shared limits store (Redis) answers this process, else 0.",
            registry=r,
            multiprocess_mode="livemin",  # 0 when any worker cannot reach it
        )
        self._placement = Gauge(
            "turnout_placement_shared",
            "1 while this process hears the other router replicas' placements (Redis), 0 "
            "while it learns from its own router's alone.",
            registry=r,
            multiprocess_mode="livemin",
        )
        # Every reason exported at 0 from the start, so rate() and alerts see the series
        # before the first drop (Prometheus' advice for known label values).
        for reason in CAPTURE_DROP_REASONS:
            self._dropped.labels(reason)
        self._degraded.labels("unencodable")
        # The series hit on every request, their children resolved once.
        self._requests_by = _Series(self._requests)
        self._decision_by = _Series(self._decision)
        self._slo_by = {True: _Series(self._slo_met), False: _Series(self._slo_missed)}

    def policy_known(self, policy: str) -> None:
        """Export ``policy``'s series of the router's own rejections at 0 (Prometheus' advice
        for known label values: rate() and alerts see a series before its first increment)."""
        for reason, code in EARLY_REJECTIONS:
            self._requests.labels(policy, "none", "unknown", str(code), reason)
        for cls in REQUEST_CLASSES:
            for reason, code in LATE_REJECTIONS:
                self._requests.labels(policy, "none", cls, str(code), reason)

    def request_done(
        self,
        policy: str,
        backend: str,
        request_class: str,
        code: int,
        reason: str,
        *,
        ttft: float | None,
        tpot: float | None,
        e2e: float | None,
        prompt_tokens: int | None,
        output_tokens: int | None,
    ) -> None:
        """Record one finished request (backend ``none`` when no backend answered).

        ``reason``: one of router.observe.outcomes' reasons. The caller passes latencies only for a
        served request (``ok``), so that rejections and failures never skew the histograms.
        """
        labels = (policy, backend, request_class)
        children = self._children.get(labels)
        if children is None:  # labels() takes a lock and builds a key: do it once per label set
            children = self._children[labels] = _Children(
                ttft=self._ttft.labels(*labels),
                tpot=self._tpot.labels(*labels),
                e2e=self._e2e.labels(*labels),
                prompt=self._prompt.labels(*labels),
                output=self._output.labels(*labels),
            )
        self._requests_by(*labels, str(code), reason).inc()
        if ttft is not None:
            children.ttft.observe(ttft)
        if tpot is not None:
            children.tpot.observe(tpot)
        if e2e is not None:
            children.e2e.observe(e2e)
        if prompt_tokens:
            children.prompt.inc(prompt_tokens)
        if output_tokens:
            children.output.inc(output_tokens)

    def watch_backend(
        self, backend: str, inflight: Callable[[], float], up: Callable[[], float]
    ) -> None:
        """Read a backend's gauges from live state at scrape time (nothing per request)."""
        self._watch(self._inflight.labels(backend), inflight)
        self._watch(self._up.labels(backend), up)

    def unwatch_backend(self, backend: str) -> None:
        """A backend left the router: its gauges go (Prometheus then marks them stale). Its
        request counters and histograms stay, as counters of a running process do."""
        if self._live:  # with workers the files keep the series: stop setting it, leave 0
            gone = {id(self._inflight.labels(backend)), id(self._up.labels(backend))}
            for child, _ in self._live:
                if id(child) in gone:
                    child.set(0)
            self._live = [(child, read) for child, read in self._live if id(child) not in gone]
        for gauge in (self._inflight, self._up):
            with contextlib.suppress(KeyError):
                gauge.remove(backend)

    def failover(self, policy: str, backend: str) -> None:
        self._failovers.labels(policy, backend).inc()

    def decision(self, policy: str, seconds: float) -> None:
        self._decision_by(policy).observe(seconds)

    def plugin_timer(self, policy: str, kind: str, plugin: str) -> Callable[[float], None]:
        """Observes one plugin's run time (``kind``: filter, scorer or picker), one run in
        :data:`PLUGIN_SAMPLE`."""
        return _Sampled(self._plugin.labels(policy, plugin, kind).observe)

    def filter_emptied(self, policy: str, filter: str) -> Callable[[], None]:
        """Counts one request for which ``filter`` removed every remaining candidate."""
        return self._filter_rejections.labels(policy, filter).inc

    def hedge_fired(self, policy: str, backend: str, req: RequestInfo) -> None:
        self._tail["turnout_hedges_total"].labels(policy, backend, req.request_class).inc()

    def hedge_won(self, policy: str, backend: str, req: RequestInfo) -> None:
        self._tail["turnout_hedges_won_total"].labels(policy, backend, req.request_class).inc()

    def hedge_cancelled(self, policy: str, backend: str, req: RequestInfo, wasted: int) -> None:
        labels = (policy, backend, req.request_class)
        self._tail["turnout_hedges_cancelled_total"].labels(*labels).inc()
        self._tail["turnout_hedge_wasted_tokens_total"].labels(*labels).inc(wasted)

    def deadline_missed(self, policy: str, backend: str, req: RequestInfo) -> None:
        name = "turnout_first_token_deadlines_missed_total"
        self._tail[name].labels(policy, backend, req.request_class).inc()

    def stream_aborted(self, policy: str, backend: str, request_class: str) -> None:
        self._aborts.labels(policy, backend, request_class).inc()

    def protocol_errors(self, backend: str, kind: str, count: int = 1) -> None:
        """Count what ``backend`` got wrong in one answer (kinds:
        turnout.common.answer_fields.PROTOCOL_ERRORS, ``body_too_large``, ``bad_error_body``, the
        response heads router.proxy.connection refuses, ``bad_status`` and ``bad_interim``, and
        those router.proxy.upstream does not relay, ``redirect`` and ``bad_encoding``)."""
        self._protocol_errors.labels(backend, kind).inc(count)

    def watch_queue(self, request_class: str, waiting: Callable[[], float]) -> None:
        """Read a class's admission queue length from live state at scrape time."""
        self._watch(self._queued.labels(request_class), waiting)

    def limits_local(self, outcome: str) -> None:
        self._limits_local.labels(outcome).inc()

    def watch_limits_store(self, up: Callable[[], float]) -> None:
        """Read whether the shared limits store answers, at scrape time."""
        self._watch(self._limits_up, up)

    def watch_placement(self, shared: Callable[[], float]) -> None:
        """Read whether placements are shared with the other replicas, at scrape time."""
        self._watch(self._placement, shared)

    def watch_prediction_error(self, policy: str, backend: str, read: Callable[[], float]) -> None:
        """Read a policy's own TTFT prediction error for a backend at scrape time."""
        self._watch(self._prediction_error.labels(policy, backend), read)

    def _watch(self, gauge: Gauge, read: Callable[[], float]) -> None:
        if self._exposed is self.registry:
            gauge.set_function(read)  # read at every collection of the registry
        else:  # multiprocess values cannot be functions: set now, at each scrape, every second
            gauge.set(read())
            self._live.append((gauge, read))

    def slo(self, policy: str, request_class: str, met: bool) -> None:
        """Count one request against its class's SLO."""
        self._slo_by[met](policy, request_class).inc()

    def shadow_done(
        self,
        policy: str,
        backend: str,
        request_class: str,
        code: int,
        *,
        ttft: float | None,
        e2e: float,
    ) -> None:
        """Record one finished mirrored request (never mixed with served traffic)."""
        labels = (policy, backend, request_class)
        self._shadow_requests.labels(*labels, str(code)).inc()
        if ttft is not None:
            self._shadow_ttft.labels(*labels).observe(ttft)
        self._shadow_e2e.labels(*labels).observe(e2e)

    def shadow_dropped(self, policy: str) -> None:
        self._shadow_dropped.labels(policy).inc()

    def panic_routing(self, model: str) -> None:
        self._panic.labels(model).inc()

    def connection_refused(self) -> None:
        self._refused.inc()

    def capture_dropped(self, reason: str) -> None:
        self._dropped.labels(reason).inc()

    def capture_degraded(self, reason: str) -> None:
        self._degraded.labels(reason).inc()

    def refresh(self) -> None:
        """With workers, set the gauges read from live state: a scrape does it first, and a
        worker also every second, for the scrapes that reach its siblings."""
        for gauge, read in self._live:
            gauge.set(read())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (of every worker's, merged)."""
        self.refresh()
        return generate_latest(self._exposed)
