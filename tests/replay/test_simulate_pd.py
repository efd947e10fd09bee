"""``replay simulate`` takes a ``pd`` policy's two hops in virtual time."""

from __future__ import annotations

from replay.client import Result
from replay.plan import Planned
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Synth
from router.config.parse import parse_config
from turnout.common.capture import CaptureRecord

WARM = {"ranks": 1, "cold_prefills": 0}


def world(hold_s: float = 480.0) -> World:
    def emu(role: str, **more: object) -> dict[str, object]:
        return {"profile": "vllm", "role": role, "set": {**WARM, **more}}

    doc = {
        "backends": [
            {"name": "p0", "engine": "vllm", "emulator": emu("prefill", kv_hold_timeout_s=hold_s)},
            {"name": "d0", "engine": "vllm", "emulator": emu("decode")},
            {"name": "solo", "engine": "vllm", "emulator": emu("both")},
        ],
        "policies": {
            "split": {"type": "pd", "params": {"prefill": ["p0"], "decode": ["d0"]}},
            "solo": {"type": "pinned", "params": {"backend": "solo"}},
        },
        "default_policy": "split",
    }
    return World(parse_config(doc), {})


def run(w: World, policy: str, n: int = 6) -> list[Result]:
    out: list[Result] = []
    sim = Simulation(w, w.policies[policy], policy, lambda item, r, sent: out.append(r))
    body = {"max_tokens": 64, "ignore_eos": True, "stream": True}
    plan = [
        Planned(i * 0.5, Item(i, CaptureRecord(f"r{i}", "/v1/chat/completions", body), Synth(4000)))
        for i in range(n)
    ]
    sim.run(plan)
    return out


def test_each_request_prefills_on_p0_and_decodes_on_d0_with_the_pulled_blocks() -> None:
    w = world()
    results = run(w, "split")
    assert len(results) == 6 and all(r.ok and r.backend == "d0" for r in results)
    assert all(r.completion_tokens == 64 for r in results)
    decode, prefill = w.by_name["d0"].engine, w.by_name["p0"].engine
    assert decode.link.pulls == 6 and decode.link.failed == 0
    assert len(prefill.holds) == 0 and prefill.kv_usage() == 0  # every hold was pulled
    assert decode.prefix_cache_queries == 6 * (results[0].prompt_tokens or 0)
    # the same requests on one co-located engine: its decode steps carry others' prefills
    solo = run(world(), "solo")
    mean_itl = sum(sum(r.itls) / len(r.itls) for r in results) / 6
    solo_itl = sum(sum(r.itls) / len(r.itls) for r in solo) / 6
    assert mean_itl < solo_itl


def test_expired_blocks_are_prefilled_on_the_decode_engine() -> None:
    w = world(hold_s=0.0)
    results = run(w, "split", n=2)
    assert all(r.ok and r.backend == "d0" for r in results)
    decode = w.by_name["d0"].engine
    assert decode.link.pulls == 0 and decode.link.failed == 2
    assert w.by_name["p0"].engine.holds.expired == 2
