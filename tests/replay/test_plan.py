"""The schedule: speed, gap caps, windows, reordering, shards, rates, dry-run figures."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.plan import Plan, PlanOptions, dry_run
from replay.sources import Item
from turnout.common.capture import CaptureRecord


def _items(offsets_ms: list[float | None]) -> list[Item]:
    return [
        Item(n, CaptureRecord(f"r{n}", "/v1/completions", {}, t_offset_ms=t))
        for n, t in enumerate(offsets_ms)
    ]


def _at(offsets: list[float | None], **kw: object) -> list[float]:
    return [p.at for p in Plan(_items(offsets), PlanOptions(**kw))]  # type: ignore[arg-type]


def test_speed_divides_offsets() -> None:
    assert _at([0, 1000, 3000], speed=2.0) == [0.0, 0.5, 1.5]


def test_max_gap_caps_idle_time_and_keeps_the_rest() -> None:
    assert _at([0, 100, 10_100, 10_200, 40_000], max_gap=1.0) == pytest.approx(
        [0.0, 0.1, 1.1, 1.2, 2.2]
    )


def test_window_keeps_and_rebases() -> None:
    assert _at([0, 1000, 2000, 3000, 4000], window=(1.0, 3.0)) == [0.0, 1.0]
    assert _at([0, 1000, 2000], window=(1.5, None)) == [0.5]


def test_out_of_order_rows_are_sorted_and_counted() -> None:
    plan = Plan(_items([0, 2000, 1000, 3000]), PlanOptions())
    assert [p.item.record.custom_id for p in plan] == ["r0", "r2", "r1", "r3"]
    assert plan.out_of_order == 1


def test_max_requests_and_rate_for_untimed_rows() -> None:
    assert _at([None] * 5, rate=4.0, max_requests=3) == [0.0, 0.25, 0.5]
    assert _at([None] * 3) == [0.0, 0.0, 0.0]


@given(st.lists(st.floats(0, 1e6), max_size=60), st.integers(2, 5))
def test_shards_partition_the_trace(offsets: list[float], n: int) -> None:
    items = _items(sorted(offsets))  # type: ignore[arg-type]
    whole = [(p.at, p.item.row) for p in Plan(items, PlanOptions())]
    parts = [(p.at, p.item.row) for i in range(n) for p in Plan(items, PlanOptions(shard=(i, n)))]
    assert sorted(parts) == sorted(whole)  # every request once, at the same time


def test_dry_run_figures() -> None:
    stats = dry_run(Plan(_items([0, 100, 200, 300, 5000, 900, 5100]), PlanOptions()))
    assert stats.requests == 7 and stats.out_of_order == 1
    assert stats.duration == pytest.approx(5.1)
    assert stats.largest_gap == pytest.approx(4.1)
    assert stats.peak_rate == 5.0
    assert stats.mean_rate == pytest.approx(7 / 5.1)


def test_bad_options() -> None:
    with pytest.raises(ValueError):
        Plan([], PlanOptions(speed=0))
    with pytest.raises(ValueError):
        Plan([], PlanOptions(shard=(3, 3)))
