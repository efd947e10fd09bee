"""The one metrics facade: it owns its CollectorRegistry (tests build a fresh one each).

Names and labels are docs/router.md's tables (Metrics). Request and session ids never become
labels.
Everything here is called once per request (or per probe), never per streamed chunk. The
facade holds the per-request series and the backends' gauges itself, and one object per other
area, each built on its registry: ``hops`` (router.observe.hops), ``policy`` (the policies'
pipeline observer, router.observe.decisions), ``shadow`` (router.observe.mirrors), ``capture``
(router.observe.capturing) and ``stores`` (router.observe.stores).

With ``turnout serve --workers N`` every worker records into prometheus-client's multiprocess
files (:func:`router.observe.sharing.share_between_workers`, set up by the parent before it
forks), and whichever worker a scrape reaches merges all of them: counters and histograms are
summed over every worker that ever ran (so they never go backwards), and each gauge is merged
as its meaning requires (see its ``multiprocess_mode``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

from policies.types import REQUEST_CLASSES, RequestInfo
from router.observe.capturing import CaptureMetrics
from router.observe.decisions import DecisionMetrics
from router.observe.hops import HopMetrics
from router.observe.mirrors import ShadowMetrics
from router.observe.outcomes import EARLY_REJECTIONS, LATE_REJECTIONS
from router.observe.series import REQUEST_LABELS, TTFT_BUCKETS, Series
from router.observe.served import Served, SharedServed
from router.observe.stores import StoreMetrics

_REQ = REQUEST_LABELS


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
        self.policy = DecisionMetrics(r, self._watch)
        """The policies' decisions and their pipeline observer (router.observe.decisions)."""
        self.shadow = ShadowMetrics(r)
        """Mirrored requests (router.observe.mirrors)."""
        self.capture = CaptureMetrics(r)
        """What the capture writer lost (router.observe.capturing)."""
        self.stores = StoreMetrics(r, self._watch)
        """The limits store and the placement feed (router.observe.stores)."""
        # The per-request series: compact in one process, prometheus_client's own values
        # where workers share them through its files (router.observe.served).
        self._served = Served(r) if workers_dir is None else SharedServed(r)
        # Every worker reads the router-wide figure (router.backends.shared): the freshest wins.
        self._inflight = Gauge(
            "turnout_inflight_requests",
            "Requests open on a backend.",
            ["backend"],
            registry=r,
            multiprocess_mode="livemostrecent",
        )
        # The router's grant, in the workers' shared memory: every worker reads the same.
        self._grant = Gauge(
            "turnout_backend_grant",
            "Slots of the backend's max_inflight this router holds among its replicas "
            "(limits.store.redis); -1 without a grant (no cap, or capping alone).",
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
        self._queued = Gauge(
            "turnout_admission_queue_length",
            "Requests waiting for a backend slot (every eligible backend saturated).",
            ["class"],
            registry=r,
            multiprocess_mode="livesum",  # each worker has its own queues
        )
        self._panic = Counter(
            "turnout_panic_routing_total",
            "Routing decisions made in panic mode: every backend serving the model was out, "
            "so all of them were offered (model: other for a name no backend lists).",
            ["model"],
            registry=r,
        )
        self._refused = Counter(
            "turnout_connections_refused_total",
            "Client connections answered 503 and closed: the connection cap was reached.",
            registry=r,
        )
        # The series hit on every request, their children resolved once.
        self._slo_by = {True: Series(self._slo_met), False: Series(self._slo_missed)}

    def policy_known(self, policy: str) -> None:
        """Export ``policy``'s series of the router's own rejections at 0 (Prometheus' advice
        for known label values: rate() and alerts see a series before its first increment)."""
        for reason, code in EARLY_REJECTIONS:
            self._served.known((policy, "none", "unknown"), code, reason)
        for cls in REQUEST_CLASSES:
            for reason, code in LATE_REJECTIONS:
                self._served.known((policy, "none", cls), code, reason)

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
        self._served.done(
            (policy, backend, request_class), code, reason, ttft, tpot, e2e,
            prompt_tokens, output_tokens,
        )  # fmt: skip

    def watch_backend(
        self,
        backend: str,
        inflight: Callable[[], float],
        up: Callable[[], float],
        grant: Callable[[], float] | None = None,
    ) -> None:
        """Read a backend's gauges from live state at scrape time (nothing per request);
        ``grant`` only where replicas share the backend's cap."""
        self._watch(self._inflight.labels(backend), inflight)
        self._watch(self._up.labels(backend), up)
        if grant is not None:
            self._watch(self._grant.labels(backend), grant)

    def unwatch_backend(self, backend: str) -> None:
        """A backend left the router: its gauges go (Prometheus then marks them stale). Its
        request counters and histograms stay, as counters of a running process do."""
        if self._live:  # with workers the files keep the series: stop setting it, leave 0
            gauges = (self._inflight, self._up, self._grant)
            gone = {id(gauge.labels(backend)) for gauge in gauges}
            for child, _ in self._live:
                if id(child) in gone:
                    child.set(0)
            self._live = [(child, read) for child, read in self._live if id(child) not in gone]
        for gauge in (self._inflight, self._up, self._grant):
            with contextlib.suppress(KeyError):
                gauge.remove(backend)

    def failover(self, policy: str, backend: str) -> None:
        self._failovers.labels(policy, backend).inc()

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

    def _watch(self, gauge: Gauge, read: Callable[[], float]) -> None:
        if self._exposed is self.registry:
            gauge.set_function(read)  # read at every collection of the registry
        else:  # multiprocess values cannot be functions: set now, at each scrape, every second
            gauge.set(read())
            self._live.append((gauge, read))

    def slo(self, policy: str, request_class: str, met: bool) -> None:
        """Count one request against its class's SLO."""
        self._slo_by[met](policy, request_class).inc()

    def panic_routing(self, model: str) -> None:
        self._panic.labels(model).inc()

    def connection_refused(self) -> None:
        self._refused.inc()

    def refresh(self) -> None:
        """With workers, set the gauges read from live state: a scrape does it first, and a
        worker also every second, for the scrapes that reach its siblings."""
        for gauge, read in self._live:
            gauge.set(read())

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric (of every worker's, merged)."""
        self.refresh()
        return generate_latest(self._exposed)
