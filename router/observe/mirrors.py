"""The metrics of mirrored requests (router.proxy.shadow), never mixed with served traffic."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from router.observe.series import E2E_BUCKETS, REQUEST_LABELS, TTFT_BUCKETS


class ShadowMetrics:
    """Per mirrored request: its answer and latencies, or why it was not sent."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "turnout_shadow_requests_total",
            "Mirrored requests by answer (code 0: none); policy: the served policy mirrored.",
            [*REQUEST_LABELS, "code"],
            registry=registry,
        )
        self._ttft = Histogram(
            "turnout_shadow_time_to_first_token_seconds",
            "Mirrored requests: sent to the first content chunk.",
            REQUEST_LABELS,
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self._e2e = Histogram(
            "turnout_shadow_e2e_request_latency_seconds",
            "Mirrored requests: sent to the answer's last byte.",
            REQUEST_LABELS,
            buckets=E2E_BUCKETS,
            registry=registry,
        )
        self._dropped = Counter(
            "turnout_shadow_dropped_total",
            "Requests sampled for mirroring but dropped (shadow concurrency bound reached).",
            ["policy"],
            registry=registry,
        )

    def done(
        self,
        policy: str,
        backend: str,
        request_class: str,
        code: int,
        *,
        ttft: float | None,
        e2e: float,
    ) -> None:
        """Record one finished mirrored request."""
        labels = (policy, backend, request_class)
        self._requests.labels(*labels, str(code)).inc()
        if ttft is not None:
            self._ttft.labels(*labels).observe(ttft)
        self._e2e.labels(*labels).observe(e2e)

    def dropped(self, policy: str) -> None:
        self._dropped.labels(policy).inc()
