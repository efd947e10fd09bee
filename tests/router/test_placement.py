"""router.control.placement: the workers' rings (wrapping, lapping) and what a feed learns."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import orjson

from policies.adaptive import AdaptivePolicy
from policies.registry import BackendInfo, build_policy
from policies.testing import make_candidate, make_request, send
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


def test_a_spill_counts_against_the_limit_in_every_worker_until_it_ends() -> None:
    """Two workers' adaptive instances, two spill slots on "fast" for the router: what one
    worker spills, the other counts as soon as it reads the rings before choosing."""
    infos = [BackendInfo("fast", "vllm", True), BackendInfo("bulk", "deepinfer", False)]
    params = {"low_ttft": ["vllm"], "high_throughput": ["deepinfer"],
              "spill": {"max_inflight": 2, "initial_inflight": 2}}  # fmt: skip
    rings = PlacementRings(2, size=1 << 16)
    feeds: list[PlacementFeed] = []
    policies: list[AdaptivePolicy] = []
    for w in range(2):
        policy = build_policy("ad", "adaptive", params, infos)
        assert isinstance(policy, AdaptivePolicy)
        for name, e2e in (("bulk", 8.0), ("fast", 4.0)):  # batch paces measured, bulk slower
            done = make_request("batch", request_id=f"warm-{name}", max_tokens=800)
            policy.on_finish(done, name, Outcome(200, True, 1000, 800, e2e_s=e2e))
        policies.append(policy)
        feeds.append(PlacementFeed(partial(dict, ad=policy), rings.ring(w), None, "router"))

    def spill(w: int, rid: str, open_on_fast: int) -> str:
        """Worker ``w`` sends batch ``rid`` (the router has ``open_on_fast`` on "fast")."""
        feeds[w].catch_up(policies[w])
        cands = [make_candidate("fast", "vllm", inflight=open_on_fast, priority_capable=True),
                 make_candidate("bulk", "deepinfer", inflight=4)]  # fmt: skip
        req = make_request("batch", request_id=rid, max_tokens=800, stream=False)
        head = send(policies[w], req, cands).ranked[0]
        feeds[w].committed(policies[w], rid)
        return head

    assert spill(0, "a", 0) == "fast"
    assert spill(1, "b", 1) == "fast"  # worker 1 counts a, and b: the router's two slots
    assert policies[1].spilled("fast") == 2
    assert spill(0, "c", 2) == "bulk"  # worker 0 counts b too (alone it would spill c)
    # a ends in worker 0: worker 1 hears it before its next choice and spills again
    req = make_request("batch", request_id="a", max_tokens=800, stream=False)
    outcome = Outcome(200, True, 1000, 800, e2e_s=4.0)
    feeds[0].finished(policies[0], req, "fast", outcome)
    policies[0].on_finish(req, "fast", outcome)
    assert spill(1, "d", 2) == "fast"
    feeds[0].catch_up(policies[0])  # worker 0 counts b and d
    assert policies[0].spilled("fast") == 2
    bad: list[object] = [["1", "x"], {"a": 1}, ["", "x", 5]]  # the last names no worker
    for figures in bad:
        feeds[0].learn(orjson.dumps(["ad", "fast", "spill", figures]))  # skipped
    feeds[0].learn(orjson.dumps(["ad", "fast", "spill-end", ["1"]]))
    assert policies[0].spilled("fast") == 2
