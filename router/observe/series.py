"""What the metric families of router.observe share: histogram buckets and cached children."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Histogram

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

REQUEST_LABELS = ("policy", "backend", "class")
"""The labels of the per-request series (served, mirrored and the tail defences')."""

_M = TypeVar("_M", Counter, Histogram)


class Series(Generic[_M]):
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
