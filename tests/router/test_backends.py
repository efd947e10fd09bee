"""Backend state: in-flight accounting, passive ejection with cooldown and its cap, probes,
aliases, panic mode."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from policies.types import EngineLoad, RequestInfo
from router.backends.pool import BackendState, Pool
from router.config.model import BackendSpec, HealthSettings

HEALTH = HealthSettings(failures_to_eject=2, cooldown=10.0)


class FakeClock:
    """A hand-advanced monotonic clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pool(clock: FakeClock) -> Pool:
    specs = [
        BackendSpec("a", "vllm", "http://h:1", models=("m1",)),
        BackendSpec("b", "deepinfer", "http://h:2"),
    ]
    return Pool(specs, {"alias": {"a": "m1"}}, HEALTH, clock)


def test_passive_ejection_and_cooldown() -> None:
    clock = FakeClock()
    a = pool(clock).by_name["a"]
    req = RequestInfo("r", "chat", "m1", "interactive", prompt_tokens=1)

    def attempt(ok: bool) -> None:
        lease = a.lease(req)
        lease.release()
        lease.ok() if ok else lease.failed()

    attempt(False)
    assert a.healthy
    attempt(True)
    attempt(False)
    assert a.healthy  # a success in between resets the run
    attempt(False)
    assert not a.healthy
    clock.now += 9.9
    assert not a.healthy
    clock.now += 0.2
    assert a.healthy


def test_probe_failures_mark_down_and_one_success_up() -> None:
    a = pool(FakeClock()).by_name["a"]
    a.probe_result(False)
    assert a.healthy
    a.probe_result(False)
    assert not a.healthy
    a.probe_result(True)
    assert a.healthy


def test_inflight_and_outstanding_tokens() -> None:
    a = pool(FakeClock()).by_name["a"]
    req = RequestInfo("r", "chat", "m1", "interactive", prompt_tokens=30, max_tokens=10)
    first, second = a.lease(req), a.lease(req)
    c = a.candidate()
    assert (c.inflight, c.outstanding_prompt_tokens, c.outstanding_output_tokens) == (2, 60, 20)
    first.prefilled()  # its prompt no longer waits for prefill
    first.prefilled()
    assert a.candidate().outstanding_prompt_tokens == 30
    first.release()
    first.release()  # a lease releases once, however often it is told
    c = a.candidate()
    assert (c.inflight, c.outstanding_prompt_tokens, c.outstanding_output_tokens) == (1, 30, 10)
    second.release()
    assert a.candidate().outstanding_tokens == 0 and a.candidate().inflight == 0


def test_models_and_aliases() -> None:
    clock = FakeClock()
    p = pool(clock)
    a, b = p.by_name["a"], p.by_name["b"]
    assert p.upstream_model(a, "m1") == "m1"
    assert p.upstream_model(a, "other") is None
    assert p.upstream_model(b, "other") == "other"  # b lists no models: it takes any
    assert p.upstream_model(b, "alias") is None  # the alias maps only a
    b.discovered_models = ("m2",)
    assert not p.known_model("other")
    assert p.model_ids() == ["alias", "m1", "m2"]
    assert [c.name for c in p.candidates("alias")] == ["a"]
    a.probe_result(False)
    a.probe_result(False)
    assert [c.name for c in p.candidates("m2")] == ["b"]
    assert p.any_healthy()


def test_load_staleness() -> None:
    clock = FakeClock()
    a = pool(clock).by_name["a"]
    a.set_load(EngineLoad(waiting=1, running=2))
    assert a.candidate().load == EngineLoad(waiting=1, running=2, age_s=0.0, stale=False)
    clock.now += HEALTH.scrape_stale_after + 1
    load = a.candidate().load
    assert load is not None and load.stale and load.age_s > HEALTH.scrape_stale_after


def test_first_probe_decides_alone() -> None:
    a = pool(FakeClock()).by_name["a"]
    a.probe_result(False, first=True)
    assert not a.healthy
    a.probe_result(True)
    assert a.healthy


def fail(backend: BackendState, times: int = 1) -> None:
    req = RequestInfo("r", "chat", "m", "interactive", prompt_tokens=1)
    for _ in range(times):
        lease = backend.lease(req)
        lease.release()
        lease.failed()


def flat_pool(clock: FakeClock, n: int, fraction: float = 0.5) -> Pool:
    specs = [BackendSpec(f"b{i}", "vllm", f"http://h:{i}") for i in range(n)]
    return Pool(specs, {}, replace(HEALTH, max_ejected_fraction=fraction), clock)


