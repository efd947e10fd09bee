"""The batch window's AIMD on the interactive TTFT (router.batch.pacing), step by step."""

from __future__ import annotations

import pytest

from router.batch import pacing
from router.batch.pacing import Pacer
from router.config.batch import BatchSettings

SETTINGS = BatchSettings(max_concurrency=20, min_concurrency=2, initial_concurrency=4, headroom=0.5)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr("router.batch.pacing.time.monotonic", lambda: now[0])
    return now


def step(pacer: Pacer, clock: list[float], wanting: bool = True) -> int:
    clock[0] += pacing.PERIOD
    pacer.adjust(wanting)
    return pacer.window


def test_without_an_slo_the_window_is_the_budget(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, None)
    assert pacer.window == 20
    pacer.observe("batch", "vllm", None, "overloaded")
    assert step(pacer, clock) == 20


def test_doubles_then_grows_by_a_tenth_while_interactive_ttft_holds(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, slo_ttft=1.0)
    assert pacer.window == 4
    pacer.observe("batch", "vllm", 9.0, "ok")
    for _ in range(10):
        pacer.observe("interactive", "vllm", 0.2, "ok")  # under headroom x SLO = 0.5 s
    assert [step(pacer, clock) for _ in range(3)] == [8, 16, 20]  # slow start, to the ceiling
    pacer.observe("batch", "vllm", None, "overloaded")  # the first decrease ends the slow start
    assert step(pacer, clock) == 10
    assert [step(pacer, clock) for _ in range(3)] == [11, 12, 13]
    assert step(pacer, clock, wanting=False) == 13  # nothing waiting: no reason to grow
    assert max(step(pacer, clock) for _ in range(60)) == 20  # never past the ceiling


def test_halves_when_interactive_p95_passes_the_target(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, slo_ttft=1.0)
    pacer.limit = 16.0
    pacer.observe("batch", "vllm", 30.0, "ok")  # the batch shares vllm (its TTFT does not count)
    for ttft in [0.1] * 18 + [0.9, 0.9]:  # P95 of 20 samples: the 19th, 0.9 s > 0.5 s
        pacer.observe("interactive", "vllm", ttft, "ok")
    assert step(pacer, clock) == 8
    assert step(pacer, clock) == 4
    assert step(pacer, clock) == 2
    assert step(pacer, clock) == 2  # never under the floor
    clock[0] += pacing.WINDOW  # the slow answers age out of the window: growth resumes
    assert step(pacer, clock) == 3  # additively: the slow start ended at the first halving


def test_only_interactive_requests_on_backends_the_batch_uses_count(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, slo_ttft=1.0)
    pacer.observe("batch", "deepinfer", 9.0, "ok")
    for _ in range(20):
        pacer.observe("interactive", "vllm", 3.0, "ok")  # slow, but not where the batch runs
    assert step(pacer, clock) == 8
    pacer.observe("batch", "vllm", 9.0, "ok")  # now the batch shares vllm: the same TTFTs count
    assert step(pacer, clock) == 4


def test_a_lagging_router_halves_when_interactive_misses_anywhere(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, slo_ttft=1.0)  # target 0.5 s; the router is a suspect past 50 ms
    pacer.observe("batch", "deepinfer", 9.0, "ok")
    for _ in range(20):
        pacer.observe("interactive", "vllm", 3.0, "ok")  # slow on a pool the batch does not use
    pacer.lag(0.2)
    assert step(pacer, clock) == 2  # the loop lags and interactive misses: halve
    pacer.lag(0.01)
    assert step(pacer, clock) == 3  # no lag to speak of: vllm's slowness is its own
    fast = Pacer(SETTINGS, slo_ttft=1.0)
    for _ in range(20):
        fast.observe("interactive", "vllm", 0.1, "ok")
    fast.lag(0.2)
    assert step(fast, clock) == 8  # lag, but interactive meets its target: no reason


def test_few_samples_are_no_signal_and_refusals_halve(clock: list[float]) -> None:
    pacer = Pacer(SETTINGS, slo_ttft=1.0)
    pacer.observe("batch", "vllm", 9.0, "ok")
    for _ in range(pacing.MIN_SAMPLES - 1):
        pacer.observe("interactive", "vllm", 5.0, "ok")
    assert step(pacer, clock) == 8
    pacer.observe("batch", "vllm", None, "no_backend")
    assert step(pacer, clock) == 4


def test_what_the_service_fails_halves_what_a_tenant_did_does_not(clock: list[float]) -> None:
    """A batch request refused for its tenant's own quota (or its own bad body) says nothing
    of the engines: the window stays. One the service failed (the pool full, no backend, an
    engine's error) is pressure: it halves. Interactive failures are the TTFT's business."""
    pacer = Pacer(SETTINGS, slo_ttft=1.0)
    pacer.limit = 16.0
    for reason in ("quota", "invalid", "upstream_rejected", "too_large", "client_closed"):
        pacer.observe("batch", "none", None, reason)
    pacer.observe("interactive", "none", None, "overloaded")
    assert step(pacer, clock) == 20  # still growing (slow start), not halved
    for reason, window in (("overloaded", 10), ("no_backend", 5), ("upstream_error", 2)):
        pacer.observe("batch", "deepinfer", None, reason)
        assert step(pacer, clock) == window
