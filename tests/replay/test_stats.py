"""Latency columns: numpy-style percentiles, exact below the cap, 0.1% above, bounded memory."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replay.stats import EXACT_CAP, Column


def _numpy_percentile(values: list[float], q: float) -> float:
    """numpy's default ('linear') method, written out."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def test_small_columns_are_exact() -> None:
    col = Column()
    col.extend([1.0, 2.0, 3.0, 4.0])
    assert col.quantiles([0, 50, 95, 100]) == pytest.approx([1.0, 2.5, 3.85, 4.0])
    assert col.mean == 2.5
    assert Column().quantiles([50]) == [None] and Column().mean is None


@given(st.lists(st.floats(0.0001, 100.0), min_size=1, max_size=300), st.floats(0, 100))
def test_exact_matches_numpy(values: list[float], q: float) -> None:
    col = Column()
    col.extend(values)
    assert col.quantiles([q])[0] == pytest.approx(_numpy_percentile(values, q))


def test_past_the_cap_within_a_tenth_of_a_percent_and_bounded() -> None:
    rng = random.Random(1)
    values = [rng.lognormvariate(-3, 1.2) for _ in range(3 * EXACT_CAP)]
    col = Column()
    col.extend(values)
    assert col._exact is None  # folded into buckets
    assert len(col._buckets) < 15_000  # bounded by the value range, not the count
    for q in (1, 25, 50, 90, 95, 99, 99.9):
        assert col.quantiles([q])[0] == pytest.approx(_numpy_percentile(values, q), rel=1.5e-3)
    assert col.quantiles([0, 100]) == [min(values), max(values)]
    assert col.mean == pytest.approx(sum(values) / len(values), rel=1e-12)
    spread = col.spread(50)
    assert len(spread) == 50 and spread == sorted(spread)


def test_negative_jitter_lands_in_the_first_bucket() -> None:
    col = Column()
    col.extend([-0.0001] + [0.001] * (EXACT_CAP + 5))
    assert col.quantiles([0])[0] == -0.0001
    assert col.quantiles([50])[0] == pytest.approx(0.001, rel=1e-3)
