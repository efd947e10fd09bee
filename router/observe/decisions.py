"""The metrics of the policies' decisions: how long a policy and each pipeline plugin took,
which filter emptied the candidate set, and how far a policy's TTFT predictions were off."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from router.observe.series import DECISION_BUCKETS, Series

PLUGIN_SAMPLE = 16
"""``turnout_policy_plugin_duration_seconds`` observes one run in this many of each
pipeline plugin, its first run included: an observation costs more than most plugins take,
and a pipeline runs three or more a request, while a sample shows their cost as well."""

Watch = Callable[[Gauge, Callable[[], float]], None]
"""The facade's way to read a gauge from live state at scrape time (workers or not)."""


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


class DecisionMetrics:
    """The policies' :class:`~policies.base.PipelineObserver`: a pipeline policy binds one
    series per plugin when it is built, and per request only observes (a sample) into it."""

    def __init__(self, registry: CollectorRegistry, watch: Watch) -> None:
        self._watch = watch
        self._decision = Histogram(
            "turnout_policy_decision_seconds",
            "Time a policy took to rank the candidates.",
            ["policy"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self._plugin = Histogram(
            "turnout_policy_plugin_duration_seconds",
            "Time one filter, scorer or picker of a pipeline policy took for one request, "
            f"sampled: the first run of each and one in {PLUGIN_SAMPLE} after it.",
            ["policy", "plugin", "kind"],
            buckets=DECISION_BUCKETS,
            registry=registry,
        )
        self._filter_rejections = Counter(
            "turnout_policy_filter_rejections_total",
            "Requests for which this filter removed every remaining candidate (answered 503).",
            ["policy", "filter"],
            registry=registry,
        )
        self._prediction_error = Gauge(
            "turnout_policy_ttft_prediction_error_ratio",
            "Mean absolute percentage error (a ratio) of the TTFT a policy predicted for a "
            "backend against the TTFT observed, over its recent streamed requests.",
            ["policy", "backend"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._decision_by = Series(self._decision)  # hit on every request

    def decision(self, policy: str, seconds: float) -> None:
        self._decision_by(policy).observe(seconds)

    def plugin_timer(self, policy: str, kind: str, plugin: str) -> Callable[[float], None]:
        """Observes one plugin's run time (``kind``: filter, scorer or picker), one run in
        :data:`PLUGIN_SAMPLE`."""
        return _Sampled(self._plugin.labels(policy, plugin, kind).observe)

    def filter_emptied(self, policy: str, filter: str) -> Callable[[], None]:
        """Counts one request for which ``filter`` removed every remaining candidate."""
        return self._filter_rejections.labels(policy, filter).inc

    def watch_prediction_error(self, policy: str, backend: str, read: Callable[[], float]) -> None:
        """Read a policy's own TTFT prediction error for a backend at scrape time."""
        self._watch(self._prediction_error.labels(policy, backend), read)
