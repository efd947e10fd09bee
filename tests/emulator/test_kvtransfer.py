"""Disaggregated prefill and decode in the pure engine model, in virtual time."""

from __future__ import annotations

import pytest

from emulator.model import Engine, Sequence
from emulator.profiles import ProfileError, load_profile

WARM = {"ranks": 1, "cold_prefills": 0}


def run(engine: Engine, until: float | None = None) -> float:
    """Advance ``engine`` event by event until idle (or ``until``); the last time reached."""
    t = 0.0
    while (d := engine.next_deadline()) is not None and (until is None or d <= until):
        t = d
        engine.advance(t)
    return t


def test_prefill_holds_until_pulled_then_decode_skips_the_prompt() -> None:
    prefill = Engine(load_profile("vllm", {**WARM, "role": "prefill"}))
    decode = Engine(load_profile("vllm", {**WARM, "role": "decode"}))
    ids = tuple(range(8192))
    p = Sequence(8192, 1, hold_kv=True, tokens=ids)
    prefill.submit(p, 0.0)
    t = run(prefill, until=100.0)  # idle only once the hold expires (480 s)
    assert p.transfer_id and len(prefill.holds) == 1
    assert prefill.kv_usage() > 0  # the blocks are still allocated
    tokens = prefill.hand_over(p.transfer_id, t)
    assert tokens == 8192 and prefill.kv_usage() == 0 and len(prefill.holds) == 0
    assert prefill.hand_over(p.transfer_id, t) is None  # pulled once only

    remote = Sequence(8192, 64, remote_tokens=tokens - 1, tokens=ids)
    pull = decode.submit(remote, t)
    assert pull is not None and pull.bytes == 8191 * 70272 and pull.blocks == 512
    assert pull.end - pull.start == pytest.approx(8191 * 70272 / 50e9)
    run(decode)
    local = Engine(load_profile("vllm", {**WARM, "role": "decode"}))
    own = Sequence(8192, 64, tokens=ids)
    local.submit(own, t)
    run(local)
    assert remote.first_token_at is not None and own.first_token_at is not None
    # the pull plus a one-token prefill step beats prefilling 8,192 tokens
    assert remote.first_token_at - t < (own.first_token_at - t) / 5
    assert remote.cached_tokens == 0 and decode.prefix_cache_hits == 0  # not a local hit


def test_a_hold_expires_and_frees_its_blocks() -> None:
    prefill = Engine(load_profile("vllm", {**WARM, "role": "prefill", "kv_hold_timeout_s": 2}))
    p = Sequence(4096, 1, hold_kv=True, tokens=tuple(range(4096)))
    prefill.submit(p, 0.0)
    done = run(prefill, until=1.9)
    assert p.done and len(prefill.holds) == 1 and p.finished_at is not None
    t = run(prefill)
    assert t == pytest.approx(p.finished_at + 2)
    assert prefill.holds.expired == 1 and prefill.kv_usage() == 0
    assert prefill.hand_over(p.transfer_id, t) is None and done < t


def test_one_link_queues_concurrent_pulls() -> None:
    decode = Engine(load_profile("vllm", {**WARM, "kv_link_gb_per_s": 1}))
    first = decode.submit(Sequence(1000, 4, remote_tokens=999), 0.0)
    second = decode.submit(Sequence(1000, 4, remote_tokens=999), 0.0)
    assert first is not None and second is not None
    assert second.start == pytest.approx(first.end)
    assert second.end - second.start == pytest.approx(999 * 70272 / 1e9)


def test_a_preempted_pulled_sequence_recomputes_locally() -> None:
    # two sequences fit at first but not as they grow: the later admission, the pulled one,
    # is preempted, loses its blocks and must prefill its prompt itself when readmitted
    decode = Engine(load_profile("vllm", {**WARM, "kv_cache_tokens": 2400}))
    local = Sequence(900, 400)
    pulled = Sequence(1000, 900, remote_tokens=999)
    decode.submit(local, 0.0)
    decode.submit(pulled, 0.001)
    run(decode)
    assert local.done and pulled.done
    assert pulled.preemptions >= 1 and pulled.remote_tokens == 0


def test_role_is_checked() -> None:
    with pytest.raises(ProfileError, match="role: unknown 'prefil'"):
        load_profile("vllm", {"role": "prefil"})
    with pytest.raises(ProfileError, match="kv_link_gb_per_s: must be above 0"):
        load_profile("vllm", {"kv_link_gb_per_s": 0})
