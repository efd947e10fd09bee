"""One run on the trace's own clock: figures per time window, and its slowest requests.

A request belongs to the window its send falls in, on the trace's clock: the replay's time
multiplied by ``--speed`` (idle gaps that ``--max-gap`` shortened stay shortened). Per window,
for all requests and per class: arrivals and their rate, the mean number in flight, TTFT P50
and P95, mean TPOT, the share that met the class's SLO, errors, and the output tokens of the
requests that finished in it (throughput, and the windows
:func:`replay.bootstrap.window_ratio` resamples); per backend, requests and tokens per class.
Rates are per second of the replay, as the target saw them. Windows are as wide as
``--window-seconds`` or, by default, the smallest of 1, 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15,
30 min, 1, 2, 6, 12 h, 1 day that cuts the trace into at most 60; never more than
``MAX_WINDOWS``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from replay.client import Result
from replay.cost import backend_key
from replay.stats import Column
from turnout.common.figures import meets

STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
TARGET_WINDOWS = 60
MAX_WINDOWS = 2000
"""Windows a timeline holds at most: a finer ``--window-seconds`` is widened to fit."""
SLOWEST = 10
"""Requests the drill-down keeps per class: those with the longest TTFT."""


def window_seconds(span_s: float, asked: float | None = None) -> float:
    """The windows' width on the trace's clock for a trace ``span_s`` long."""
    if asked is not None:
        return max(asked, span_s / MAX_WINDOWS)
    for step in STEPS:
        if span_s / step <= TARGET_WINDOWS:
            return float(step)
    return max(float(STEPS[-1]), span_s / TARGET_WINDOWS)


class _Window:
    """One window's figures for one group (all requests, or a class)."""

    __slots__ = ("arrivals", "errors", "good", "inflight_s", "judged", "out_tokens", "tpot", "ttft")

    def __init__(self) -> None:
        self.arrivals = 0
        self.errors = 0
        self.good = 0
        self.judged = 0
        self.inflight_s = 0.0
        self.out_tokens = 0
        self.ttft = Column()
        self.tpot = Column()


@dataclass(frozen=True, slots=True)
class Frame:
    """How a run is measured over time: windows ``window_s`` wide on the trace's clock, which
    runs ``speed`` times as fast as the replay's, and each class's SLO (TTFT s, TPOT s)."""

    window_s: float = 1.0
    speed: float = 1.0
    slo: Mapping[str, tuple[float, float]] = field(default_factory=dict)


