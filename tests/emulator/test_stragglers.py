"""Stragglers: first-token stalls and slow-decode stretches, in virtual time and over HTTP."""

from __future__ import annotations

import dataclasses
import itertools
import random
import re
import threading
import time
import urllib.request

import openai
import pytest

from emulator.faults import parse_header
from emulator.model import Engine, Sequence
from emulator.profiles import Faults, Profile, ProfileError, load_profile
from tests.emulator.conftest import client_for
from tests.procs import Emulator, start_emulator, wait_for

MIXED = Profile(name="m", step_base_ms=4.0, step_per_prefill_token_us=50.0,
                step_per_decode_seq_ms=0.2, max_num_batched_tokens=1024)  # fmt: skip
OVERLAP = Profile(name="o", scheduling="overlap", step_base_ms=8.0, step_per_decode_seq_ms=0.5,
                  prefill_base_ms=10.0, prefill_per_token_us=100.0)  # fmt: skip


def run(engine: Engine, seqs: list[tuple[float, Sequence]]) -> dict[Sequence, list[float]]:
    """Submit each (time, sequence) in order and run to idle; every chunk's time per seq."""
    times: dict[Sequence, list[float]] = {}
    pending = list(seqs)
    while True:
        t = engine.next_deadline()
        if pending and (t is None or pending[0][0] <= t):
            at, s = pending.pop(0)
            engine.submit(s, at)
            continue
        if t is None:
            return times
        for s in engine.advance(t):
            times.setdefault(s, []).extend([t] * len(s.chunks))
            s.chunks.clear()


def _seq(prompt: int, out: int, **kw: object) -> Sequence:
    return Sequence(prompt, out, rng=random.Random(prompt + out), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("profile", [MIXED, OVERLAP], ids=["mixed", "overlap"])
def test_a_stall_holds_the_slot_and_delays_only_the_first_token(profile: Profile) -> None:
    plain = run(Engine(profile), [(0.0, _seq(100, 20))])
    stalled_seq = _seq(100, 20, stall=2.0)
    engine = Engine(profile)
    engine.submit(stalled_seq, 0.0)
    engine.advance(1.0)
    assert engine.num_running == 1  # holding its running slot through the stall
    stalled = run(engine, [])[stalled_seq]
    base = next(iter(plain.values()))
    assert stalled[0] == pytest.approx(base[0] + 2.0)
    gaps = [b - a for a, b in itertools.pairwise(stalled)]
    assert gaps == pytest.approx([b - a for a, b in itertools.pairwise(base)])


def test_a_stalled_sequence_does_not_hold_up_its_neighbours_in_mixed_mode() -> None:
    a, b = _seq(100, 10, stall=5.0), _seq(100, 10, stall=0.0)
    times = run(Engine(MIXED), [(0.0, a), (0.0, b)])
    assert times[b][-1] < 0.5 < 5.0 < times[a][0]


def test_slow_decode_multiplies_the_gaps_for_a_stretch() -> None:
    s = _seq(100, 30, stall=0.0, slow_factor=3, slow_tokens=10)
    times = run(Engine(MIXED), [(0.0, s)])[s]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    step = 0.004 + 0.0002
    assert gaps[:10] == pytest.approx([3 * step] * 10)
    assert gaps[10:] == pytest.approx([step] * 19)


def test_a_cancelled_stalled_sequence_frees_its_slot_at_once() -> None:
    engine = Engine(MIXED)
    s = _seq(100, 10, stall=5.0)
    engine.submit(s, 0.0)
    engine.advance(1.0)
    assert engine.num_running == 1
    engine.cancel(s, 1.0)
    assert engine.num_running == 0 and engine.kv_usage() == 0
    while (t := engine.next_deadline()) is not None:  # the stale wake-up is harmless
        assert not engine.advance(t)


def test_rates_draw_stragglers_deterministically() -> None:
    faults = Faults(first_token_stall_rate=0.25, first_token_stall=3.0, slow_decode_rate=0.1)
    profile = dataclasses.replace(MIXED, faults=faults)

    def drawn(seed: int) -> list[tuple[float | None, int | None]]:
        engine = Engine(profile, seed=seed)
        out = []
        for i in range(400):
            s = _seq(10 + i, 5)
            engine.submit(s, float(i))
            out.append((s.stall, s.slow_factor))
        return out

    first = drawn(7)
    assert first == drawn(7)
    stalls = sum(1 for st, _ in first if st == 3.0)
    slows = sum(1 for _, f in first if f == 4)
    assert 60 < stalls < 140 and 20 < slows < 65
    assert all(st in (0.0, 3.0) for st, _ in first)


def test_the_header_wins_over_the_rates() -> None:
    plan = parse_header("first_token_stall=0; slow_decode=2; slow_tokens=5")
    s = _seq(10, 5)
    faults = Faults(first_token_stall_rate=1.0, first_token_stall=9.0)
    plan.mark(s, faults)
    Engine(dataclasses.replace(MIXED, faults=faults)).submit(s, 0.0)
    assert (s.stall, s.slow_factor, s.slow_tokens) == (0.0, 2, 5)


def test_bad_straggler_knobs_are_reported_with_their_paths() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("vllm", {"faults.first_token_stall_rate": 2, "faults.slow_decode_factor": 0})
    assert "faults.first_token_stall_rate: must be between 0 and 1" in info.value.errors
    assert "faults.slow_decode_factor: must be at least 1" in info.value.errors


def _running(emu: Emulator) -> float:
    with urllib.request.urlopen(emu.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    m = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.M)
    assert m
    return float(m.group(1))


def test_over_http_the_headers_and_role_chunk_come_at_once_the_content_late() -> None:
    args = ["--set", "faults.first_token_stall_rate=1", "--set", "faults.first_token_stall=1.5"]
    with start_emulator("vllm", args=args) as emu:
        start = time.monotonic()
        stream = client_for(emu).chat.completions.create(
            model="deepseek-v4.1-flash",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
        )
        chunks = iter(stream)
        role = next(chunks)
        assert role.choices[0].delta.role == "assistant" and not role.choices[0].delta.content
        assert time.monotonic() - start < 1.0
        # the stalled request holds its slot (from the engine's next step, well inside the stall)
        assert wait_for(lambda: _running(emu) == 1, timeout=1.0)
        content = next(c for c in chunks if c.choices and c.choices[0].delta.content)
        assert content and time.monotonic() - start >= 1.5
        stream.close()


def test_over_http_a_requested_stall_and_a_client_gone_free_the_slot(vllm: Emulator) -> None:
    client = client_for(vllm)
    got: list[str] = []

    def read() -> None:
        with client.with_options(timeout=2.0).chat.completions.create(
            model="deepseek-v4.1-flash",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            stream=True,
            extra_headers={"X-Emulator-Fault": "first_token_stall=3000"},
        ) as stream:
            for c in stream:
                got.append(c.choices[0].delta.content or "")
                if len(got) == 1:
                    return  # the role chunk: leave during the stall (30 s at scale 100)

    t = threading.Thread(target=read)
    t.start()
    t.join(10)
    deadline = time.monotonic() + 5
    while _running(vllm) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == [""] and _running(vllm) == 0


def test_a_bad_straggler_header_is_a_400(vllm: Emulator) -> None:
    with pytest.raises(openai.BadRequestError):
        client_for(vllm).chat.completions.create(
            model="deepseek-v4.1-flash",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Emulator-Fault": "slow_decode=0"},
        )
