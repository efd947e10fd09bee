"""The metrics of the capture writer (router.observe.capture): what it could not write."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

CAPTURE_DROP_REASONS = (
    "queue_full", "queue_bytes", "not_running", "sink_gone", "unencodable", "error",
)  # fmt: skip
"""Why the capture writer (router.observe.capture) may not write a request."""


class CaptureMetrics:
    """Sampled requests not captured, or captured with their body replaced, by reason."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._dropped = Counter(
            "turnout_capture_dropped_total",
            "Sampled requests not captured, by reason (queue_full, queue_bytes, not_running, "
            "sink_gone, unencodable, error).",
            ["reason"],
            registry=registry,
        )
        self._degraded = Counter(
            "turnout_capture_degraded_total",
            "Requests captured with their body replaced, by reason (unencodable).",
            ["reason"],
            registry=registry,
        )
        # Every reason exported at 0 from the start, so rate() and alerts see the series
        # before the first drop (Prometheus' advice for known label values).
        for reason in CAPTURE_DROP_REASONS:
            self._dropped.labels(reason)
        self._degraded.labels("unencodable")

    def dropped(self, reason: str) -> None:
        self._dropped.labels(reason).inc()

    def degraded(self, reason: str) -> None:
        self._degraded.labels(reason).inc()