class Timeline:
    """Accumulates one run's windows and slowest requests."""

    def __init__(self, frame: Frame) -> None:
        self.window_s = frame.window_s
        self.speed = frame.speed
        self.slo = frame.slo
        self._step = frame.window_s / frame.speed  # a window's length in the replay's seconds
        self._groups: dict[str, dict[int, _Window]] = {}
        self._backends: dict[str, dict[str, dict[int, list[int]]]] = {}
        self._slowest: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
        self._seen = 0

    def good(self, r: Result) -> bool | None:
        """Whether ``r`` met its class's SLO (None: the class has none)."""
        targets = self.slo.get(r.request_class)
        if targets is None:
            return None
        return meets(r.ok, r.ttft, r.tpot, *targets)

    def _index(self, t: float) -> int:
        return min(max(int(t / self._step), 0), MAX_WINDOWS - 1)

    def _window(self, group: str, k: int) -> _Window:
        windows = self._groups.setdefault(group, {})
        w = windows.get(k)
        if w is None:
            w = windows[k] = _Window()
        return w

    def add(self, r: Result, sent: float) -> None:
        """Account for ``r``, sent ``sent`` seconds into the run (the replay's clock)."""
        end = sent + (r.e2e or 0.0)
        k = self._index(sent)
        done = self._index(end)
        good = self.good(r)
        for group in ("all", r.request_class):
            w = self._window(group, k)
            w.arrivals += 1
            if good is not None:
                w.judged += 1
                w.good += good
            if not r.ok:
                w.errors += 1
            elif r.ttft is not None:
                w.ttft.add(r.ttft)
                if r.tpot is not None:
                    w.tpot.add(r.tpot)
                self._window(group, done).out_tokens += r.output_tokens
            for j in range(k, done + 1):  # its time in flight, window by window
                lo, hi = max(sent, j * self._step), min(end, (j + 1) * self._step)
                if hi > lo:
                    self._window(group, j).inflight_s += hi - lo
        self._backend(r, k)
        if r.ok and r.ttft is not None:
            self._keep_slowest(r, sent)

    def _backend(self, r: Result, k: int) -> None:
        name = backend_key(r, self._backends)
        per_class = self._backends.setdefault(name, {}).setdefault(r.request_class, {})
        counts = per_class.setdefault(k, [0, 0])
        counts[0] += 1
        if r.ok:
            counts[1] += (r.prompt_tokens or 0) + r.output_tokens

    def _keep_slowest(self, r: Result, sent: float) -> None:
        heap = self._slowest.setdefault(r.request_class, [])
        key = r.ttft or 0.0
        if len(heap) >= SLOWEST and key <= heap[0][0]:
            return
        self._seen += 1  # ties: the earlier one stays
        entry = {
            "custom_id": r.custom_id,
            "class": r.request_class,
            "backend": r.backend,
            "attempts": r.attempts,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "output_tokens": r.output_tokens,
            "ttft_ms": round(key * 1000.0, 3),
            "e2e_ms": None if r.e2e is None else round(r.e2e * 1000.0, 3),
            "sent_s": round(sent * self.speed, 3),
        }
        item = (key, -self._seen, entry)
        if len(heap) >= SLOWEST:
            heapq.heapreplace(heap, item)
        else:
            heapq.heappush(heap, item)

    def slowest(self) -> list[dict[str, Any]]:
        """The drill-down: per class, its requests with the longest TTFT, longest first."""
        return [
            entry
            for cls in sorted(self._slowest)
            for _, _, entry in sorted(self._slowest[cls], key=lambda e: (-e[0], -e[1]))
        ]

    def to_dict(self, run: float) -> dict[str, Any]:
        """The run's ``timeline`` entry; the run lasted ``run`` seconds (of the replay), which
        bounds the windows' seconds in it, throughput's denominator."""
        count = self._index(max(run - 1e-9, 0.0)) + 1
        for windows in self._groups.values():
            count = max(count, max(windows, default=-1) + 1)
        step = self._step
        seconds = [max(0.0, min(run, (j + 1) * step) - j * step) for j in range(count)]
        groups = {g: _series(self._groups[g], count, step) for g in sorted(self._groups)}
        backends = {
            name: {
                cls: {
                    "requests": [per.get(j, (0, 0))[0] for j in range(count)],
                    "tokens": [per.get(j, (0, 0))[1] for j in range(count)],
                }
                for cls, per in sorted(classes.items())
            }
            for name, classes in sorted(self._backends.items())
        }
        return {
            "window_s": self.window_s,
            "speed": self.speed,
            "starts_s": [round(j * self.window_s, 6) for j in range(count)],
            "seconds": [round(s, 6) for s in seconds],
            "groups": groups,
            "backends": backends,
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


SERIES = (
    "arrivals",
    "rate",
    "inflight",
    "p50_ttft_ms",
    "p95_ttft_ms",
    "mean_tpot_ms",
    "goodput",
    "errors",
    "out_tokens",
)
"""A group's columns in ``timeline.groups``: one value per window."""


def _series(windows: Mapping[int, _Window], count: int, step: float) -> dict[str, list[Any]]:
    """One group's :data:`SERIES` (None where a window has no such figure)."""
    cols: dict[str, list[Any]] = {k: [] for k in SERIES}
    empty = _Window()
    for j in range(count):
        w = windows.get(j, empty)
        p50, p95 = w.ttft.quantiles((50, 95))
        cols["arrivals"].append(w.arrivals)
        cols["rate"].append(round(w.arrivals / step, 6))
        cols["inflight"].append(round(w.inflight_s / step, 6))
        cols["p50_ttft_ms"].append(_ms(p50))
        cols["p95_ttft_ms"].append(_ms(p95))
        cols["mean_tpot_ms"].append(_ms(w.tpot.mean))
        cols["goodput"].append(round(w.good / w.judged, 6) if w.judged else None)
        cols["errors"].append(w.errors)
        cols["out_tokens"].append(w.out_tokens)
    return cols
