"""The engine model in virtual time: step accounting, queueing, KV limits, both modes."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from emulator.model import Engine, Sequence, State
from emulator.profiles import Profile, load_profile
from emulator.simulate import closed_loop

MIXED = Profile(name="m", scheduling="mixed", step_base_ms=4.0, step_per_prefill_token_us=50.0,
                step_per_decode_seq_ms=0.2, max_num_batched_tokens=1024)  # fmt: skip
OVERLAP = Profile(name="o", scheduling="overlap", step_base_ms=8.0, step_per_decode_seq_ms=0.5,
                  prefill_base_ms=10.0, prefill_per_token_us=100.0)  # fmt: skip


def drain(engine: Engine, until: float = 1e9) -> dict[Sequence, list[tuple[float, int]]]:
    """Run events until idle (or ``until``); return every chunk per sequence as (time, size)."""
    seen: dict[Sequence, list[tuple[float, int]]] = {}
    while (t := engine.next_deadline()) is not None and t <= until:
        for seq in engine.advance(t):
            seen.setdefault(seq, []).extend((t, n) for n in seq.chunks)
            seq.chunks.clear()
    return seen


def seq(prompt: int, out: int, priority: int = 0) -> Sequence:
    return Sequence(prompt, out, priority=priority, rng=random.Random(prompt * 31 + out))


def test_mixed_step_accounting_and_chunked_prefill() -> None:
    engine = Engine(MIXED)
    s = seq(1500, 3)
    engine.submit(s, 0.0)
    chunks = drain(engine)[s]
    # Step 1 prefills 1024 tokens, step 2 the other 476 and samples the first token.
    t1 = 0.004 + 1024 * 50e-6
    t2 = t1 + 0.004 + 476 * 50e-6
    t3 = t2 + 0.004 + 0.0002
    assert [t for t, _ in chunks] == pytest.approx([t2, t3, t3 + 0.0042])
    assert [n for _, n in chunks] == [1, 1, 1]
    assert s.state is State.FINISHED and engine.num_running == 0 and engine.kv_usage() == 0


def test_mixed_prefill_stalls_decoding_but_overlap_does_not() -> None:
    gaps = {}
    for profile in (MIXED, OVERLAP):
        engine = Engine(profile)
        a, b = seq(10, 200), seq(4000, 5)
        engine.submit(a, 0.0)
        drain(engine, until=0.1)
        engine.submit(b, 0.1)
        times = [t for t, _ in drain(engine)[a]]
        gaps[profile.name] = max(y - x for x, y in itertools.pairwise(times))
    assert gaps["m"] >= 0.004 + 1024 * 50e-6  # a whole prefill chunk sits in one step
    assert gaps["o"] <= 0.008 + 2 * 0.0005 + 1e-9  # decode steps go on beside the lane


def test_overlap_lane_is_serial_and_chunks_carry_mtp_tokens() -> None:
    profile = dataclasses.replace(OVERLAP, tokens_per_chunk=1.5)
    engine = Engine(profile)
    a, b = seq(1000, 600), seq(1000, 600)
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    seen = drain(engine)
    lane = 0.010 + 1000 * 100e-6
    assert seen[a][0][0] == pytest.approx(lane)
    assert seen[b][0][0] == pytest.approx(2 * lane)  # waited for a's prefill
    sizes = [n for _, n in seen[a][1:-1]]
    assert set(sizes) == {1, 2}
    assert sum(sizes) / len(sizes) == pytest.approx(1.5, abs=0.1)
    assert sum(n for _, n in seen[a]) == 600 == a.generated


@pytest.mark.parametrize("profile", [MIXED, OVERLAP], ids=["mixed", "overlap"])
def test_ttft_grows_with_prompt_length(profile: Profile) -> None:
    ttft = []
    for prompt in (256, 2048, 8192):
        engine = Engine(profile)
        s = seq(prompt, 2)
        engine.submit(s, 0.0)
        drain(engine)
        assert s.first_token_at is not None
        ttft.append(s.first_token_at)
    assert ttft[0] < ttft[1] < ttft[2]


@pytest.mark.parametrize("name", ["vllm", "deepinfer"])
def test_load_raises_ttft_and_throughput_until_saturation(name: str) -> None:
    # A smaller KV cache (3 requests per rank) so saturation comes within a quick run.
    profile = dataclasses.replace(load_profile(name), kv_cache_tokens=8 * 8192)
    runs = {
        c: closed_loop(
            profile, requests=3 * c, concurrency=c, prompt_tokens=2048, output_tokens=256, seed=1
        )[0]
        for c in (1, 4, 16, 64, 256)
    }
    ttft = [runs[c]["mean_ttft_ms"] for c in sorted(runs)]
    tput = [runs[c]["output_throughput"] for c in sorted(runs)]
    assert ttft[0] < ttft[2] < ttft[3] < ttft[4]
    assert tput[0] < tput[1] < tput[2]
    # Past saturation, throughput stops growing much while TTFT keeps climbing (queueing).
    assert tput[4] < 1.5 * tput[3]
    assert ttft[4] > 2 * ttft[3]


def test_kv_limit_queues_then_preempts() -> None:
    profile = dataclasses.replace(MIXED, kv_cache_tokens=2048, max_num_batched_tokens=4096)
    engine = Engine(profile)
    seqs = [seq(600, 300) for _ in range(4)]
    for s in seqs:
        engine.submit(s, 0.0)
    engine.advance(engine.next_deadline() or 0.0)  # the first step held only the first arrival
    assert engine.num_running == 3 and engine.num_waiting == 1  # 3 prompts fill the cache
    peak = 0.0
    while (t := engine.next_deadline()) is not None:
        for s in engine.advance(t):
            s.chunks.clear()
        peak = max(peak, engine.kv_usage())
    assert peak <= 1.0
    assert engine.num_preemptions > 0 and any(s.preemptions for s in seqs)
    assert all(s.state is State.FINISHED and s.generated == 300 for s in seqs)
    assert engine.kv_usage() == 0 and engine.num_running == engine.num_waiting == 0


def test_max_num_seqs_limits_running() -> None:
    engine = Engine(dataclasses.replace(MIXED, max_num_seqs=2))
    for _ in range(5):
        engine.submit(seq(10, 50), 0.0)
    drain(engine, until=0.02)
    assert engine.num_running == 2 and engine.num_waiting == 3


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_priority_orders_waiting_prefills(policy: str) -> None:
    profile = dataclasses.replace(OVERLAP, scheduling_policy=policy)
    engine = Engine(profile)
    first = seq(1000, 2)
    engine.submit(first, 0.0)  # occupies the lane
    batch = [seq(1000, 2, priority=1) for _ in range(3)]
    for s in batch:
        engine.submit(s, 0.001)
    urgent = seq(1000, 2, priority=-1)
    engine.submit(urgent, 0.002)
    drain(engine)
    order = sorted([*batch, urgent], key=lambda s: s.first_token_at or 0.0)
    assert (order[0] is urgent) == (policy == "priority")
    assert (order[-1] is urgent) == (policy == "fcfs")


def test_cancel_frees_slot_and_blocks() -> None:
    engine = Engine(MIXED)
    a, b = seq(100, 1000), seq(100, 1000)
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)
    drain(engine, until=0.05)
    used = engine.kv_usage()
    engine.cancel(a, 0.05)
    assert engine.num_running == 1 and engine.kv_usage() < used
    drain(engine)
    assert a.state is State.CANCELLED and a.generated < 1000 and b.generated == 1000


def test_balanced_ranks_spread_and_random_ranks_are_seeded() -> None:
    balanced = Engine(dataclasses.replace(OVERLAP, ranks=4))
    for _ in range(8):
        balanced.submit(seq(100, 10), 0.0)
    assert [len(r.running) + r.n_waiting for r in balanced.ranks] == [2, 2, 2, 2]
    picks = []
    for _ in range(2):
        engine = Engine(dataclasses.replace(OVERLAP, ranks=4, rank_assignment="random"), seed=7)
        seqs = [seq(100, 10) for _ in range(16)]
        for s in seqs:
            engine.submit(s, 0.0)
        picks.append([s.rank for s in seqs])
    assert picks[0] == picks[1] and len(set(picks[0])) > 1


def test_cancelling_the_prefilling_sequence_starts_the_next() -> None:
    engine = Engine(OVERLAP)
    a, b = seq(5000, 5), seq(100, 5)
    engine.submit(a, 0.0)
    engine.submit(b, 0.0)  # queued behind a's prefill on the only lane
    engine.cancel(a, 0.1)
    assert engine.next_deadline() == pytest.approx(0.1 + 0.010 + 100 * 100e-6)
    drain(engine)
    assert b.generated == 5 and a.generated == 0


def test_priority_scheduling_preempts_the_lowest_priority_first() -> None:
    profile = dataclasses.replace(
        MIXED, kv_cache_tokens=1024, max_num_batched_tokens=4096, scheduling_policy="priority"
    )
    engine = Engine(profile)
    low, high = seq(300, 400, priority=5), seq(300, 400, priority=0)
    engine.submit(low, 0.0)
    drain(engine, until=0.0)
    engine.submit(high, 0.001)  # admitted after low, so FCFS would preempt it first
    drain(engine)
    assert low.preemptions > 0 and high.preemptions == 0
    assert low.generated == high.generated == 400
