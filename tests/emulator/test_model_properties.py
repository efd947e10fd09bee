"""Invariants of the engine model under random small workloads (hypothesis)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from emulator.model import Engine, Sequence, State
from emulator.profiles import Profile

profiles = st.builds(
    Profile,
    name=st.just("p"),
    scheduling=st.sampled_from(["mixed", "overlap"]),
    scheduling_policy=st.sampled_from(["fcfs", "priority"]),
    ranks=st.integers(1, 3),
    rank_assignment=st.sampled_from(["balanced", "random", "hash", "vllm-dp"]),
    api_servers=st.integers(1, 4),
    max_num_seqs=st.integers(1, 6),
    max_num_batched_tokens=st.integers(16, 2048),
    kv_cache_tokens=st.integers(2048, 16384),
    tokens_per_chunk=st.floats(1.0, 2.5),
    frontend_per_token_us=st.sampled_from([0.0, 20.0]),
)
requests = st.lists(
    st.tuples(
        st.floats(0.0, 2.0),  # arrival
        st.integers(1, 600),  # prompt tokens
        st.integers(1, 300),  # output tokens
        st.integers(-2, 2),  # priority
        st.booleans(),  # cancelled half-way through the run?
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(profile=profiles, reqs=requests, seed=st.integers(0, 3))
def test_every_request_finishes_exactly_and_capacity_holds(
    profile: Profile, reqs: list[tuple[float, int, int, int, bool]], seed: int
) -> None:
    engine = Engine(profile, seed=seed)
    cap = engine.capacity_tokens()
    pending = sorted(
        (
            (t, Sequence(p, min(o, cap - p), priority=pr, rng=random.Random(i)), c)
            for i, (t, p, o, pr, c) in enumerate(reqs)
            if p < cap
        ),
        key=lambda x: x[0],
    )
    cancel = {seq: c for _, seq, c in pending}
    now, events = 0.0, 0
    deadline = engine.next_deadline()
    while events < 200_000:
        events += 1
        deadline = engine.next_deadline()
        if pending and (deadline is None or pending[0][0] <= deadline):
            now, seq, _ = pending.pop(0)
            engine.submit(seq, now)
            continue
        if deadline is None:
            break
        assert deadline >= now  # the clock never runs back
        now = deadline
        for seq in engine.advance(now):
            assert seq.chunks and all(n >= 1 for n in seq.chunks)
            seq.chunks.clear()
            if cancel[seq] and not seq.done:
                engine.cancel(seq, now)  # the client leaves after its first chunk
        assert 0.0 <= engine.kv_usage() <= 1.0
        assert all(len(r.running) <= profile.max_num_seqs for r in engine.ranks)
    assert deadline is None and not pending, "the engine stalled or never went idle"
    assert engine.num_running == 0 and engine.num_waiting == 0 and engine.kv_usage() == 0
    for seq, cancelled in cancel.items():
        if cancelled:
            assert seq.state in (State.CANCELLED, State.FINISHED)
        else:
            assert seq.state is State.FINISHED and seq.generated == seq.output_tokens
