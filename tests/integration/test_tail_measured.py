"""Tail defences that follow measured TTFTs, over loopback with real router and emulators:
``first_token_timeout: auto`` and ``hedge: {after: pNN}``.

Both emulators answer at once; ``a`` (ranked first for the interactive class) is told to
stall one request's first token by its ``X-Emulator-Fault`` header, which the router forwards
to ``a`` only. A fresh router has measured nothing: ``auto`` is then its ceiling and a ``pNN``
hedge does not fire; after 20 quick answers from ``a`` both follow what was measured.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.control.tailstate import MIN_SAMPLES
from tests.procs import Process, metric, start_emulator
from tests.router.harness import base_config, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
STALL = 3.0
FAULT = {"X-Emulator-Fault": f"first_token_stall={STALL}"}


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Process, Process]]:
    with start_emulator("vllm") as a, start_emulator("vllm") as b:
        yield a, b


def _router(tmp_path: Path, engines: tuple[Process, Process], tail: dict[str, Any]) -> Any:
    a, b = engines
    doc = base_config([("a", "vllm", a.url), ("b", "vllm", b.url)])
    doc["backends"][0]["forward_headers"] = ["X-Emulator-Fault"]
    doc["tail"] = {"interactive": tail}
    return start_router(write_config(tmp_path, doc))


def _ask(router: Process, headers: dict[str, str] | None = None) -> tuple[Any, float]:
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": "Measure me."}],
        "max_tokens": 4, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    start = time.monotonic()
    reply = post(router.url + "/v1/chat/completions", body, headers or {})
    assert reply.status == 200 and reply.content.endswith(b"data: [DONE]\n\n")
    return reply, time.monotonic() - start


def _measure(router: Process) -> None:
    """Twenty quick answers from ``a``: enough for its P99 and percentiles."""
    for _ in range(MIN_SAMPLES):
        reply, _ = _ask(router)
        assert reply.headers["x-turnout-backend"] == "a"


AUTO = {"first_token_timeout": "auto", "auto_multiple": 3.0, "auto_min": 0.3, "auto_max": 30.0}


def test_auto_waits_out_a_stall_before_anything_is_measured(
    tmp_path: Path, engines: tuple[Process, Process]
) -> None:
    with _router(tmp_path, engines, AUTO) as router:
        reply, took = _ask(router, FAULT)
        assert reply.headers["x-turnout-backend"] == "a"  # the ceiling (30 s) was not reached
        assert took >= STALL
        assert metric(router.url, "turnout_first_token_deadlines_missed_total") == 0


def test_auto_cuts_a_stall_at_a_multiple_of_the_measured_p99(
    tmp_path: Path, engines: tuple[Process, Process]
) -> None:
    with _router(tmp_path, engines, AUTO) as router:
        _measure(router)
        reply, took = _ask(router, FAULT)
        assert reply.headers["x-turnout-backend"] == "b"
        assert reply.headers["x-turnout-attempts"] == "2"
        assert took < STALL  # cut near auto_min (0.3 s), well before the stall ends
        missed = metric(router.url, "turnout_first_token_deadlines_missed_total", {"backend": "a"})
        assert missed == 1


PNN = {"hedge": {"after": "p90", "max_fraction": 1.0}}


def test_a_percentile_hedge_fires_only_once_ttfts_were_measured(
    tmp_path: Path, engines: tuple[Process, Process]
) -> None:
    with _router(tmp_path, engines, PNN) as router:
        reply, took = _ask(router, FAULT)  # nothing measured: no hedge, a's stall waited out
        assert reply.headers["x-turnout-backend"] == "a" and took >= STALL
        assert metric(router.url, "turnout_hedges_total") == 0
    with _router(tmp_path, engines, PNN) as router:
        _measure(router)
        assert metric(router.url, "turnout_hedges_total") == 0
        reply, took = _ask(router, FAULT)
        assert reply.headers["x-turnout-backend"] == "b" and took < STALL
        assert metric(router.url, "turnout_hedges_won_total", {"backend": "b"}) == 1
        assert metric(router.url, "turnout_hedges_cancelled_total", {"backend": "a"}) == 1
