"""The descriptor budget a worker sizes its connection cap in, and the cap's log: once a run
of refusals, not once a refused connection. (Over a real router with a low limit:
tests/integration/test_hardening_descriptors.py.)"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from router.config.parse import parse_config
from router.server.descriptors import (
    BACKLOG,
    PER_BACKEND,
    PER_BATCH_LINE,
    SLACK,
    connection_budget,
    open_descriptors,
    reserved,
)
from router.server.site import Cap
from tests.router.harness import base_config

ONE = base_config([("a", "vllm", "http://127.0.0.1:1")])


def test_a_common_soft_limit_lowers_the_cap_below_half_of_what_is_left() -> None:
    config = parse_config(ONE)
    budget = connection_budget(config, open_now=20, soft=1024)
    left = 1024 - 20 - (SLACK + PER_BACKEND)
    assert budget.backlog == left // 4  # a burst accepted at once fits beside a full site
    # Each connection may hold its upstream socket too.
    assert budget.max_connections == (left - budget.backlog) // 2
    assert 2 * budget.max_connections + budget.backlog <= left
    assert budget.lowered(config.limits.max_connections)


def test_plenty_of_descriptors_keep_the_configured_cap_and_backlog() -> None:
    config = parse_config(ONE)
    budget = connection_budget(config, open_now=20, soft=1 << 20)
    assert (budget.max_connections, budget.backlog) == (10000, BACKLOG)
    assert not budget.lowered(10000)


def test_mirrors_and_batch_lines_are_kept_aside() -> None:
    plain: dict[str, Any] = base_config(
        [("a", "vllm", "http://127.0.0.1:1"), ("b", "vllm", "http://127.0.0.1:2")]
    )
    doc = dict(
        plain,
        shadow={"class-split": {"backend": "b", "max_concurrency": 10}},
        batch={"max_concurrency": 8},
    )
    assert reserved(parse_config(plain)) == SLACK + 2 * PER_BACKEND
    assert reserved(parse_config(doc)) > reserved(parse_config(plain)) + 10 + PER_BATCH_LINE * 8


def test_no_room_still_leaves_one_connection() -> None:
    budget = connection_budget(parse_config(ONE), open_now=100, soft=64)
    assert (budget.max_connections, budget.backlog) == (1, 1)


def test_open_descriptors_counts_this_process() -> None:
    before = open_descriptors()
    with open(__file__, "rb"):
        assert open_descriptors() == before + 1


def test_a_run_of_refusals_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    refused: list[int] = []
    cap = Cap(10, on_refused=lambda: refused.append(1))
    with caplog.at_level(logging.INFO, logger="router"):
        assert not cap.full(9)
        assert all(cap.full(10) for _ in range(50))
        assert not cap.full(9)  # one slot free: let in, but the run goes on
        assert cap.full(10)
        assert not cap.full(8)  # more than a tenth free again: the run is over
        assert cap.full(10)  # a new run
    messages = [r.getMessage() for r in caplog.records]
    assert len(refused) == 52
    assert [m.split(":")[0] for m in messages] == [
        "connection limit of 10 reached",
        "accepting connections again",
        "connection limit of 10 reached",
    ]
    assert "51 refused" in messages[1]
