"""Batch Prometheus metrics, in the router's registry (router.observe.metrics).

No series is labelled by batch: batches come and go without end (each would leave its series
behind, in every worker's multiprocess files too, where they cannot be removed), and a
batch's own progress is the Batch API's (``request_counts``). These are the process's totals.
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
            ["outcome"],
            registry=r,
        )
        self._tokens = Counter(
            "turnout_batch_tokens_total",
            "Tokens of the batch lines this router answered (engine usage).",
            ["kind"],
            registry=r,
        )
        self._rate = Gauge(
            "turnout_batch_lines_per_second",
            f"Batch lines this router answered per second over {THROUGHPUT_WINDOW:g} s.",
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
        for outcome in ("completed", "failed", "expired"):  # at 0 before the first line
            self._lines.labels(outcome)
        for kind in ("prompt", "completion"):
            self._tokens.labels(kind)
        self._recent: deque[float] = deque()

    def line(self, ok: bool, prompt_tokens: int, completion_tokens: int) -> None:
        self._lines.labels("completed" if ok else "failed").inc()
        self._tokens.labels("prompt").inc(prompt_tokens)
        self._tokens.labels("completion").inc(completion_tokens)
        self._recent.append(time.monotonic())

    def expired(self, count: int) -> None:
        self._lines.labels("expired").inc(count)

    def update_rate(self) -> None:
        """Refresh the throughput gauge from the lines of the last window."""
        cutoff = time.monotonic() - THROUGHPUT_WINDOW
        while self._recent and self._recent[0] < cutoff:
            self._recent.popleft()
        self._rate.set(len(self._recent) / THROUGHPUT_WINDOW)
