"""Sessions: a turn goes after the previous answer, its prompt the history plus the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from emulator.profiles import load_profile
from replay.client import Result
from replay.plan import Plan, PlanOptions
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Source
from router.cli import default_config_path
from router.config.parse import load_document, parse_config
from tests.procs import run_replay, start_emulator
from tests.replay.test_simulate import Recorder, recorder_config
from turnout.common.tokens import MESSAGE_OVERHEAD


def _write(tmp_path: Path, rows: list[dict[str, Any]], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _simulate(
    path: Path, sessions: str = "auto", time_scale: float = 1.0
) -> tuple[World, dict[str, tuple[Result, float]]]:
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    for b in doc["backends"]:
        b["emulator"]["time_scale"] = time_scale
    world = World(parse_config(doc), {})
    out: dict[str, tuple[Result, float]] = {}

    def record(item: Item, r: Result, sent: float) -> None:
        out[r.custom_id] = (r, sent)

    sim = Simulation(world, world.policies["vllm-only"], "v", record)
    source = Source(str(path), model=world.model(), sessions=sessions)  # type: ignore[arg-type]
    sim.run(Plan(source, PlanOptions()))
    return world, out


CONVERSATION = [
    # session a: turn 2 is recorded before turn 1 could have been answered; turn 3 has a delay
    {
        "session_id": "a",
        "timestamp": 0,
        "input_length": 2000,
        "output_length": 300,
        "hash_ids": [1, 2, 3, 4],
    },
    {
        "session_id": "b",
        "timestamp": 100,
        "input_length": 600,
        "output_length": 20,
        "hash_ids": [9, 10],
    },
    {
        "session_id": "a",
        "timestamp": 200,
        "input_length": 2600,
        "output_length": 50,
        "hash_ids": [1, 2, 3, 4, 5, 6],
    },
    {"session_id": "a", "delay": 1500, "input_length": 100, "output_length": 10, "hash_ids": [1]},
]


def test_simulated_turns_wait_for_the_answer_and_carry_the_history(tmp_path: Path) -> None:
    world, out = _simulate(_write(tmp_path, CONVERSATION))
    (r1, s1), (r2, s2), (r3, s3) = (out[f"mooncake-{n}"] for n in (0, 2, 3))
    _, sb = out["mooncake-1"]
    assert s1 == 0.0 and sb == pytest.approx(0.1)  # across sessions: on the schedule
    assert r1.e2e is not None and r2.e2e is not None
    assert s2 == pytest.approx(s1 + r1.e2e)  # not at 0.2 s: after turn 1's answer
    assert s3 == pytest.approx(s2 + r2.e2e + 1.5)  # after turn 2's answer and the think time
    # the prompt: recorded size where the history fits, else history + answer + one word
    assert r2.prompt_tokens == 2600
    assert r3.prompt_tokens == 2600 + 50 + 2 * MESSAGE_OVERHEAD + 1
    # turn 2 found turn 1's prompt and answer in the engine's prefix cache
    engine = world.by_name["vllm"].engine
    assert engine.prefix_cache_hits >= (2000 + 300) // 16 * 16 - 16


def test_scaled_engines_keep_session_timing(tmp_path: Path) -> None:
    # emulators at time scale 3 answer three times sooner; a turn still follows its answer
    _, out = _simulate(_write(tmp_path, CONVERSATION), time_scale=3.0)
    (r1, s1), (_, s2) = out["mooncake-0"], out["mooncake-2"]
    _, slow = _simulate(_write(tmp_path, CONVERSATION, "slow.jsonl"))
    assert r1.e2e is not None and slow["mooncake-0"][0].e2e is not None
    assert r1.e2e == pytest.approx(slow["mooncake-0"][0].e2e / 3.0, rel=0.05)
    assert s2 == pytest.approx(max(0.2, s1 + r1.e2e))


def test_sessions_off_and_inferred(tmp_path: Path) -> None:
    rows = [{k: v for k, v in r.items() if k != "session_id"} for r in CONVERSATION[:3]]
    path = _write(tmp_path, rows)
    _, independent = _simulate(path, "off")
    assert independent["mooncake-2"][1] == pytest.approx(0.2)
    _, inferred = _simulate(path, "infer")  # row 2's blocks extend row 0's whole prompt
    (r0, s0), (_, s2) = inferred["mooncake-0"], inferred["mooncake-2"]
    assert r0.e2e is not None and s2 == pytest.approx(s0 + r0.e2e)


def test_live_turns_wait_and_send_the_history_with_the_answer(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "tell me about the lake " * 20}]
    turn2 = [*messages, {"role": "assistant", "content": "recorded answer"}]
    turn2.append({"role": "user", "content": "and the river?"})
    rows = []
    for n, (t, msgs) in enumerate([(0, messages), (50, turn2)]):
        body = {
            "model": load_profile("vllm").model,
            "messages": msgs,
            "max_tokens": 40,
            "stream": True,
        }
        rows.append(
            {
                "custom_id": f"c{n}",
                "body": body,
                "url": "/v1/chat/completions",
                "v": 1,
                "method": "POST",
                "t_offset_ms": t,
                "headers": {"x-session-id": "s"},
            }
        )
    path = _write(tmp_path, rows)
    results = tmp_path / "res.jsonl"
    with start_emulator("vllm", time_scale=20, seed=1) as emu:
        p = run_replay(str(path), "--target", emu.url, "--results", str(results), "--no-progress")
    assert p.returncode == 0, p.stderr
    lines = {d["custom_id"]: d for d in map(json.loads, results.read_text().splitlines())}
    one, two = lines["c0"], lines["c1"]
    assert one["resp"]["status"] == two["resp"]["status"] == 200
    # sent after the first answer ended, not at 50 ms
    assert two["t_offset_ms"] >= one["t_offset_ms"] + one["obs"]["e2e_ms"] - 1
    # its prompt: turn 1's prompt, the answer this replay got (40 tokens), the new message
    first = one["resp"]["usage"]["prompt_tokens"]
    new = 4  # "and the river?"
    assert two["resp"]["usage"]["prompt_tokens"] == first + 40 + 2 * MESSAGE_OVERHEAD + new


def test_the_clock_never_goes_back_while_turns_wait(tmp_path: Path) -> None:
    # Twelve sessions of four turns each, interleaved: turns keep waiting for answers while
    # other sessions' turns arrive. The policy's view of the clock, at every choice and
    # every answer fed back, only moves forward.
    rows: list[dict[str, Any]] = [
        {
            "session_id": f"s{k}",
            "timestamp": 40 * (4 * k + t),
            "input_length": 900 * (t + 1),
            "output_length": 30 + 7 * k,
            "hash_ids": list(range(k * 100, k * 100 + 2 * (t + 1))),
        }
        for k in range(12)
        for t in range(4)
    ]
    rows.sort(key=lambda r: r["timestamp"])
    path = _write(tmp_path, rows)
    world = World(recorder_config(), {})
    rec = world.policies["rec"]
    assert isinstance(rec, Recorder)
    rec.clock = lambda: world.now
    out: list[Result] = []
    sim = Simulation(world, rec, "rec", lambda i, r, t: out.append(r))
    sim.run(Plan(Source(str(path), model=world.model()), PlanOptions()))
    assert len(out) == 48 and all(r.ok for r in out)
    assert len(rec.times) == 96 and rec.times == sorted(rec.times)
