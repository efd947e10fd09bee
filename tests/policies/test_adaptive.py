"""The adaptive policy on candidate snapshots: pools, spill, priority, SLO feedback, affinity."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from policies.adaptive import AdaptivePolicy
from policies.registry import BackendInfo, PolicyConfigError, build_policy
from policies.spill import SpillGovernor, SpillSettings
from policies.testing import make_candidate, make_request, send
from policies.types import Candidate, Outcome, RequestInfo

# Priors: vllm prefills 40k tokens/s, deepinfer 20k. Interactive TTFT SLO 0.5 s, so with
# headroom 0.5 a spill must leave the next interactive request predicted under 0.25 s.
PARAMS: dict[str, object] = {
    "low_ttft": ["vllm"],
    "high_throughput": ["deepinfer"],
    "slo": {"interactive": {"ttft_s": 0.5, "tpot_s": 0.1}},
    "prefill_rate_prior": {"vllm": 40_000, "deepinfer": 20_000},
    "spill": {
        "max_inflight": 2,
        "initial_inflight": 2,
        "headroom": 0.5,
        "window": 8,
        "min_attainment": 0.9,
    },
}


def build(
    params: Mapping[str, object] = PARAMS, *, capable: bool = True, replicas: int = 1
) -> AdaptivePolicy:
    backends = [
        BackendInfo("vllm" if i == 0 else f"vllm-{i}", "vllm", capable) for i in range(replicas)
    ]
    backends += [BackendInfo("deepinfer", "deepinfer"), BackendInfo("sglang", "sglang")]
    policy = build_policy("adaptive", "adaptive", params, backends)
    assert isinstance(policy, AdaptivePolicy)
    return policy


def snap(
    vllm: int = 0, deepinfer: int = 0, *, capable: bool = True, vllm_inflight: int | None = None
) -> list[Candidate]:
    """vllm and deepinfer with the given prompt tokens open (router-side counts)."""
    if vllm_inflight is None:
        vllm_inflight = 1 if vllm else 0
    return [
        make_candidate(
            "vllm", prompt_tokens=vllm, inflight=vllm_inflight, priority_capable=capable
        ),
        make_candidate("deepinfer", prompt_tokens=deepinfer, inflight=1 if deepinfer else 0),
    ]


def interactive(rid: str = "i", prompt: int = 1000, **kw: object) -> RequestInfo:
    return make_request("interactive", request_id=rid, prompt_tokens=prompt, **kw)  # type: ignore[arg-type]


def batch(rid: str = "b", prompt: int = 8000) -> RequestInfo:
    return make_request("batch", request_id=rid, prompt_tokens=prompt, max_tokens=768, stream=False)


def measured(
    policy: AdaptivePolicy, deepinfer_pace: float = 0.011, vllm_pace: float | None = 0.010
) -> AdaptivePolicy:
    """Feed ``policy`` one finished batch request per engine (seconds per output token end
    to end), so its spill rule has measured finish times to compare (it spills on no prior)."""
    for name, pace in (("deepinfer", deepinfer_pace), ("vllm", vllm_pace)):
        if pace is not None:
            done = batch(f"warm-{name}")
            policy.on_finish(done, name, Outcome(200, True, 8000, 800, e2e_s=pace * 800))
    return policy


@pytest.mark.parametrize(
    ("vllm", "deepinfer", "expected"),
    [
        (0, 0, ("vllm", "deepinfer")),
        (15_000, 0, ("vllm", "deepinfer")),  # 0.4 s predicted: within the SLO, stay
        (40_000, 0, ("deepinfer", "vllm")),  # ~1.03 s > SLO and deepinfer predicts 0.05 s
        (40_000, 100_000, ("vllm", "deepinfer")),  # over SLO, but deepinfer predicts worse
    ],
)
def test_interactive(vllm: int, deepinfer: int, expected: tuple[str, ...]) -> None:
    decision = build().choose(interactive(), snap(vllm, deepinfer))
    assert decision.ranked == expected
    assert decision.priority is None


@pytest.mark.parametrize(
    ("capable", "vllm", "deepinfer", "prompt", "head", "priority"),
    [
        (True, 0, 0, 8000, "deepinfer", None),  # nothing queued on deepinfer: no spill
        (True, 0, 50_000, 8000, "vllm", 10),  # deepinfer queue 2.5 s, vllm idle: spill
        # the next interactive would wait (0 + 2048 + 1000) / 40k: fine
        (True, 0, 50_000, 12_000, "vllm", 10),
        # not priority-capable: it waits behind the whole 12k prompt, (12k + 1k) / 40k > 0.25
        (False, 0, 50_000, 12_000, "deepinfer", None),
        (False, 0, 50_000, 8000, "vllm", None),  # (8k + 1k) / 40k = 0.225: fits, no priority
        # interactive work already queued on vllm leaves no headroom: (7k + 2048 + 1k) / 40k
        (True, 7000, 50_000, 8000, "deepinfer", None),
        # batch would not start sooner on vllm (its queue is longer)
        (True, 60_000, 20_000, 8000, "deepinfer", None),
    ],
)
def test_batch_spill(
    capable: bool, vllm: int, deepinfer: int, prompt: int, head: str, priority: int | None
) -> None:
    policy = measured(build(capable=capable))
    decision = send(policy, batch(prompt=prompt), snap(vllm, deepinfer, capable=capable))
    assert decision.ranked[0] == head
    assert set(decision.ranked) == {"vllm", "deepinfer"}
    assert decision.priority == priority


def test_spill_only_on_measured_finish_times() -> None:
    policy = build({**PARAMS, "tpot_prior_s": {"vllm": 0.001, "deepinfer": 0.05}})
    # the priors say vllm finishes a batch request 50x sooner, but nothing is measured yet
    assert send(policy, batch("b0"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # deepinfer's pace is measured (11 ms per output token end to end: 8.4 s for 768), vllm
    # has no TPOT from a stream yet: still no probe on the prior alone
    measured(policy, vllm_pace=None)
    assert send(policy, batch("b1"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # interactive streams on vllm show 40 ms per token: 0.2 + 768 x 40 ms = 31 s there
    for i in range(30):
        req = interactive(f"i{i}")
        policy.on_finish(
            req, "vllm", Outcome(200, True, prompt_tokens=1000, ttft_s=0.025, tpot_s=0.04)
        )
    assert policy.tpot.tpot("vllm") == pytest.approx(0.04, rel=0.05)
    assert send(policy, batch("b2"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # now 5 ms: 0.2 + 3.8 s beats 8.4 s, so probes go: initial_inflight (2) of them at
    # most until one finishes
    for i in range(60):
        req = interactive(f"j{i}")
        policy.on_finish(
            req, "vllm", Outcome(200, True, prompt_tokens=1000, ttft_s=0.025, tpot_s=0.005)
        )
    assert send(policy, batch("b3"), snap(0, 100_000)).ranked[0] == "vllm"
    cands = snap(8000, 100_000, vllm_inflight=1)
    assert send(policy, batch("b4"), cands).ranked[0] == "vllm"
    cands = snap(16_000, 100_000, vllm_inflight=2)
    assert send(policy, batch("b4b"), cands).ranked[0] == "deepinfer"
    # the probe took 20 ms per token there (slower than deepinfer): no more spills, whatever
    # the streams' TPOT says
    policy.on_finish(batch("b3"), "vllm", Outcome(200, True, 8000, 768, e2e_s=0.02 * 768))
    assert send(policy, batch("b5"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # a measured 8 ms per token there beats deepinfer's 11: spill again, up to the limit
    for _ in range(30):
        policy.on_finish(batch("b6"), "vllm", Outcome(200, True, 8000, 768, e2e_s=0.008 * 768))
    assert send(policy, batch("b7"), snap(0, 100_000)).ranked[0] == "vllm"
    assert send(policy, batch("b8"), snap(8000, 100_000, vllm_inflight=1)).ranked[0] == "vllm"


def test_the_home_pools_measured_queue_earns_a_spill_its_credit() -> None:
    """vllm's measured batch pace is 10% slower than deepinfer's. A spill pays only as far
    as it shortens deepinfer's queue: by the scrape, the share of its requests waiting for
    prefill (q) is the share of their time spent waiting, and the credit is 1 / (1 - q),
    at most pace_margin (1.2 here)."""
    params = {**PARAMS, "spill": {**PARAMS["spill"], "pace_margin": 1.2}}  # type: ignore[dict-item]
    policy = measured(build(params), deepinfer_pace=0.010, vllm_pace=0.011)
    vllm = make_candidate("vllm", prompt_tokens=0, inflight=0, priority_capable=True)

    def home(waiting: float) -> Candidate:
        return make_candidate("deepinfer", prompt_tokens=60_000, inflight=10, waiting=waiting)

    # 1 of 10 waiting: credit 1.11, vllm is 1.10x slower: spill; 0.5 of 10: 1.05, no spill
    assert send(policy, batch("b0"), [vllm, home(0.5)]).ranked[0] == "deepinfer"
    assert send(policy, batch("b0"), [vllm, home(1)]).ranked[0] == "vllm"
    # a whole queue's credit is capped: a vllm 1.25x slower is not worth it
    slow = measured(build(params), deepinfer_pace=0.010, vllm_pace=0.0125)
    assert send(slow, batch("b1"), [vllm, home(9)]).ranked[0] == "deepinfer"
    assert (
        measured(build(params), deepinfer_pace=0.010, vllm_pace=0.0115)
        .choose(batch("b2"), [vllm, home(9)])
        .ranked[0]
        == "vllm"
    )
    # with less than a tenth of deepinfer's time spent queued, the 10% is not made up
    policy = measured(build(params), deepinfer_pace=0.010, vllm_pace=0.011)
    twenty = make_candidate("deepinfer", prompt_tokens=60_000, inflight=20, waiting=1)
    assert send(policy, batch("b3"), [vllm, twenty]).ranked[0] == "deepinfer"


def test_no_spill_while_the_home_pool_has_no_queue() -> None:
    policy = measured(build())
    # the high-throughput engine with idle room of its own takes batch work itself
    params = {**PARAMS, "spill": {"min_high_inflight": 2}}
    assert measured(build(params)).choose(batch("b2"), snap(0, 50_000)).ranked[0] == "deepinfer"
    # a fresh scrape says nothing waits for prefill on deepinfer: no borrowing either
    idle = make_candidate("deepinfer", prompt_tokens=50_000, inflight=6, waiting=0)
    busy = make_candidate("deepinfer", prompt_tokens=50_000, inflight=6, waiting=2)
    vllm = make_candidate("vllm", prompt_tokens=0, inflight=0, priority_capable=True)
    assert send(policy, batch("b0"), [vllm, idle]).ranked[0] == "deepinfer"
    assert send(policy, batch("b1"), [vllm, busy]).ranked[0] == "vllm"


def test_the_home_pools_measured_pace_decides() -> None:
    policy = measured(build())
    assert send(policy, batch("b0"), snap(0, 100_000)).ranked[0] == "vllm"  # 10 ms vs 11
    # deepinfer actually turns batch requests round at 5 ms per output token: 768 x 5 ms = 3.8 s
    for i in range(30):
        done = batch(f"d{i}")
        policy.on_finish(done, "deepinfer", Outcome(200, True, 8000, 800, ttft_s=4.0, e2e_s=4.0))
    assert policy.pace.pace("deepinfer") == pytest.approx(0.005, rel=0.06)
    assert send(policy, batch("b1"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # failed requests, interactive ones and empty outputs say nothing about the batch pace
    before = policy.pace.pace("deepinfer")
    policy.on_finish(batch("x"), "deepinfer", Outcome(502, False, e2e_s=99.0))
    policy.on_finish(interactive("y"), "deepinfer", Outcome(200, True, 1000, 10, e2e_s=99.0))
    policy.on_finish(batch("z"), "deepinfer", Outcome(200, True, 8000, 0, e2e_s=99.0))
    assert policy.pace.pace("deepinfer") == before


def test_spill_disabled() -> None:
    params = {**PARAMS, "spill": {"enabled": False}}
    decision = build(params).choose(batch(), snap(0, 50_000))
    assert decision.ranked == ("deepinfer", "vllm")


def test_spill_slots_are_bounded_and_released_on_finish() -> None:
    policy = measured(build())

    def head(rid: str) -> str:
        # the router's view: every open spilled request is in flight on vllm
        n = policy.spilled("vllm")
        cands = snap(8000 * n, 50_000, vllm_inflight=n)
        return send(policy, batch(rid), cands).ranked[0]

    assert [head(f"b{i}") for i in range(3)] == ["vllm", "vllm", "deepinfer"]  # max_inflight 2
    assert policy.spilled("vllm") == 2
    policy.on_finish(batch("b0"), "vllm", Outcome(200, True, prompt_tokens=8000, ttft_s=0.3))
    assert policy.spilled("vllm") == 1
    assert head("b3") == "vllm"
    # a reused request id does not leak a slot
    policy.on_finish(batch("b1"), "vllm", Outcome(200, True, prompt_tokens=8000, ttft_s=0.3))
    assert head("b3") == "vllm"
    assert policy.spilled("vllm") == 1  # b3 counted once
    for rid in ("b2", "b3"):
        policy.on_finish(batch(rid), "deepinfer", Outcome(200, True))
    assert policy.spilled("vllm") == 0


def test_spill_records_never_outlive_the_routers_inflight_count() -> None:
    policy = measured(build())
    for i in range(2):
        send(policy, batch(f"b{i}"), snap(8000 * i, 50_000, vllm_inflight=i))
    assert policy.spilled("vllm") == 2
    # neither request ever reached vllm (say every target was refused) and on_finish never
    # came: the router shows one request open there, then none
    send(policy, interactive("x"), snap(1000, 0, vllm_inflight=1))
    assert policy.spilled("vllm") == 1
    send(policy, batch("b2"), snap(0, 50_000, vllm_inflight=0))
    assert policy.spilled("vllm") == 1  # the stale ones dropped, b2 spilled anew


def test_interactive_jumps_spilled_batch_only_on_priority_capable_replicas() -> None:
    params = {**PARAMS, "spill": {"max_inflight": 2, "initial_inflight": 2, "headroom": 1.0}}
    for capable, head in ((True, "vllm"), (False, "deepinfer")):
        policy = measured(build(params, capable=capable))
        for i in range(2):
            cands = snap(8000 * i, 50_000, capable=capable, vllm_inflight=i)
            assert send(policy, batch(f"b{i}"), cands).ranked[0] == "vllm"
        # vllm now holds the two spilled prompts (16k); deepinfer drained meanwhile. A 5k
        # interactive prompt: capable, it waits for one 2048-token budget, (2048 + 5k) / 40k
        # = 0.18 s; otherwise for both prompts, (16k + 5k) / 40k = 0.525 s, over the 0.5 s SLO
        # while deepinfer predicts 5k / 20k = 0.25 s
        cands = snap(16_000, 0, capable=capable, vllm_inflight=2)
        decision = send(policy, interactive(prompt=5000), cands)
        assert decision.ranked[0] == head


def test_governor_starts_slow_halves_on_misses_and_recovers() -> None:
    gov = SpillGovernor(SpillSettings(max_inflight=4, window=8, min_attainment=0.9))
    assert gov.allowed == 1
    for _ in range(12):
        gov.record(True)  # +0.25 per met SLO
    assert gov.allowed == 4
    gov.record(True)
    assert gov.allowed == 4  # never above max_inflight
    # a miss: attainment over the window, 7/8, is below 0.9: halve
    gov.record(False)
    assert gov.allowed == 2
    gov.record(False)
    assert gov.allowed == 2  # cooldown after a cut
    gov.record(False)
    assert gov.allowed == 1
    for _ in range(8):
        gov.record(True)  # attainment climbs back to the target over the window
    assert gov.attainment == 1.0
    steps = 0
    while gov.allowed < 4:
        gov.record(True)
        steps += 1
    assert steps <= 12


def test_no_spill_slot_until_interactive_attainment_is_known_to_be_met() -> None:
    gov = SpillGovernor(SpillSettings(max_inflight=0))
    assert gov.allowed == 0
    gov.record(True)
    assert gov.allowed == 0


def test_interactive_misses_on_the_low_pool_stop_the_spill() -> None:
    policy = build()
    late = Outcome(200, True, prompt_tokens=1000, ttft_s=2.0, tpot_s=0.01)
    for i in range(8):
        policy.on_finish(interactive(f"i{i}"), "vllm", late)
    assert policy.governor.allowed == 0
    assert send(policy, batch(), snap(0, 50_000)).ranked[0] == "deepinfer"
    # misses on the other pool say nothing about the spill
    other = build()
    for i in range(8):
        other.on_finish(interactive(f"i{i}"), "deepinfer", late)
    assert other.governor.allowed == 2
    # nor do non-streamed interactive requests: their "TTFT" is the whole response
    for i in range(8):
        other.on_finish(interactive(f"n{i}", stream=False), "vllm", late)
    assert other.governor.allowed == 2


@pytest.mark.parametrize(
    ("outcome", "met"),
    [
        (Outcome(200, True, ttft_s=0.4, tpot_s=0.05), True),
        (Outcome(200, True, ttft_s=0.4), True),
        (Outcome(200, True, ttft_s=0.6, tpot_s=0.05), False),
        (Outcome(200, True, ttft_s=0.4, tpot_s=0.2), False),
        (Outcome(502, False, ttft_s=None), False),
    ],
)
def test_slo_met(outcome: Outcome, met: bool) -> None:
    assert build().settings.slo["interactive"].met(outcome) is met


def test_learning_moves_interactive_off_a_slow_engine() -> None:
    policy = build()
    assert send(policy, interactive("x"), snap(10_000, 0)).ranked[0] == "vllm"
    # vllm turns out to prefill 5k tokens/s, not 40k, one queue: 10k queued + 1k is 2.2 s
    for i in range(40):
        prompt, queued = 1000 + 50 * i, 2000 + 100 * (i % 7)
        req = interactive(f"s{i}", prompt=prompt)
        send(policy, req, snap(queued, 0))
        ttft = (prompt + queued) / 5000
        policy.on_finish(req, "vllm", Outcome(200, True, prompt_tokens=prompt, ttft_s=ttft))
    assert policy.predictor.rate("vllm") == pytest.approx(5000, rel=0.05)
    assert send(policy, interactive("y"), snap(10_000, 0)).ranked[0] == "deepinfer"


def test_what_one_instance_learns_another_is_taught_alike() -> None:
    """Two processes' instances: one serves, the other learns its lessons, and the two end
    with the same estimates and decisions (the spill notes and the error stay the server's)."""
    served, taught = build(), build()
    for i in range(40):
        prompt, queued = 1000 + 50 * i, 2000 + 100 * (i % 7)
        req = interactive(f"s{i}", prompt=prompt)
        send(served, req, snap(queued, 0))
        outcome = Outcome(200, True, prompt, 30, ttft_s=(prompt + queued) / 5000, tpot_s=0.02)
        lesson = served.lesson(req, "vllm", outcome)
        assert lesson is not None and lesson.ahead_tokens == queued
        served.on_finish(req, "vllm", outcome)
        taught.taught(lesson)
    assert taught.predictor.rate("vllm") == pytest.approx(served.predictor.rate("vllm"))
    assert taught.tpot.tpot("vllm") == pytest.approx(served.tpot.tpot("vllm"))
    assert taught.typical_prompt == served.typical_prompt
    assert taught.governor.attainment == served.governor.attainment < 1
    assert send(taught, interactive("y"), snap(10_000, 0)).ranked[0] == "deepinfer"
    assert build().choose(interactive("y"), snap(10_000, 0)).ranked[0] == "vllm"  # untaught
    assert taught.prediction_error() == {} and "vllm" in served.prediction_error()
    assert served.lesson(interactive("z"), "elsewhere", Outcome(200, True)) is None


def test_pools_of_replicas_use_session_affinity_within_the_load_bound() -> None:
    policy = build(replicas=3)

    def cands(loads: tuple[int, int, int]) -> list[Candidate]:
        names = ["vllm", "vllm-1", "vllm-2"]
        return [
            make_candidate(n, "vllm", inflight=x) for n, x in zip(names, loads, strict=True)
        ] + [make_candidate("deepinfer")]

    req = interactive(session_key="user-7")
    first = send(policy, req, cands((0, 0, 0))).ranked
    assert first[-1] == "deepinfer"
    home = first[0]
    assert send(policy, req, cands((1, 1, 1))).ranked[0] == home
    loads = tuple(6 if n == home else 0 for n in ("vllm", "vllm-1", "vllm-2"))
    assert send(policy, req, cands(loads)).ranked[0] != home  # type: ignore[arg-type]
    # without a key: least predicted TTFT (queued prompt tokens) first
    keyless = [
        make_candidate("vllm", prompt_tokens=9000, inflight=3),
        make_candidate("vllm-1", "vllm", prompt_tokens=1000, inflight=1),
        make_candidate("vllm-2", "vllm", prompt_tokens=5000, inflight=2),
    ]
    assert send(policy, interactive(), keyless).ranked == ("vllm-1", "vllm-2", "vllm")


def test_unhealthy_and_unpooled_backends() -> None:
    policy = build()
    cands = [
        make_candidate("sglang"),
        make_candidate("vllm", healthy=False, priority_capable=True),
        make_candidate("deepinfer"),
    ]
    assert send(policy, interactive(), cands).ranked == ("deepinfer", "sglang")
    # only the low-TTFT pool is left for batch: it goes there, marked low priority
    only_vllm = [
        make_candidate("vllm", priority_capable=True),
        make_candidate("deepinfer", healthy=False),
    ]
    decision = send(policy, batch(), only_vllm)
    assert (decision.ranked, decision.priority) == (("vllm",), 10)
    assert send(policy, batch("b2"), [make_candidate("vllm", healthy=False)]).ranked == ()


@pytest.mark.parametrize(
    ("params", "errors"),
    [
        ({}, [("params.low_ttft", "is required"), ("params.high_throughput", "is required")]),
        (
            {
                "low_ttft": ["vllm", "tgi"],
                "high_throughput": ["vllm"],
                "slo": {"interactive": {"ttft_s": 0, "p99": 1}, "bulk": {}},
                "spill": {"enabled": "yes", "headroom": 2, "window": 0, "max_inflight": 1.5},
                "prefill_rate_prior": {"vllm": "fast", "tgi": 1},
                "learning_rate": 0,
                "load_bound": 0.5,
            },
            [
                ("params.low_ttft[1]", "unknown engine 'tgi' (known: vllm, deepinfer, sglang)"),
                ("params.high_throughput", "'vllm' is also listed in low_ttft"),
                ("params.slo.interactive.ttft_s", "0 is below the minimum 0.001"),
                ("params.slo.interactive.p99", "unknown key"),
                ("params.slo.bulk", "unknown key"),
                ("params.spill.enabled", "expected true or false, got string"),
                ("params.spill.headroom", "2 is above the maximum 1"),
                ("params.spill.window", "0 is below the minimum 1"),
                ("params.spill.max_inflight", "expected an integer, got number"),
                ("params.prefill_rate_prior.vllm", "expected a number, got string"),
                ("params.prefill_rate_prior.tgi", "unknown key"),
                ("params.learning_rate", "0 is below the minimum 0.001"),
                ("params.load_bound", "0.5 is below the minimum 1"),
            ],
        ),
    ],
)
def test_config_errors(params: dict[str, object], errors: list[tuple[str, str]]) -> None:
    backends = [
        BackendInfo("vllm", "vllm"),
        BackendInfo("deepinfer", "deepinfer"),
        BackendInfo("sglang", "sglang"),
    ]
    with pytest.raises(PolicyConfigError) as info:
        build_policy("a", "adaptive", params, backends)
    got = sorted(info.value.errors)
    assert [p for p, _ in got] == sorted(p for p, _ in errors), got
    for (_, message), (_, want) in zip(got, sorted(errors), strict=True):
        assert message.startswith(want), message


def test_prefill_prior_as_one_number() -> None:
    policy = build({**PARAMS, "prefill_rate_prior": 12_345})
    assert policy.predictor.rate("vllm") == policy.predictor.rate("deepinfer") == 12_345


def test_pace_margin_credits_the_home_pools_shorter_queue() -> None:
    # vllm measured at 12 ms per output token end to end, deepinfer at 11: vllm is slower
    strict = measured(build(), deepinfer_pace=0.011, vllm_pace=0.012)
    assert send(strict, batch("b0"), snap(0, 100_000)).ranked[0] == "deepinfer"
    # within 1.2x of deepinfer's pace, the spill still pays: deepinfer's queue shortens
    params = {**PARAMS, "spill": {**PARAMS["spill"], "pace_margin": 1.2}}  # type: ignore[dict-item]
    lenient = measured(build(params), deepinfer_pace=0.011, vllm_pace=0.012)
    assert send(lenient, batch("b0"), snap(0, 100_000)).ranked[0] == "vllm"
    # but not beyond it
    far = measured(build(params), deepinfer_pace=0.011, vllm_pace=0.014)
    assert send(far, batch("b0"), snap(0, 100_000)).ranked[0] == "deepinfer"
