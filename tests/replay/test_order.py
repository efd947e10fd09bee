"""Interleaved blocks after a warm-up: the order itself, and a replay that follows it.

The replay runs in-process against a loopback aiohttp server that records every request it
gets (policy header, id, the moment it arrived), so the test sees what the target saw.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from replay.order import WARMUP, Stretch, describe, order_text, stretches, within
from replay.plan import Planned
from replay.replayer import Replayer, ReplayOptions, build_report
from replay.sources import Item
from tests.replay.served import served
from turnout.common.capture import CaptureRecord, dump_line, parse_line

REQUESTS = 24
GAP_MS = 25.0


def test_blocks_rotate_the_runs_after_a_warm_up() -> None:
    order = stretches(3, 3, 9.0, warmup_s=1.0, warm=[0, 1])
    assert order[:2] == [Stretch(0, WARMUP, 0.0, 1.0), Stretch(1, WARMUP, 0.0, 1.0)]
    measured = order[2:]
    assert [(s.run, s.block) for s in measured] == [
        (0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (0, 1), (2, 2), (0, 2), (1, 2),
    ]  # fmt: skip
    assert [(s.lo, s.hi) for s in measured if s.run == 0] == [
        (0.0, 3.0),
        (3.0, 6.0),
        (6.0, math.inf),
    ]
    # every run goes first, second and third once
    for run in range(3):
        places = sorted([s.run for s in measured if s.block == k].index(run) for k in range(3))
        assert places == [0, 1, 2]
    doc = describe(["a", "b", "a (A/A)"], order, speed=2.0)
    assert doc == {
        "warmup_s": 2.0,
        "blocks": 3,
        "starts_s": [0.0, 6.0, 12.0],
        "sequence": [["a", "b", "a (A/A)"], ["b", "a (A/A)", "a"], ["a (A/A)", "a", "b"]],
    }
    text = order_text(doc)
    assert text.startswith("warm-up: the first 2 s of the trace once per policy, not measured;")
    assert "3 blocks, each replayed by every run in turn: a, b, a (A/A) | b, a (A/A), a" in text


def test_a_stretch_of_the_plan_starts_at_zero() -> None:
    plan = [Planned(t, Item(k, CaptureRecord(f"r{k}", "/v1/chat/completions", {})))
            for k, t in enumerate((0.0, 0.5, 1.0, 1.5, 2.5))]  # fmt: skip
    assert [(p.at, p.item.row) for p in within(plan, 1.0, 2.5)] == [(0.0, 2), (0.5, 3)]
    assert [p.item.row for p in within(plan, 2.0, math.inf)] == [4]
    assert [p.item.row for p in within(plan, 1, 3, by_index=True)] == [1, 2]


@pytest.fixture
async def engine() -> AsyncIterator[tuple[str, list[tuple[str, str, float]]]]:
    seen: list[tuple[str, str, float]] = []

    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        seen.append((request.headers["x-turnout-policy"], request.headers["x-request-id"],
                     time.monotonic()))  # fmt: skip
        assert body["messages"][0]["content"].startswith("(run ")  # recorded text, marked
        return web.json_response({
            "id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "two words"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2,
                      "prompt_tokens_details": {"cached_tokens": 3}},
        }, headers={"x-turnout-backend": "b", "x-turnout-attempts": "2"})  # fmt: skip

    async def policies(_: web.Request) -> web.Response:
        slo = {"default": {"ttft_s": 1.0, "tpot_s": 1.0}}
        return web.json_response([{"name": "p", "default": True, "slo": slo}, {"name": "q"}])

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/turnout/policies", policies)
    async with served(app) as url:
        yield url, seen


async def test_the_replay_interleaves_its_runs_as_the_report_says(
    engine: tuple[str, list[tuple[str, str, float]]], tmp_path: Path
) -> None:
    url, seen = engine
    capture, results = tmp_path / "capture.jsonl", tmp_path / "results.jsonl"
    with capture.open("wb") as f:
        for i in range(REQUESTS):
            body = {"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]}
            f.write(dump_line(CaptureRecord(f"q{i}", "/v1/chat/completions", body,
                                            t_offset_ms=GAP_MS * i)))  # fmt: skip
    opts = ReplayOptions(
        file=str(capture), target=url, policies=("p", "q"), aa=True, model="m",
        results=str(results), warmup_s=0.1, prices={"b": 36.0},
    )  # fmt: skip
    replayer = Replayer(opts)
    report = build_report(replayer, await replayer.run())
    # the warm-up: the first 0.1 s (4 requests) once per policy, then 3 blocks of 8 requests
    # per run, each run in turn, rotated; after the first block each stretch leads in with
    # the 0.1 s before it (4 requests), not measured
    assert sorted((p, r) for p, r, _ in seen[:8]) == sorted(
        (p, f"q{i}") for p in ("p", "q") for i in range(4)
    )
    sizes = [8] * 3 + [12] * 6
    starts = [8 + sum(sizes[:k]) for k in range(9)]
    stretches_seen = [seen[a : a + n] for a, n in zip(starts, sizes, strict=True)]
    assert [b[0][0] for b in stretches_seen] == ["p", "q", "p", "q", "p", "p", "p", "p", "q"]
    ids = [sorted(r for _, r, _ in b) for b in stretches_seen]
    block = [sorted(f"q{i}" for i in range(max(8 * k - 4, 0), 8 * k + 8)) for k in range(3)]
    assert ids == [block[0]] * 3 + [block[1]] * 3 + [block[2]] * 3
    assert len(seen) == 8 + 3 * (8 + 12 + 12)
    # one stretch after another: each begins once the previous one's answers are all in
    for before, after in itertools.pairwise(stretches_seen):
        assert after[0][2] >= before[-1][2]
    assert report["order"]["sequence"] == [
        ["p", "q", "p (A/A)"], ["q", "p (A/A)", "p"], ["p (A/A)", "p", "q"],
    ]  # fmt: skip
    assert report["prefix_caches"]["marked"] == REQUESTS
    assert [r["policy"] for r in report["runs"]] == ["p", "q", "p (A/A)"]
    assert [r["aa"] for r in report["runs"]] == [False, False, True]
    for run in report["runs"]:
        assert run["overall"]["completed"] == REQUESTS  # the warm-up is not counted
        assert run["by_backend"]["b"]["by_class"]["default"]["cached_tokens"] == 3 * REQUESTS
        assert {e["attempts"] for e in run["slowest"]} == {2}
        assert run["by_class"]["default"]["goodput"] == 1.0  # the target's SLO
    # results: every run's requests on the whole schedule's clock, the A/A run named
    lines = [parse_line(line) for line in results.read_bytes().splitlines()]
    assert len(lines) == 3 * REQUESTS
    for rec in lines:
        i = int(rec.custom_id[1:])
        assert rec.t_offset_ms is not None and rec.t_offset_ms >= GAP_MS * i - 1.0
        assert rec.route is not None and rec.route.failovers == 1
        assert rec.resp is not None and rec.resp.cached_tokens == 3
    assert sum(rec.route is not None and rec.route.policy == "p (A/A)" for rec in lines) == REQUESTS
    assert replayer.pricing == {"b": 36.0}
