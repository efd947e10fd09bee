"""The tail defences' decisions (router.control.race), stepped by hand on a made-up clock: the
one core both the live router and ``replay simulate`` drive."""

from __future__ import annotations

import pytest

from policies.types import EngineLoad, RequestInfo
from router.backends.pool import Pool
from router.config.model import BackendSpec, HealthSettings
from router.config.tail import HedgeSettings, TailSettings
from router.control.plan import Attempt
from router.control.race import Race, queueing
from router.control.tailstate import MIN_SAMPLES, TailMemory

CLS = "interactive"


def _pool(n: int = 3, max_inflight: int | None = None) -> Pool:
    specs = [
        BackendSpec(f"b{i}", "vllm", f"http://h:{i + 1}", max_inflight=max_inflight)
        for i in range(n)
    ]
    return Pool(specs, {}, HealthSettings(), lambda: 0.0)


def _ranking(pool: Pool) -> list[Attempt]:
    return [Attempt(b, "m") for b in pool.by_name.values()]


def _race(
    tail: TailSettings,
    rest: list[Attempt],
    memory: TailMemory | None = None,
    busy: bool = False,
    prompt: int = 100,
) -> Race[str, Attempt]:
    return Race(tail, memory or TailMemory(), CLS, prompt, rest, lambda a: busy, 60.0)


def test_a_missed_deadline_fails_over_and_counts_once_another_backend_served() -> None:
    targets = _ranking(_pool())
    race = _race(TailSettings(first_token_timeout=1.0), targets[1:])
    first = race.start("a0", "b0", 10.0)
    assert race.next_timer() == 11.0
    assert race.due(10.9).open is None  # not yet
    moves = race.due(11.0)
    assert moves.cut == [] and moves.open == targets[1:] and not moves.hedge
    assert first.late and race.opening
    moves = race.opened("a1", targets[1], 11.01, failovers=0, stream=True)
    assert moves.cut == [(first, True)]  # cut once the failover answered its head
    assert race.rest == targets[2:] and race.attempts == 2
    second = race.live[0]
    won = race.content(second, 11.05)
    assert won.winner is second and won.blame == [first] and won.cut == []


def test_a_failover_that_finds_no_backend_leaves_the_late_attempt_graced() -> None:
    targets = _ranking(_pool(2))
    race = _race(TailSettings(first_token_timeout=1.0, last_attempt_grace=3.0), targets[1:])
    first = race.start("a0", "b0", 0.0)
    race.due(1.0)
    race.open_failed()
    assert not first.late
    moves = race.due(1.0)
    assert moves.winner is None and moves.cut == [] and first.graced and first.deadline == 3.0


def test_the_last_attempt_is_never_cut_and_wins_past_its_grace() -> None:
    race = _race(TailSettings(first_token_timeout=0.5, last_attempt_grace=4.0), [])
    first = race.start("a0", "b0", 0.0)
    moves = race.due(0.5)
    assert moves.cut == [] and moves.open is None and moves.winner is None
    assert race.next_timer() == 2.0
    moves = race.due(2.0)
    assert moves.winner is first and moves.cut == []  # let through: never a 504


def test_no_failover_to_a_backend_that_queues() -> None:
    targets = _ranking(_pool())
    race = _race(TailSettings(first_token_timeout=1.0), targets[1:], busy=True)
    first = race.start("a0", "b0", 0.0)
    moves = race.due(1.0)
    assert moves.open is None and first.graced  # treated as the last attempt


def test_queueing_reads_the_class_queue_the_cap_and_the_engines_waiting() -> None:
    pool = _pool(1, max_inflight=1)
    b = pool.by_name["b0"]
    assert not queueing(b, 0)
    assert queueing(b, 1)  # requests of the class wait for admission
    b.set_load(EngineLoad(waiting=2.0, running=4.0))
    assert queueing(b, 0)
    b.set_load(EngineLoad(waiting=0.0, running=4.0))
    lease = b.lease(RequestInfo("r", "chat", "m", "interactive", stream=True, prompt_tokens=10))
    assert queueing(b, 0)  # at its max_inflight
    lease.release()
    assert not queueing(b, 0)


