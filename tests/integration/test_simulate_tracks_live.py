"""The grid's virtual closed loop against the same loop live, on a tiny workload.

Eight batch workers, each sending non-streamed requests one after the other (3,000-token
prompts, 64 output tokens) for 5 s through the embedded default at time scale 2 (10 model
seconds), routed by `class-split` to DeepInfer, whose serial prefill lanes (and cold start)
they queue for: the live run (the official client, over loopback) and
benchmarks/mixed_sim.py's simulation of the same loop must agree on the number of requests
and on the mean end-to-end time within 15% (seconds, as the simulation counts a time-scaled
engine's: real ones; a run on the 2-core machine gave 34 and 36 requests, 1.24 s and
1.17 s). A simulation that let the workers run ahead, lost one, or put the wrong number of
requests in flight would queue differently.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai
import orjson

from benchmarks.mixed_sim import Cell, Seen, run_in
from benchmarks.mixed_workload import DEFAULT_CONFIG, chat_body, scaled_config
from policies.types import Slo
from replay.simulate.world import World
from router.config.parse import load_document, parse_config
from tests.router.harness import start_router, write_config

SCALE, PROMPT, OUTPUT = 2.0, 3000, 64
CELL = Cell(8, 1e-9, 5.0, batch_prompt=(PROMPT, PROMPT), batch_output=(OUTPUT, OUTPUT))
"""No interactive arrival (one in some 30 years); eight workers for 5 s."""
BAND = 0.15


async def live(url: str) -> list[tuple[float, float]]:
    """(sent, e2e) per request, seconds from the start."""
    client = openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=60,
        default_headers={"X-Request-Class": "batch", "X-Turnout-Policy": "class-split"},
    )
    t0 = time.perf_counter()
    out: list[tuple[float, float]] = []

    async def worker(w: int) -> None:
        n = 0
        while time.perf_counter() - t0 < CELL.duration:
            n += 1
            doc = orjson.loads(chat_body(100 * w + n, PROMPT, OUTPUT, stream=False))
            sent = time.perf_counter()
            reply = await client.chat.completions.create(
                model=doc["model"],
                messages=doc["messages"],
                max_tokens=OUTPUT,
                extra_body={"ignore_eos": True},
            )
            assert reply.usage is not None and reply.usage.completion_tokens == OUTPUT
            out.append((sent - t0, time.perf_counter() - sent))

    await asyncio.gather(*(worker(w) for w in range(CELL.workers)))
    await client.close()
    return out


def simulated(path: Path) -> list[tuple[float, float]]:
    """The same loop in virtual time (benchmarks/mixed_sim.py, with these sizes)."""
    world = World(parse_config(load_document(str(path))), {})
    seen: Seen = []
    run_in(world, world.policies["class-split"], CELL, Slo(1.0, 1.0), seen=seen)
    assert all(r.ok and r.completion_tokens == OUTPUT for _, r, _ in seen)
    return [(s, r.e2e or 0.0) for _, r, s in seen]


def test_the_simulated_closed_loop_tracks_a_live_one(tmp_path: Path) -> None:
    path = write_config(tmp_path, scaled_config(DEFAULT_CONFIG, SCALE, 0))
    with start_router(path) as router:
        real = asyncio.run(live(router.url))
    sim = simulated(path)
    assert len(sim) >= 3 * CELL.workers  # enough rounds for queues to form and drain
    for name, pick in (
        ("requests", lambda rs: float(len(rs))),
        ("mean E2E", lambda rs: sum(e for _, e in rs) / len(rs)),
    ):
        a, b = pick(real), pick(sim)
        assert abs(a - b) <= BAND * b, f"{name}: live {a:.3f} s, simulated {b:.3f} s"
