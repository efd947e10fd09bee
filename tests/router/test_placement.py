"""router.control.placement: the workers' rings (wrapping, lapping) and what a feed learns."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from policies.registry import BackendInfo, build_policy
from policies.testing import make_candidate
from policies.types import Outcome, RequestInfo
from router.control.placement import PlacementFeed, PlacementRings


def test_records_pass_between_workers_across_the_ring_end() -> None:
    rings = PlacementRings(3, size=64)
    w0, w1, w2 = rings.ring(0), rings.ring(1), rings.ring(2)
    for i in range(10):  # 10 x 24 bytes through a 64-byte ring, read as they come
        w0.write(b"x" * 19 + str(i).encode())
        assert w1.read() == [b"x" * 19 + str(i).encode()]
    assert w0.read() == [] and w1.lost == 0
    for _ in range(4):  # 96 bytes unread: w2 was lapped
        w0.write(b"y" * 20)
    assert w2.read() == [] and w2.lost == 1
    w1.write(b"z")
    assert w2.read() == [b"z"]


def test_a_feed_teaches_the_policy_what_another_process_placed() -> None:
    infos = [BackendInfo("one", "vllm", False), BackendInfo("two", "vllm", False)]
    policy = build_policy("warm", "cache-aware", {}, infos)
    feed = PlacementFeed(lambda: {"warm": policy}, None, None, "router")
    blocks = (11, 22, 33)
    feed.learn(orjson.dumps(["warm", "two", blocks]))
    feed.learn(b"not json")  # skipped
    feed.learn(orjson.dumps(["nobody", "one", blocks]))  # no such policy: skipped
    req = RequestInfo("r", "chat", "m", "interactive", prompt_tokens=3000, prefix_blocks=blocks)
    decision = policy.choose(req, [make_candidate("one"), make_candidate("two")])
    assert decision.ranked[0] == "two" and decision.scores["two"] == 1.0


def test_prefix_blocks_are_the_same_in_every_process() -> None:
    """Placements pass between processes: a prompt's block chain must not be salted."""
    code = "from policies.prefix import prompt_blocks as b; print(b('x' * 1000 + 'é' * 600))"
    chains = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(chains) == 1 and chains.pop().count(",") == 5  # 6 full blocks of 256


def test_a_feed_carries_adaptive_lessons_between_processes() -> None:
    """One worker's finished requests, passed through a ring as lessons, teach another
    worker's adaptive instance; a malformed lesson is skipped."""
    infos = [BackendInfo("fast", "vllm", False), BackendInfo("bulk", "deepinfer", False)]
    params = {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"]}
    here, there = (build_policy("ad", "adaptive", params, infos) for _ in range(2))
    rings = PlacementRings(2, size=1 << 16)
    inbox = rings.ring(1)
    sender = PlacementFeed(lambda: {"ad": here}, rings.ring(0), None, "router")
    receiver = PlacementFeed(lambda: {"ad": there}, inbox, None, "router")
    cands = [make_candidate("fast", "vllm"), make_candidate("bulk", "deepinfer")]
    for i in range(30):  # "fast" takes 3 s to a first token: over the 1 s target
        req = RequestInfo(f"r{i}", "chat", "m", "interactive", stream=True, prompt_tokens=900)
        decision = here.choose(req, cands)
        here.committed(req, decision, "fast")
        outcome = Outcome(200, True, 900, 20, ttft_s=3.0, e2e_s=3.5, tpot_s=0.02)
        sender.finished(here, req, "fast", outcome)
        here.on_finish(req, "fast", outcome)
    payloads = inbox.read()
    assert len(payloads) == 30
    receiver.learn(orjson.dumps(["ad", "fast", "lesson", ["interactive", True, "x"]]))
    receiver.learn(orjson.dumps(["ad", "fast", "lesson", {"ttft": 1}]))
    for payload in payloads:
        receiver.learn(payload)
    asked = RequestInfo("q", "chat", "m", "interactive", stream=True, prompt_tokens=900)
    assert here.choose(asked, cands).ranked[0] == "bulk"
    assert there.choose(asked, cands).ranked[0] == "bulk"
    untaught = build_policy("ad", "adaptive", params, infos)
    assert untaught.choose(asked, cands).ranked[0] == "fast"
