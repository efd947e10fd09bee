"""The metrics of what the router shares with its replicas through Redis: the limits store
and the placement feed."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

from router.observe.decisions import Watch


class StoreMetrics:
    """Whether the shared stores answer, and what was decided while they did not."""

    def __init__(self, registry: CollectorRegistry, watch: Watch) -> None:
        self._watch = watch
        self._limits_local = Counter(
            "turnout_limits_local_total",
            "Requests whose limits were decided without the shared limits store (Redis "
            "unreachable), by outcome: allowed or refused by this router's own buckets "
            "(on_error: allow), or denied for the outage (on_error: deny).",
            ["outcome"],
            registry=registry,
        )
        self._limits_up = Gauge(
            "turnout_limits_store_up",
            "1 while the shared limits store (Redis) answers this process, else 0.",
            registry=registry,
            multiprocess_mode="livemin",  # 0 when any worker cannot reach it
        )
        self._placement = Gauge(
            "turnout_placement_shared",
            "1 while this process hears the other router replicas' placements (Redis), 0 "
            "while it learns from its own router's alone.",
            registry=registry,
            multiprocess_mode="livemin",
        )

    def limits_local(self, outcome: str) -> None:
        self._limits_local.labels(outcome).inc()

    def watch_limits_store(self, up: Callable[[], float]) -> None:
        """Read whether the shared limits store answers, at scrape time."""
        self._watch(self._limits_up, up)

    def watch_placement(self, shared: Callable[[], float]) -> None:
        """Read whether placements are shared with the other replicas, at scrape time."""
        self._watch(self._placement, shared)
