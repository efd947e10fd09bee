"""Per-batch Prometheus metrics, in the router's registry (router.observe.metrics).

One series per batch this process ran lines of (a batch is a job, not a request: their
number grows with jobs submitted, which is bounded by the store's retention).
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge

THROUGHPUT_WINDOW = 10.0
"""Seconds the lines-per-second gauge averages over."""


class BatchMetrics:
    """Lines answered and failed, tokens, throughput, and the executor's window."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self._lines = Counter(
            "turnout_batch_lines_total",
            "Batch lines this router answered, by outcome (completed, failed, expired).",
            ["batch", "outcome"],
            registry=r,
        )
        self._tokens = Counter(
            "turnout_batch_tokens_total",
            "Tokens of the batch lines this router answered (engine usage).",
            ["batch", "kind"],
            registry=r,
        )
        self._rate = Gauge(
            "turnout_batch_lines_per_second",
            f"Lines of the batch this router answered per second over {THROUGHPUT_WINDOW:g} s.",
            ["batch"],
            registry=r,
        )
        self.window = Gauge(
            "turnout_batch_concurrency_limit",
            "Batch lines this router may run at once (the pacing window).",
            registry=r,
        )
        self.inflight = Gauge(
            "turnout_batch_inflight_lines", "Batch lines running on this router.", registry=r
        )
        self._recent: deque[tuple[float, str]] = deque()

    def line(self, batch: str, ok: bool, prompt_tokens: int, completion_tokens: int) -> None:
        self._lines.labels(batch, "completed" if ok else "failed").inc()
        self._tokens.labels(batch, "prompt").inc(prompt_tokens)
        self._tokens.labels(batch, "completion").inc(completion_tokens)
        self._recent.append((time.monotonic(), batch))

    def expired(self, batch: str, count: int) -> None:
        self._lines.labels(batch, "expired").inc(count)

    def update_rates(self, batches: set[str]) -> None:
        """Refresh the throughput gauges of ``batches`` (the running ones) from recent lines."""
        cutoff = time.monotonic() - THROUGHPUT_WINDOW
        while self._recent and self._recent[0][0] < cutoff:
            self._recent.popleft()
        counts = dict.fromkeys(batches, 0)
        for _, batch in self._recent:
            if batch in counts:
                counts[batch] += 1
        for batch, n in counts.items():
            self._rate.labels(batch).set(n / THROUGHPUT_WINDOW)