def test_a_hedge_goes_after_its_delay_and_the_first_content_wins() -> None:
    targets = _ranking(_pool())
    tail = TailSettings(hedge=HedgeSettings(after=0.3, max_fraction=1.0))
    race = _race(tail, targets[1:], prompt=40)
    first = race.start("a0", "b0", 0.0)
    assert race.next_timer() == pytest.approx(0.3)
    moves = race.due(0.3)
    assert moves.open == targets[1:] and moves.hedge and race.hedged
    race.opened("a1", targets[1], 0.31, failovers=0, stream=True)
    copy = race.live[1]
    assert copy.hedge and len(race.live) == 2
    won = race.content(copy, 0.35)
    assert won.winner is copy and won.cut == [(first, False)] and won.blame == []
    assert race.wasted(0) == 40 and race.wasted(3) == 43  # its prompt, and what it streamed


def test_the_original_may_still_win_a_hedged_race() -> None:
    targets = _ranking(_pool())
    race = _race(TailSettings(hedge=HedgeSettings(after=0.3, max_fraction=1.0)), targets[1:])
    first = race.start("a0", "b0", 0.0)
    race.due(0.3)
    race.opened("a1", targets[1], 0.31, failovers=0, stream=True)
    copy = race.live[1]
    won = race.content(first, 0.4)
    assert won.winner is first and not first.hedge and won.cut == [(copy, False)]


def test_no_hedge_while_queueing_and_the_budget_empties() -> None:
    targets = _ranking(_pool())
    memory = TailMemory()
    tail = TailSettings(hedge=HedgeSettings(after=0.1, max_fraction=0.5))
    for _ in range(3):  # one and a half hedges earned
        _race(tail, targets[1:], memory).start("x", "b0", 0.0)
    race = _race(tail, targets[1:], memory, busy=True)
    race.start("a0", "b0", 0.0)
    moves = race.due(0.1)
    assert moves.open is None and not race.hedged
    assert memory.budget(CLS, 0.5).tokens == 0.0  # collapsed: it refills from zero


def test_a_long_prompt_is_never_hedged() -> None:
    targets = _ranking(_pool())
    tail = TailSettings(hedge=HedgeSettings(after=0.1, max_fraction=1.0, max_prompt_tokens=50))
    race = _race(tail, targets[1:], prompt=51)
    race.start("a0", "b0", 0.0)
    assert race.next_timer() == 60.0  # only the hold bound
    assert race.due(0.1).open is None and not race.hedged
    short = _race(tail, targets[1:], prompt=50)
    short.start("a0", "b0", 0.0)
    assert short.next_timer() == pytest.approx(0.1)


def test_auto_deadlines_follow_what_the_races_measured() -> None:
    targets = _ranking(_pool())
    memory = TailMemory()
    tail = TailSettings(auto=True, auto_multiple=3.0, auto_min=0.2, auto_max=8.0)
    first = _race(tail, targets[1:], memory).start("a", "b0", 0.0)
    assert first.deadline == 8.0  # nothing measured: the ceiling
    for i in range(MIN_SAMPLES):
        race = _race(tail, targets[1:], memory)
        a = race.start(f"a{i}", "b0", 100.0 * i)
        race.content(a, 100.0 * i + 0.25)  # each race's winner measures its TTFT
    race = _race(tail, targets[1:], memory)
    assert race.start("a", "b0", 5.0).deadline == pytest.approx(5.0 + 0.75)
    assert race.start("b", "b1", 5.0).deadline == 13.0  # per backend


def test_a_percentile_hedge_waits_for_measurements_then_follows_them() -> None:
    targets = _ranking(_pool())
    memory = TailMemory()
    tail = TailSettings(hedge=HedgeSettings(after=None, after_quantile=90.0, max_fraction=1.0))
    race = _race(tail, targets[1:], memory)
    race.start("a", "b0", 0.0)
    assert race.next_timer() == 60.0  # no hedge before MIN_SAMPLES: only the hold bound
    for i in range(100):
        r = _race(tail, targets[1:], memory)
        a = r.start(f"a{i}", "b0", 0.0)
        r.content(a, (i + 1) / 100)
    race = _race(tail, targets[1:], memory)
    race.start("a", "b0", 1.0)
    assert race.next_timer() == pytest.approx(1.0 + 0.90)


def test_an_answer_not_to_be_held_wins_unless_it_broke_beside_another() -> None:
    targets = _ranking(_pool())
    race = _race(TailSettings(hedge=HedgeSettings(after=0.1, max_fraction=1.0)), targets[1:])
    first = race.start("a0", "b0", 0.0)
    race.due(0.1)
    race.opened("a1", targets[1], 0.1, failovers=0, stream=True)
    moves = race.ended(first, broke=True)
    assert moves.winner is None and moves.cut == [(first, False)]
    copy = race.live[0]
    assert race.ended(copy, broke=True).winner is copy  # the last one goes to the client as it is
