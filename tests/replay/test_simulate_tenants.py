"""Tenants in ``replay simulate``: a capture's ``route.tenant`` takes the router's fair
queues and its ``reserve`` (router.control.admission) on the virtual clock."""

from __future__ import annotations

import hashlib
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
from router.control.auth import tenant_id, tenant_shares
from router.control.fair import Share

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


def _heavy_before_light(tmp_path: Path, keys: list[dict[str, Any]], tag: str) -> int:
    """One backend slot; 30 of the heavy tenant's requests at once, then 4 of the light
    one's: how many heavy requests got a first token before the light tenant's last did."""
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    for b in doc["backends"]:
        b["max_inflight"] = 1
    doc["admission"] = {"interactive": {"queue_size": 100, "max_wait": 600}}
    doc["api_keys"] = keys
    config = parse_config(doc)
    tenant = {k["name"]: tenant_id(bytes.fromhex(k["sha256"])) for k in keys if "sha256" in k}
    rows = [_row(i, 0, tenant["heavy"], "a long story " * 20, 60) for i in range(30)]
    rows += [_row(30 + i, 100, tenant["light"], "a long story " * 20, 60) for i in range(4)]
    path = tmp_path / f"capture-{tag}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    world = World(config, {})
    out: list[tuple[int, float]] = []

    def done(item: Item, r: Result, t: float) -> None:
        sent = (item.record.t_offset_ms or 0) / 1000
        out.append((int(r.custom_id.split("-")[1]), sent + (r.ttft or 0)))

    Simulation(world, world.policies["vllm-only"], "vllm-only", done).run(
        Plan(Source(str(path), model=world.model()), PlanOptions())
    )
    assert len(out) == 34
    last_light = max(t for n, t in out if n >= 30)
    return sum(1 for n, t in out if n < 30 and t < last_light)


def test_a_captured_tenant_takes_its_keys_weight_and_band(tmp_path: Path) -> None:
    """The capture's tenant id is derived from the key's digest, so a config's ``sha256``
    key (and an ``env``/``file`` one whose key is there) maps it to its weight and band."""

    def key(name: str, **more: Any) -> dict[str, Any]:
        return {"name": name, "sha256": hashlib.sha256(f"sk-{name}".encode()).hexdigest(), **more}

    plain = _heavy_before_light(tmp_path, [key("heavy"), key("light")], "plain")
    weighted = _heavy_before_light(tmp_path, [key("heavy", weight=8), key("light")], "weight")
    banded = _heavy_before_light(
        tmp_path, [key("heavy", weight=8), key("light", priority=1)], "band"
    )
    # Equal weights alternate the two tenants; weight 8 gives the heavy tenant 8 requests
    # for each of the light one's; a higher band goes before the heavy tenant's waiters.
    assert plain <= 6
    assert weighted >= 20
    assert banded <= 1


def test_keys_whose_digest_is_known_here_are_mapped(tmp_path: Path) -> None:
    keyfile = tmp_path / "key"
    keyfile.write_text("sk-from-file\n")
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    doc["api_keys"] = [
        {"name": "a", "sha256": hashlib.sha256(b"sk-a").hexdigest(), "weight": 2},
        {"name": "b", "file": str(keyfile), "priority": 3},
        {"name": "c", "env": "TURNOUT_TEST_UNSET_KEY_VARIABLE"},
    ]
    specs = parse_config(doc).api_keys
    shares = tenant_shares(specs)
    a = tenant_id(hashlib.sha256(b"sk-a").digest())
    b = tenant_id(hashlib.sha256(b"sk-from-file").digest())
    assert shares == {a: Share(a, 0, 2.0), b: Share(b, 3, 1.0)}  # c's variable is unset
