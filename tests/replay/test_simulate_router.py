"""What the router does between a plan and an engine, in ``replay simulate``: admission's
queues and their limits, and a timed-out attempt's failover, on the virtual clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from replay.client import Result
from replay.plan import Plan, PlanOptions
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Source
from router.cli import default_config_path
from router.config.parse import load_document, parse_config


def _config(**sections: Any) -> Any:
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    doc.update(sections)
    return parse_config(doc)


def _run(
    config: Any, policy: str, tmp_path: Path, rows: list[dict[str, Any]], world: World | None = None
) -> list[Result]:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    world = world or World(config, {})
    out: list[tuple[Item, Result, float]] = []
    sim = Simulation(world, world.policies[policy], policy, lambda i, r, t: out.append((i, r, t)))
    sim.run(Plan(Source(str(path), model=world.model()), PlanOptions()))
    return sorted((r for _, r, _ in out), key=lambda r: int(r.custom_id.split("-")[1]))


def _together(n: int) -> list[dict[str, Any]]:
    """``n`` requests at once, each long enough to hold its backend a while."""
    return [{"timestamp": 0, "input_length": 2000, "output_length": 200} for _ in range(n)]


def _one_at_a_time(queue_size: int, max_wait: float) -> Any:
    """The embedded default with every backend at ``max_inflight`` 1 and an interactive
    queue."""
    doc = load_document(default_config_path())
    assert isinstance(doc, dict)
    for b in doc["backends"]:
        b["max_inflight"] = 1
    doc["admission"] = {"interactive": {"queue_size": queue_size, "max_wait": max_wait}}
    return parse_config(doc)


def test_a_full_backend_makes_requests_wait_in_their_queue_then_refuses(tmp_path: Path) -> None:
    results = _run(_one_at_a_time(2, 60), "vllm-only", tmp_path, _together(4))
    assert [r.status for r in results] == [200, 200, 200, 429]
    assert "queue is full" in str((results[3].error or {}).get("message"))
    e2e = [r.e2e or 0.0 for r in results[:3]]
    assert e2e[0] < e2e[1] < e2e[2]  # each waited for the one before it to leave the engine


def test_the_wait_runs_out_as_the_router_says(tmp_path: Path) -> None:
    results = _run(_one_at_a_time(8, 0.01), "vllm-only", tmp_path, _together(2))
    assert [r.status for r in results] == [200, 429]
    assert "for over 0.01 s" in str((results[1].error or {}).get("message"))


def _captured(stream: bool) -> list[dict[str, Any]]:
    """One captured chat request (its prompt as recorded)."""
    body = {
        "model": "deepseek-v4.1-flash",
        "messages": [{"role": "user", "content": "tell me a story " * 50}],
        "max_tokens": 200,
        "stream": stream,
    }
    return [{"custom_id": "c-0", "url": "/v1/chat/completions", "body": body, "t_offset_ms": 0}]


def test_an_answer_late_past_its_deadline_fails_over_then_gets_504(tmp_path: Path) -> None:
    timeouts = {"interactive": {"total": 0.01}}  # no engine answers 200 tokens within 10 ms
    config = _config(timeouts=timeouts, failover={"max_attempts": 2, "backoff_initial": 0.0})
    world = World(config, {})
    (result,) = _run(config, "round-robin", tmp_path, _captured(stream=False), world)
    assert result.status == 504 and "timed out" in str((result.error or {}).get("message"))
    assert all(b.inflight == 0 for b in world.pool.backends)  # both attempts' leases ended
    assert all(not b.breaker.ejected for b in world.pool.backends)  # no backend answered it
    with_one = _config(timeouts=timeouts, failover={"max_attempts": 1})
    (alone,) = _run(with_one, "round-robin", tmp_path, _captured(stream=False))
    assert alone.status == 504


def test_a_stream_whose_first_token_is_late_is_cut(tmp_path: Path) -> None:
    config = _config(timeouts={"interactive": {"idle": 0.001}})
    (result,) = _run(config, "vllm-only", tmp_path, _captured(stream=True))
    assert result.status == 200 and not result.ok
    assert "sent nothing for too long" in str((result.error or {}).get("message"))
    (served,) = _run(_config(), "vllm-only", tmp_path, _captured(stream=True))
    assert served.ok
