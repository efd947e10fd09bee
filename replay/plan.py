"""The replay schedule: a pure, streamed transformation of items into send times.

Order of operations: ``--window`` (trace time, seconds) keeps items whose arrival falls in
``[START, END)`` and rebases times to START; ``--shard I/N`` keeps the items whose id hashes
to shard I (stable, so N processes split one trace without talking to each other); a bounded
reorder buffer puts nearly sorted rows in order; ``--speed`` divides offsets; ``--max-gap``
shortens every idle gap longer than the cap; ``--max-requests`` stops the plan. Items without
arrival times (Batch files) are spaced at ``--rate`` requests/s, or all at 0 for closed loop.
"""

from __future__ import annotations

import heapq
import itertools
import math
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from replay.sources import Item

REORDER_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How to turn a trace's arrival times into a schedule."""

    speed: float = 1.0
    max_gap: float | None = None
    window: tuple[float, float | None] | None = None
    max_requests: int | None = None
    shard: tuple[int, int] | None = None
    rate: float | None = None


@dataclass(frozen=True, slots=True)
class Planned:
    """An item and its send time in seconds from the run's start."""

    at: float
    item: Item


@dataclass(slots=True)
class PlanStats:
    """What ``--dry-run`` prints."""

    requests: int = 0
    duration: float = 0.0
    mean_rate: float = 0.0
    peak_rate: float = 0.0
    largest_gap: float = 0.0
    out_of_order: int = 0
    untimed: int = 0


class Plan:
    """Iterable schedule over ``items``; counts out-of-order and untimed rows as it goes."""

    def __init__(self, items: Iterable[Item], options: PlanOptions) -> None:
        if options.speed <= 0:
            raise ValueError("speed must be > 0")
        if options.shard is not None and not 0 <= options.shard[0] < options.shard[1]:
            raise ValueError("shard must be I/N with 0 <= I < N")
        self._items = items
        self._opt = options
        self.out_of_order = 0
        self.untimed = 0

    def _timed(self) -> Iterator[tuple[float, int, Item]]:
        """(trace seconds from the base, row, item) after window and shard, in file order."""
        opt = self._opt
        start, end = opt.window if opt.window else (0.0, None)
        latest = -math.inf
        for n, item in enumerate(self._items):
            ms = item.record.t_offset_ms
            if ms is None:
                self.untimed += 1
                t = n / opt.rate if opt.rate else 0.0
            else:
                t = ms / 1000.0
                if t < latest:
                    self.out_of_order += 1
                latest = max(latest, t)
            if opt.window and (t < start or (end is not None and t >= end)):
                continue
            if opt.shard:
                i, of = opt.shard
                if zlib.crc32(item.record.custom_id.encode()) % of != i:
                    continue
            yield t - start, n, item

    def _sorted(self) -> Iterator[tuple[float, int, Item]]:
        """The timed stream through a bounded min-heap: nearly sorted input comes out sorted."""
        heap: list[tuple[float, int, Item]] = []
        for entry in self._timed():
            if len(heap) >= REORDER_WINDOW:
                yield heapq.heappushpop(heap, entry)
            else:
                heapq.heappush(heap, entry)
        while heap:
            yield heapq.heappop(heap)

    def __iter__(self) -> Iterator[Planned]:
        opt = self._opt
        shift = 0.0  # time removed by the gap cap so far
        prev = 0.0
        stream: Iterator[tuple[float, int, Item]] = self._sorted()
        if opt.max_requests is not None:
            stream = itertools.islice(stream, opt.max_requests)
        for t, _, item in stream:
            at = t / opt.speed - shift
            if opt.max_gap is not None and at - prev > opt.max_gap:
                shift += at - prev - opt.max_gap
                at = prev + opt.max_gap
            at = max(at, prev)  # rows beyond the reorder window go out as soon as possible
            prev = at
            yield Planned(at, item)


def dry_run(plan: Plan) -> PlanStats:
    """Walk the whole plan (streamed) and summarise it."""
    stats = PlanStats()
    prev = 0.0
    bins: dict[int, int] = {}
    peak = 0
    for p in plan:
        stats.requests += 1
        stats.largest_gap = max(stats.largest_gap, p.at - prev)
        prev = p.at
        second = int(p.at)
        bins[second] = bins.get(second, 0) + 1
        peak = max(peak, bins[second])
        if len(bins) > 4:  # only the current second matters; keep the dict tiny
            bins = {second: bins[second]}
    stats.duration = prev
    stats.mean_rate = stats.requests / prev if prev > 0 else float(stats.requests)
    stats.peak_rate = float(peak)
    stats.out_of_order = plan.out_of_order
    stats.untimed = plan.untimed
    return stats