def test_at_most_the_configured_share_of_backends_is_ejected() -> None:
    clock = FakeClock()
    p = flat_pool(clock, 2)
    b0, b1 = p.backends
    fail(b0, 2)
    assert b0.breaker.state == "open"
    fail(b1, 5)
    assert b1.breaker.state == "closed" and b1.healthy  # a second would pass half of two
    clock.now += HEALTH.cooldown
    lease = b0.lease(RequestInfo("r", "chat", "m", "interactive", prompt_tokens=1))
    lease.ok()  # b0's half-open probe succeeds: b0 is back, so b1 may go
    lease.release()
    fail(b1)
    assert b0.breaker.state == "closed" and b1.breaker.state == "open"


def test_the_cap_rounds_down_and_zero_turns_ejection_off() -> None:
    clock = FakeClock()
    three = flat_pool(clock, 3)
    for b in three.backends:
        fail(b, 2)
    assert [b.breaker.state for b in three.backends] == ["open", "closed", "closed"]
    ten = flat_pool(clock, 10, 0.3)
    for b in ten.backends:
        fail(b, 2)
    assert sum(b.breaker.ejected for b in ten.backends) == 3
    off = flat_pool(clock, 4, 0.0)
    for b in off.backends:
        fail(b, 2)
    assert all(b.healthy for b in off.backends)


def test_panic_mode_offers_every_backend_of_a_model_when_all_are_out() -> None:
    clock = FakeClock()
    panics: list[str] = []
    specs = [
        BackendSpec("a", "vllm", "http://h:1", models=("m1",)),
        BackendSpec("b", "vllm", "http://h:2", models=("m1",)),
        BackendSpec("c", "vllm", "http://h:3", models=("m2",)),
    ]
    p = Pool(specs, {}, HEALTH, clock, on_panic=panics.append)
    a, b, _ = p.backends
    fail(a, 2)  # ejected (one of three is within half)
    assert [x.name for x in p.candidates("m1")] == ["b"] and panics == []
    b.probe_result(False, first=True)  # and b fails its probes: m1 has no healthy backend
    offered = p.candidates("m1")
    assert [(x.name, x.healthy) for x in offered] == [("a", True), ("b", True)]
    assert panics == ["m1"]
    assert [x.name for x in p.candidates("m2")] == ["c"]  # other models are not affected
    assert not p.candidates("m3") and panics == ["m1"]  # no backend serves it: no panic


def test_panic_for_a_name_no_backend_lists_is_counted_as_other() -> None:
    panics: list[str] = []
    p = Pool([BackendSpec("any", "vllm", "http://h:1")], {}, HEALTH, FakeClock(), panics.append)
    p.backends[0].probe_result(False, first=True)
    assert [x.name for x in p.candidates("whatever-a-client-sent")] == ["any"]
    assert panics == ["other"]


def test_each_health_change_is_logged_once_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    a = pool(clock).by_name["a"]
    caplog.set_level(logging.INFO, logger="router")
    problem = "GET http://h:1/health: 503 Service Unavailable"
    for _ in range(5):  # down after two misses, and said so once
        a.probe_result(False, problem=problem)
    a.probe_result(True)
    a.probe_result(True)
    req = RequestInfo("r", "chat", "m1", "interactive", prompt_tokens=1)
    for _ in range(4):  # ejected at the second failure; the rest finds it out already
        lease = a.lease(req)
        lease.release()
        lease.failed()
    clock.now += HEALTH.cooldown
    for _ in range(3):  # the half-open trial brings it back; later successes say nothing
        lease = a.lease(req)
        lease.release()
        lease.ok()
    assert [r.getMessage() for r in caplog.records] == [
        f"backend a is down: 2 health probes in a row failed ({problem})",
        "backend a is up: its health probe passes again",
        "backend a is ejected for 10 s: 2 requests in a row failed",
        "backend a is back in service: a trial request after its ejection succeeded",
    ]
    assert [r.levelno for r in caplog.records] == [
        logging.WARNING, logging.INFO, logging.WARNING, logging.INFO
    ]  # fmt: skip


def test_a_backend_down_at_start_is_logged_at_its_first_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = pool(FakeClock()).by_name["a"]
    caplog.set_level(logging.INFO, logger="router")
    a.probe_result(False, first=True, problem="GET http://h:1/health: 404 Not Found")
    a.probe_result(False, problem="GET http://h:1/health: 404 Not Found")
    assert [r.getMessage() for r in caplog.records] == [
        "backend a is down: its first health probe failed (GET http://h:1/health: 404 Not Found)"
    ]
