"""Backend state: in-flight accounting, passive ejection with cooldown, probes, aliases."""

from __future__ import annotations

from policies.types import EngineLoad, RequestInfo
from router.backends.pool import Pool
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
    assert p.candidates("alias") == []
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
