"""A cold engine in virtual time: its first prompts are prefilled a few at a time, node-wide."""

from __future__ import annotations

import dataclasses
import random

import pytest

from emulator.model import Engine, Sequence
from emulator.profiles import Profile
from tests.emulator.test_model import MIXED, OVERLAP, drain, seq


def eight_ranks(profile: Profile) -> Profile:
    """Eight ranks prefilling one 1,000-token prompt per step or lane job (about 54 ms in the
    mixed profile, 110 ms in the overlap one; the front end is instantaneous)."""
    return dataclasses.replace(
        profile, ranks=8, rank_assignment="balanced", max_num_batched_tokens=1000
    )


def cold(profile: Profile, concurrency: int = 2) -> Profile:
    return dataclasses.replace(profile, cold_prefills=16, cold_concurrency=concurrency)


def ttft(s: Sequence, sent: float = 0.0) -> float:
    assert s.first_token_at is not None, "no first token"
    return s.first_token_at - sent


def first_tokens(profile: Profile, prompts: int, start: float = 0.0) -> list[float]:
    """Times to the first token of ``prompts`` 1,000-token prompts sent together."""
    engine = Engine(profile)
    sent = [seq(1000, 4) for _ in range(prompts)]
    for s in sent:
        engine.submit(s, start)
    drain(engine)
    return [ttft(s, start) for s in sent]


@pytest.mark.parametrize("base", [MIXED, OVERLAP], ids=["mixed", "overlap"])
def test_a_cold_engine_prefills_its_first_prompts_two_at_a_time(base: Profile) -> None:
    warm = eight_ranks(base)
    unit = min(first_tokens(warm, 1))  # one prefill on an idle rank
    waits = sorted(t / unit for t in first_tokens(cold(warm), 16))
    # Two at a time over the node: 1, 1, 2, 2, ... 8, 8 prefills (a mixed step also decodes
    # the prompts already prefilled on its rank, so later waits run a little longer).
    assert waits == pytest.approx([k for k in range(1, 9) for _ in (0, 1)], rel=0.05)
    # A warm engine spreads the same burst over its eight ranks: at most two prefills each.
    assert max(first_tokens(warm, 16)) / unit == pytest.approx(2, rel=0.05)


def test_the_engine_is_warm_after_its_cold_prefills() -> None:
    engine = Engine(cold(eight_ranks(OVERLAP)))
    first = [seq(1000, 4) for _ in range(16)]
    for s in first:
        engine.submit(s, 0.0)
    drain(engine)
    later = [seq(1000, 4) for _ in range(16)]
    for s in later:
        engine.submit(s, 100.0)
    drain(engine)
    unit = min(ttft(s) for s in first)
    assert max(ttft(s, 100.0) for s in later) / unit == pytest.approx(2, rel=0.05)


def test_the_cold_line_keeps_the_ranks_priority_order() -> None:
    """One rank under priority scheduling: a later urgent prompt still goes first."""
    engine = Engine(cold(dataclasses.replace(MIXED, scheduling_policy="priority")))
    first, slow, urgent = seq(1000, 4), seq(1001, 4, priority=5), seq(1002, 4, priority=-1)
    for t, s in ((0.0, first), (0.001, slow), (0.002, urgent)):
        engine.submit(s, t)
    drain(engine)
    order = sorted((first, slow, urgent), key=ttft)
    assert order == [first, urgent, slow]


def on_rank(rank: int, out: int, avoid: int = 0) -> Sequence:
    """A prompt (of about 1,000 tokens) that the ``hash`` rule sends to ``rank`` of two."""
    prompt = next(p for p in range(1000 + avoid, 2000)
                  if random.Random(p * 31 + out).getrandbits(32) % 2 == rank)  # fmt: skip
    return seq(prompt, out)


def test_cancelled_prompts_give_up_their_place_and_their_turn() -> None:
    engine = Engine(
        cold(dataclasses.replace(OVERLAP, ranks=2, rank_assignment="hash", max_num_seqs=1))
    )
    busy = on_rank(0, 2000)  # holds rank 0's only slot for seconds
    head, behind = on_rank(0, 4, avoid=1), on_rank(1, 4)
    for t, s in ((0.0, busy), (0.5, head), (0.6, behind)):
        engine.submit(s, t)
    drain(engine, until=1.0)
    assert behind.first_token_at is None  # in line behind a prompt its rank cannot take yet
    engine.cancel(head, 1.0)  # the line moves: the prompt behind goes at once
    drain(engine, until=2.0)
    assert behind.first_token_at == pytest.approx(1.0 + 0.010 + behind.prompt_tokens * 100e-6)
    engine.cancel(busy, 2.0)
    engine = Engine(cold(dataclasses.replace(OVERLAP, ranks=2), concurrency=1))
    holding, waiting = seq(1000, 4), seq(1001, 4)
    engine.submit(holding, 0.0)
    engine.submit(waiting, 0.0)
    drain(engine, until=0.01)
    engine.cancel(holding, 0.01)  # the only place comes free
    drain(engine)
    assert waiting.first_token_at == pytest.approx(0.01 + 0.010 + 1001 * 100e-6)


def test_profiles_start_warm_unless_they_say() -> None:
    assert Profile(name="p").cold_prefills == 0
    assert Engine(eight_ranks(OVERLAP)).ranks[0].cold is None
    assert Sequence(10, 1).cold is False
