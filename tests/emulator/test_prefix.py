"""The prefix cache in virtual time: hits, what they save, eviction under KV pressure."""

from __future__ import annotations

import dataclasses
import random

import pytest

from emulator.kvcache import BlockPool, block_hashes
from emulator.model import Engine, Sequence, State
from emulator.profiles import Profile
from emulator.prompt import chat_ids, output_ids
from emulator.text import output_pieces
from tests.emulator.test_model import MIXED, OVERLAP, drain
from turnout.common.tokens import count_chat


def tokens(n: int, start: int = 10_000) -> tuple[int, ...]:
    return tuple(range(start, start + n))


def seq(prompt: tuple[int, ...], out: int = 2) -> Sequence:
    """A sequence carrying its prompt ids (and made-up output ids)."""
    return Sequence(
        len(prompt), out, rng=random.Random(len(prompt)), tokens=(*prompt, *tokens(out, 1))
    )


def run_one(engine: Engine, s: Sequence, at: float) -> float:
    """Submit ``s`` at ``at`` on an idle engine, run it to the end; its TTFT."""
    engine.submit(s, at)
    drain(engine)
    assert s.state is State.FINISHED and s.first_token_at is not None
    return s.first_token_at - at


def test_a_shared_prefix_hits_and_skips_its_prefill() -> None:
    engine = Engine(MIXED)
    first = seq(tokens(1000))
    cold = run_one(engine, first, 0.0)
    assert first.cached_tokens == 0
    shared = seq(tokens(992) + tokens(8, 50_000))  # 62 full blocks shared, then different
    warm = run_one(engine, shared, 10.0)
    assert shared.cached_tokens == 992
    assert warm == pytest.approx(0.004 + 8 * 50e-6)  # one step over the 8 new tokens
    assert cold == pytest.approx(0.004 + 1000 * 50e-6)
    assert (engine.prefix_cache_queries, engine.prefix_cache_hits) == (2000, 992)


def test_a_repeated_prompt_still_computes_its_last_token() -> None:
    engine = Engine(OVERLAP)
    run_one(engine, seq(tokens(640)), 0.0)
    again = seq(tokens(640))
    ttft = run_one(engine, again, 10.0)
    # 640 tokens are 40 full blocks, but the last must be computed to sample from it.
    assert again.cached_tokens == 39 * 16
    assert ttft == pytest.approx(0.010 + 16 * 100e-6)


def test_only_a_leading_run_of_blocks_hits() -> None:
    engine = Engine(MIXED)
    run_one(engine, seq(tokens(320)), 0.0)
    # Same tokens after a different first block: the hash chain differs from block 0 on.
    other = seq(tokens(16, 70_000) + tokens(304, 10_016))
    run_one(engine, other, 10.0)
    assert other.cached_tokens == 0


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    engine = Engine(MIXED)
    turn = seq(tokens(100), out=60)
    run_one(engine, turn, 0.0)
    # The next turn's prompt: this prompt, this answer, then a new message.
    follow = seq(turn.tokens + tokens(50, 60_000))
    run_one(engine, follow, 10.0)
    assert follow.cached_tokens == (100 + 60 - 1) // 16 * 16


def test_lru_eviction_under_kv_pressure_keeps_held_blocks() -> None:
    # 20 blocks in all: two finished 4-block prompts fill 8 of them with cached content.
    profile: Profile = dataclasses.replace(MIXED, kv_cache_tokens=20 * 16)
    engine = Engine(profile)
    a, b = seq(tokens(64, 1000), out=1), seq(tokens(64, 2000), out=1)
    run_one(engine, a, 0.0)
    run_one(engine, b, 1.0)
    # A long decode holds 4 blocks (3 of them cached) while a newcomer needs 9: the 8 left
    # empty and one cached.
    holder = seq(tokens(48, 3000), out=100)
    engine.submit(holder, 2.0)
    drain(engine, until=2.01)
    assert holder.state is State.RUNNING
    big = seq(tokens(130, 4000), out=1)
    engine.submit(big, 2.01)
    drain(engine, until=2.05)
    assert big.state is State.FINISHED and holder.state is State.RUNNING
    pool = engine.ranks[0].pool
    # a was released first: its tail block went first; b's four are all still cached.
    assert pool.lookup(a.hashes, 4) == (3, 3)
    assert pool.lookup(b.hashes, 4) == (4, 4)
    assert pool.lookup(holder.hashes, 3) == (3, 0)  # held by a running sequence: kept
    drain(engine)


def test_pool_evicts_least_recently_released_first_and_never_held_blocks() -> None:
    pool = BlockPool(6, 16)
    chain: list[int] = []
    block_hashes(tokens(64), 16, chain, 4)
    pool.allocate(4)
    for h in chain:
        assert pool.register(h)
    assert not pool.register(chain[0])  # a second copy of a cached block stays private
    pool.release(0, chain[:2])  # a sequence lets go of blocks 0-1 (1 first, then 0)
    assert pool.free == 4 and pool.cached_blocks() == 4
    pool.allocate(3)  # two empty blocks, then the least recently released: block 1
    assert pool.lookup(chain, 4) == (1, 1)
    pool.touch(chain[:1])  # held again: no longer evictable
    assert pool.free == 0
    pool.release(3, chain[:1])
    assert pool.free == 4


def test_chat_template_matches_the_counting_rule_and_extends_turn_by_turn() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Name, please: one city."},
    ]
    assert len(chat_ids(messages)) == count_chat(messages)
    pieces = output_pieces(random.Random(3), 40)
    answer = {"role": "assistant", "content": "".join(pieces)}
    nxt = chat_ids([*messages, answer, {"role": "user", "content": "Another."}])
    assert nxt[: len(chat_ids(messages)) + 40] == chat_ids(messages) + output_ids(pieces)
