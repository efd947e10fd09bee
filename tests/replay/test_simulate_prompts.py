"""Shared-prefix rows in simulate: the live replayer's text, the emulator's token ids."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from emulator.prompt import prompt_ids
from replay.plan import Plan, PlanOptions
from replay.simulate.loop import Simulation
from replay.simulate.prompts import Prompts
from replay.simulate.world import World
from replay.sources import Source
from replay.synth import PromptSynth
from router.cli import default_config_path
from router.config.parse import load_config
from router.control.classify import classify
from tests.fixtures import MOONCAKE


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def test_ids_and_blocks_share_what_the_live_text_shares() -> None:
    prompts = Prompts(salt=3)
    live = PromptSynth(salt=3)  # what the live replayer sends in its fourth run
    settings = load_config(default_config_path()).classification
    rows = []
    for item in Source(str(MOONCAKE)):
        assert item.synth is not None
        body = live.body(item.record.body, item.synth, item.record.custom_id)
        info = classify(
            json.dumps(body).encode(),
            "chat",
            request_id="x",
            header_class=None,
            key_class=None,
            session_key=None,
            settings=settings,
        ).info
        ids, blocks, prefix_hash = prompts.shape(item, item.synth)
        assert len(ids) == len(prompt_ids(body, "chat")) == info.prompt_tokens
        rows.append((tuple(prompt_ids(body, "chat")), info, ids, blocks, prefix_hash))
    shared = 0
    for (live_a, info_a, a, blocks_a, h_a), (
        live_b,
        info_b,
        b,
        blocks_b,
        h_b,
    ) in itertools.combinations(rows, 2):
        # the engine sees the same shared prefix, token for token
        assert _common(a, b) == _common(live_a, live_b)
        # the router's chains share about as many blocks as the live text's (a boundary may
        # fall a few characters off), and the leading hashes agree where the text's do
        live_blocks = _common(info_a.prefix_blocks, info_b.prefix_blocks)
        assert abs(_common(blocks_a, blocks_b) - live_blocks) <= 1
        assert (h_a == h_b) == (info_a.prefix_hash == info_b.prefix_hash)
        shared += _common(live_a, live_b) > 100
    assert shared >= 3  # the fixture does share prefixes


def test_shared_prefixes_hit_the_engines_prefix_cache(tmp_path: Path) -> None:
    # Ten requests, one after another, sharing their first two 512-token blocks.
    rows: list[dict[str, Any]] = [
        {
            "timestamp": 2000 * i,
            "input_length": 1500,
            "output_length": 5,
            "hash_ids": [7, 8, i + 100],
        }
        for i in range(10)
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    world = World(load_config(default_config_path()), {})
    ttfts: list[float] = []
    sim = Simulation(
        world, world.policies["vllm-only"], "v", lambda i, r, t: ttfts.append(r.ttft or 0)
    )
    sim.run(Plan(Source(str(trace), model=world.model()), PlanOptions()))
    engine = world.by_name["vllm"].engine
    assert engine.prefix_cache_queries == sum(int(r["input_length"]) for r in rows)
    # the first of each rank computes all; later ones find the shared 1,024 tokens
    assert engine.prefix_cache_hits >= (10 - engine.profile.ranks) * 1024
    assert min(ttfts[engine.profile.ranks :]) < ttfts[0]
