"""The ``vllm-dp`` rank assignment: vLLM's coordinator and API servers, in virtual time."""

from __future__ import annotations

import dataclasses
import random

from emulator.dp import HEARTBEAT_S, DPFrontEnd
from emulator.model import Engine, Sequence
from emulator.profiles import Profile

MIXED = Profile(name="m", scheduling="mixed", ranks=2, rank_assignment="vllm-dp",
                step_base_ms=4.0, step_per_prefill_token_us=50.0, step_per_decode_seq_ms=0.2,
                max_num_batched_tokens=16384)  # fmt: skip


def seq(prompt: int, out: int) -> Sequence:
    return Sequence(prompt, out, rng=random.Random(prompt * 31 + out))


def test_a_rank_counts_arrivals_only_when_its_step_ends() -> None:
    engine = Engine(dataclasses.replace(MIXED, ranks=1))
    a, b = seq(8000, 5), seq(10, 5)
    engine.submit(a, 0.0)
    rank = engine.ranks[0]
    assert rank.published == (1, 0)  # published as its 0.4 s prefill step began
    engine.advance(0.2)
    engine.submit(b, 0.2)
    engine.advance(0.2)
    assert rank.published == (1, 0)  # b waits in the input queue, uncounted
    engine.advance(0.41)
    assert rank.published == (0, 2)  # the step ended: a decodes and b was taken in


def test_broadcasts_go_out_only_when_counts_changed() -> None:
    fe = DPFrontEnd(ranks=2, api_servers=1, interval_ms=100, seed=0)
    fe.published(0, (0, 1), 0.0)
    assert fe.pick(0.0) == 1  # rank 0 runs one request, rank 1 none
    # Nothing changed since: the front end keeps counting its own pick (4 x 1 waiting).
    assert fe.pick(0.5) == 0
    assert fe.pick(0.6) == 1  # 4 x 1 + 1 on rank 0 against 4 on rank 1
    # The coordinator's heartbeat replaces those guesses with the engines' counts.
    assert fe.pick(HEARTBEAT_S + 0.1) == 1


def test_broadcasts_are_at_least_an_interval_apart() -> None:
    fe = DPFrontEnd(ranks=2, api_servers=1, interval_ms=100, seed=0)
    fe.published(0, (0, 1), 0.0)
    fe.published(1, (0, 5), 0.01)  # relayed with the next broadcast, at 0.1
    assert fe.pick(0.05) == 1  # still the counts of t=0: rank 1 looks empty
    assert fe.pick(0.1) == 0  # now rank 1 shows its five


def test_api_servers_herd_onto_the_least_loaded_rank() -> None:
    """Each API server sends its first request of a broadcast interval to the same rank."""

    def burst(api_servers: int) -> int:
        fe = DPFrontEnd(ranks=3, api_servers=api_servers, interval_ms=100, seed=3)
        fe.published(0, (0, 3), 0.0)
        fe.published(1, (0, 3), 0.0)  # relayed with rank 0's at the next broadcast, 0.1 s
        return [fe.pick(0.2) for _ in range(8)].count(2)

    alone, herd = burst(1), burst(8)
    assert alone == 3  # one server alternates as its own counts grow
    assert herd >= 5  # each of eight servers counts only its own picks
