"""Tenants in ``replay simulate``: a capture's ``route.tenant`` takes the router's fair
queues and its ``reserve`` (router.control.admission) on the virtual clock."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

from replay.client import Result
from replay.plan import Plan, PlanOptions
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Source
from router.cli import default_config_path
from router.config.parse import load_document, parse_config

HEAVY, LIGHT = 32, 5


def _row(n: int, at_ms: int, tenant: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    body = {
        "model": "deepseek-v4.1-flash",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    return {
        "custom_id": f"c-{n}",
        "url": "/v1/chat/completions",
        "body": body,
        "t_offset_ms": at_ms,
        "route": {"tenant": tenant},
    }


def _capture() -> list[dict[str, Any]]:
    """A flood of long requests from one tenant at once, and another's short ones, one every
    few seconds, each over before the next comes."""
    rows = [_row(i, 0, "heavy", "tell me a long story " * 40, 400) for i in range(HEAVY)]
    rows += [_row(HEAVY + i, 500 + 4000 * i, "light", "hi", 8) for i in range(LIGHT)]
    return rows


def _light_ttfts(tmp_path: Path, reserve: int) -> list[float]:
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    for b in doc["backends"]:
        b["max_inflight"] = 4
    doc["admission"] = {"interactive": {"queue_size": 100, "max_wait": 600, "reserve": reserve}}
    config = parse_config(doc)
    path = tmp_path / f"capture-{reserve}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _capture()))
    world = World(config, {})
    out: list[tuple[Item, Result, float]] = []
    sim = Simulation(world, world.policies["vllm-only"], "vllm-only",
                     lambda i, r, t: out.append((i, r, t)))  # fmt: skip
    sim.run(Plan(Source(str(path), model=world.model()), PlanOptions()))
    assert all(r.status == 200 for _, r, _ in out) and len(out) == HEAVY + LIGHT
    light = [r for i, r, _ in out if int(r.custom_id.split("-")[1]) >= HEAVY]
    return [r.ttft or 0.0 for r in sorted(light, key=lambda r: int(r.custom_id.split("-")[1]))]


def test_a_reserve_keeps_a_slot_for_the_light_tenant_beside_a_flood(tmp_path: Path) -> None:
    without, with_reserve = _light_ttfts(tmp_path, 0), _light_ttfts(tmp_path, 1)
    # Its first request waits for one of the flood's to end either way; once it is seen,
    # the reserved slot stays free for it, where without a reserve the flood takes it.
    assert median(with_reserve[1:]) < median(without[1:]) / 5
    assert max(with_reserve[1:]) < min(without[1:])
