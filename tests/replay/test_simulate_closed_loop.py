"""A closed-loop source in simulate: each worker's next request goes when its answer is in."""

from __future__ import annotations

from common.capture import CaptureRecord
from replay.client import Result
from replay.plan import Planned
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Synth
from router.cli import default_config_path
from router.config.parse import load_document, parse_config

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


def test_workers_see_their_requests_start_when_sent() -> None:
    """Had the engines run on past an answer while other requests were in flight, the next
    request would start late (at the next scrape) and take longer: workers on engines far
    from full see near-equal latencies (the frontend's jitter and shared steps only)."""
    world = World(parse_config(load_document(str(default_config_path()))), {})
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
