"""The ``tail`` section and what the tail defences remember: budgets and TTFT windows."""

from __future__ import annotations

import pytest

from router.config.parse import parse_config
from router.config.tail import HedgeSettings, TailSettings
from router.control.tailstate import MIN_SAMPLES, HedgeBudget, TailMemory
from tests.router.harness import base_config
from tests.router.test_config import errors_of

GOOD = base_config([("a", "vllm", "http://127.0.0.1:1"), ("b", "vllm", "http://127.0.0.1:2")])


def test_the_section_parses_seconds_auto_and_percentiles() -> None:
    tail = {
        "interactive": {"first_token_timeout": "auto", "auto_max": 4,
                        "hedge": {"after": "p95", "max_fraction": 0.1, "max_prompt_tokens": 900}},
        "batch": {"first_token_timeout": 30},
    }  # fmt: skip
    config = parse_config(dict(GOOD, tail=tail))
    i, b = config.tail["interactive"], config.tail["batch"]
    assert i.auto and i.first_token_timeout is None and i.auto_max == 4
    assert i.hedge == HedgeSettings(None, 95.0, 0.1, 900)
    assert b == TailSettings(first_token_timeout=30.0)


def test_every_error_comes_with_its_path() -> None:
    tail = {
        "interactive": {"first_token_timeout": "soon", "last_attempt_grace": 0.5,
                        "hedge": {"after": "p100", "max_fraction": 2, "typo": 1}},
        "interactve": {},
    }  # fmt: skip
    errors = errors_of(dict(GOOD, tail=tail))
    assert errors["tail.interactive.first_token_timeout"] == "expected seconds or auto, got string"
    assert "below the minimum" in errors["tail.interactive.last_attempt_grace"]
    assert "percentile" in errors["tail.interactive.hedge.after"]
    assert "above the maximum" in errors["tail.interactive.hedge.max_fraction"]
    assert "unknown key 'typo'" in errors["tail.interactive.hedge.typo"]
    assert "did you mean 'interactive'" in errors["tail.interactve"]


def test_the_budget_is_a_share_of_requests_and_empties_while_queueing() -> None:
    budget = HedgeBudget(0.25)
    spent = []
    for _ in range(12):
        budget.earn()
        spent.append(budget.spend(queueing=False))
    assert spent.count(True) == 3 and spent[3] and spent[7] and spent[11]
    for _ in range(3):
        budget.earn()
    assert not budget.spend(queueing=True)
    budget.earn()  # from zero again: one request's worth is not a hedge
    assert not budget.spend(queueing=False)


def test_the_bucket_holds_at_most_a_hundred_requests_worth() -> None:
    budget = HedgeBudget(0.05)
    for _ in range(10_000):
        budget.earn()
    assert sum(budget.spend(queueing=False) for _ in range(10)) == 5


def test_auto_deadlines_follow_the_p99_within_bounds() -> None:
    memory = TailMemory()
    tail = TailSettings(auto=True, auto_multiple=3.0, auto_min=0.5, auto_max=10.0)
    assert memory.deadline(tail, "interactive", "a") == 10.0  # nothing measured yet
    window = memory.window("interactive", "a")
    for i in range(MIN_SAMPLES * 5):
        window.add(0.1 + (0.9 if i % 50 == 0 else 0.0))  # 2% at 1.0 s, the rest at 0.1 s
    assert memory.deadline(tail, "interactive", "a") == pytest.approx(3.0)
    assert memory.deadline(tail, "interactive", "b") == 10.0  # per backend
    fast = memory.window("interactive", "c")
    for _ in range(MIN_SAMPLES):
        fast.add(0.01)
    assert memory.deadline(tail, "interactive", "c") == 0.5


def test_a_percentile_hedge_waits_for_measurements() -> None:
    memory = TailMemory()
    tail = TailSettings(hedge=HedgeSettings(after=None, after_quantile=90.0))
    assert memory.hedge_delay(tail, "interactive", "a") is None
    window = memory.window("interactive", "a")
    for i in range(100):
        window.add(i / 100)
    assert memory.hedge_delay(tail, "interactive", "a") == pytest.approx(0.89)
