"""A closed-loop source in simulate: each worker's next request goes when its answer is in."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

from benchmarks.mixed_sim import Cell, Figures, Seen, run_in
from emulator.profiles import ENGINES_DIR
from policies.base import Policy
from policies.types import Candidate, Decision, Outcome, RequestClass, RequestInfo, Slo
from replay.client import Result
from replay.plan import Planned
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Synth
from router.cli import default_config_path
from router.config.parse import load_document, parse_config
from turnout.common.capture import CaptureRecord

WORKERS, EACH = 3, 4


def item(worker: int, n: int) -> Item:
    body = {"max_tokens": 64, "ignore_eos": True, "stream": False}
    rec = CaptureRecord(f"w{worker}-{n}", "/v1/chat/completions", body)
    return Item(worker * 100 + n, rec, Synth(3000))


def test_each_worker_sends_its_next_request_when_its_answer_arrives() -> None:
    world = World(parse_config(load_document(str(default_config_path()))), {})
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}
    sim: Simulation

    def on_result(it: Item, r: Result, at: float) -> None:
        assert r.ok and r.e2e is not None
        sent[r.custom_id] = at
        answered[r.custom_id] = at + r.e2e
        assert abs(world.now - answered[r.custom_id]) < 1e-9  # settled at its own time
        worker, n = divmod(it.row, 100)
        if n + 1 < EACH:
            sim.follow(Planned(world.now, item(worker, n + 1)))

    sim = Simulation(world, world.policies["class-split"], "x", on_result, closed_loop=True)
    for w in range(WORKERS):
        sim.follow(Planned(0.0, item(w, 0)))
    end = sim.run(iter(()))
    assert len(answered) == WORKERS * EACH  # every request of every worker, none twice
    for w in range(WORKERS):
        for n in range(1, EACH):
            # sent exactly when the previous answer came back: the engines did not run ahead
            assert sent[f"w{w}-{n}"] == answered[f"w{w}-{n - 1}"]
    assert end == max(answered.values())


def warm_profiles(directory: Path) -> dict[str, str]:
    """The shipped profiles as warm engines (no cold start), as files in ``directory``."""
    paths = {}
    for name in ("vllm", "deepinfer"):
        doc = yaml.safe_load((ENGINES_DIR / f"{name}.yaml").read_text())
        doc["cold_prefills"] = 0
        paths[name] = str(directory / f"{name}.yaml")
        Path(paths[name]).write_text(yaml.safe_dump(doc))
    return paths


def test_workers_see_their_requests_start_when_sent(tmp_path: Path) -> None:
    """Had the engines run on past an answer while other requests were in flight, the next
    request would start late (at the next scrape) and take longer: workers on warm engines
    far from full see near-equal latencies (the frontend's jitter and shared steps only)."""
    config = parse_config(load_document(str(default_config_path())))
    world = World(config, warm_profiles(tmp_path))
    e2es: list[float] = []
    sim: Simulation

    def on_result(it: Item, r: Result, at: float) -> None:
        assert r.e2e is not None
        e2es.append(r.e2e)
        worker, n = divmod(it.row, 100)
        if n + 1 < 8:
            sim.follow(Planned(world.now, item(worker, n + 1)))

    sim = Simulation(world, world.policies["class-split"], "x", on_result, closed_loop=True)
    for w in range(WORKERS):
        sim.follow(Planned(0.1 * w, item(w, 0)))  # staggered: answers fall between steps
    sim.run(iter(()))
    assert len(e2es) == WORKERS * 8
    assert max(e2es) - min(e2es) < 0.1 * min(e2es)


class Counting:
    """A policy that counts the batch requests it has open, and checks at every decision
    that the router's own counts (the candidates' in-flight) agree with its own."""

    def __init__(self, inner: Policy, world: World) -> None:
        self.inner, self.world = inner, world
        self.name, self.type = inner.name, inner.type
        self.open: dict[RequestClass, set[str]] = {"interactive": set(), "batch": set()}
        self.at_choice: list[tuple[float, RequestClass, int]] = []

    def choose(self, req: RequestInfo, candidates: Sequence[Candidate]) -> Decision:
        batch = len(self.open["batch"])
        assert sum(c.inflight for c in candidates) == batch + len(self.open["interactive"])
        self.at_choice.append((self.world.now, req.request_class, batch))
        return self.inner.choose(req, candidates)

    def committed(self, req: RequestInfo, decision: Decision, backend: str) -> None:
        self.open[req.request_class].add(req.request_id)
        self.inner.committed(req, decision, backend)

    def on_finish(self, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        self.open[req.request_class].discard(req.request_id)
        self.inner.on_finish(req, backend, outcome)


GRID_CELL = Cell(workers=12, rate=2.0, duration=60.0)


def grid_run(policy: str, cell: Cell = GRID_CELL) -> tuple[Counting, Seen, Figures]:
    config = parse_config(load_document(str(default_config_path())))
    world = World(config, {})
    counting = Counting(world.policies[policy], world)
    seen: Seen = []
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    return counting, seen, run_in(world, counting, cell, slo, seen=seen)


def test_the_grids_closed_loop_keeps_exactly_n_batch_requests_in_flight() -> None:
    """benchmarks/mixed_sim.py's batch job: N workers, each sending its next request as its
    answer comes back, until the window closes; never more, never fewer, whatever the policy
    does with them (adaptive spills some to vllm here)."""
    counting, seen, figures = grid_run("adaptive")
    n = GRID_CELL.workers
    batch = [(t, k) for t, cls, k in counting.at_choice if cls == "batch"]
    assert [k for _, k in batch[:n]] == list(range(n))  # the workers start together
    # after that, each batch request replaces one that just finished: n - 1 others open
    assert all(k == n - 1 for _, k in batch[n:])
    assert all(t < GRID_CELL.duration for t, _ in batch)  # none sent after the window
    # an interactive request arriving inside the window finds all n workers' requests open
    inside = [k for t, cls, k in counting.at_choice if cls == "interactive"]
    assert inside and all(k == n for k in inside)
    assert figures.batch_on_low > 0  # both engines served batch work: the loop spans them
    assert figures.batch_total == len(batch) == sum(r.request_class == "batch" for _, r, _ in seen)


def test_the_window_counts_batch_tokens_finished_inside_it() -> None:
    _, seen, figures = grid_run("class-split")
    duration = GRID_CELL.duration
    done = [
        (s + (r.e2e or 0.0), r.completion_tokens or 0)
        for _, r, s in seen
        if r.request_class == "batch" and r.ok
    ]
    inside = sum(tokens for end, tokens in done if end <= duration)
    assert any(end > duration for end, _ in done)  # some were cut by the window's end
    assert figures.batch_tokens_per_s == pytest.approx(inside / duration)


def test_every_policy_meets_the_same_interactive_arrivals() -> None:
    """The comparison is fair only if the open-loop schedule does not depend on the policy
    (the batch loop's pace does, and draws from a stream of its own)."""

    def arrivals(policy: str) -> list[tuple[str, float, int | None]]:
        _, seen, _ = grid_run(policy)
        rows = [
            (r.custom_id, s, r.prompt_tokens)
            for _, r, s in seen
            if r.request_class == "interactive"
        ]
        return sorted(rows)

    first = arrivals("round-robin")
    assert len(first) > 60  # 2/s over 60 s
    assert arrivals("adaptive") == first
