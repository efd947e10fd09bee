"""One cell of the mixed-workload grid in virtual time, through ``replay simulate``'s loop.

The workload is benchmarks/mixed_workload.py's: interactive chat streamed open loop
(Poisson, prompts 500-2,000 tokens, outputs 100-300) beside a closed-loop batch job
(``X-Request-Class: batch``, non-streamed, prompts 6,000-8,192, outputs 512-1,024). The
interactive arrivals are a schedule; each batch worker sends its next request when its last
answer comes back (:meth:`~replay.simulate.loop.Simulation.follow`). The router's own pool,
policy objects and engine models do the rest, as in ``replay simulate``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from policies.base import Policy
from policies.types import Outcome, Slo
from replay.client import Result
from replay.plan import Planned
from replay.simulate.loop import Simulation
from replay.simulate.world import World
from replay.sources import Item, Synth
from router.config.model import RouterConfig
from turnout.common.capture import CaptureRecord

URL = "/v1/chat/completions"


@dataclass(frozen=True, slots=True)
class Cell:
    """One workload of the grid (model seconds)."""

    workers: int
    rate: float
    duration: float
    seed: int = 0
    batch_prompt: tuple[int, int] = (6000, 8192)
    """A batch request's prompt tokens, drawn uniformly between these (inclusive)."""
    batch_output: tuple[int, int] = (512, 1024)


@dataclass(frozen=True, slots=True)
class Figures:
    """One policy's figures in one cell."""

    p95_ttft: float
    """Interactive P95 TTFT (seconds) of requests sent in the window."""
    attainment: float
    """Interactive requests that met the SLO (TTFT and TPOT)."""
    batch_tokens_per_s: float
    """Output tokens of batch requests finished within the window, per second."""
    batch_on_low: int
    """Batch requests sent to the low-TTFT backend (spilled)."""
    batch_total: int
    mape: dict[str, float] = field(default_factory=dict)
    """The policy's own TTFT prediction error per backend (adaptive only)."""


def _item(row: int, prompt: int, output: int, *, batch: bool) -> Item:
    # No model: the simulation asks for the router's first (as for an imported trace).
    body = {"max_tokens": output, "ignore_eos": True, "stream": not batch}
    headers = {"x-request-class": "batch"} if batch else {}
    rec = CaptureRecord(f"{'b' if batch else 'i'}{row}", URL, body, headers=headers)
    return Item(row, rec, Synth(prompt))


def _interactive(cell: Cell, rng: random.Random) -> Iterator[Planned]:
    t, row = 0.0, 0
    while (t := t + rng.expovariate(cell.rate)) < cell.duration:
        row += 2
        yield Planned(t, _item(row, rng.randint(500, 2000), rng.randint(100, 300), batch=False))


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (NaN for none)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run_cell(config: RouterConfig, policy: str, cell: Cell, slo: Slo, low: str = "vllm") -> Figures:
    """Run ``policy`` of ``config`` over ``cell`` on fresh engine models."""
    world = World(config, {})
    return run_in(world, world.policies[policy], cell, slo, low)


Seen = list[tuple[Item, Result, float]]
"""Every answered or refused request: its item, its result and when it was sent."""


def run_in(
    world: World, pol: Policy, cell: Cell, slo: Slo, low: str = "vllm", seen: Seen | None = None
) -> Figures:
    """Run ``pol`` over ``cell`` in ``world`` (fresh); every result also goes to ``seen``."""
    policy = pol.name
    batch_rng = random.Random(cell.seed + 1)
    rows = iter(range(1, 10**9, 2))  # batch rows odd, interactive even: unique in the heap
    ttfts: list[float] = []
    met = interactive = 0
    batch_tokens = on_low = batch_total = 0
    sim: Simulation

    def batch_request(at: float) -> Planned:
        prompt, output = (
            batch_rng.randint(*cell.batch_prompt),
            batch_rng.randint(*cell.batch_output),
        )
        return Planned(at, _item(next(rows), prompt, output, batch=True))

    def on_result(item: Item, r: Result, sent: float) -> None:
        nonlocal met, interactive, batch_tokens, on_low, batch_total
        if seen is not None:
            seen.append((item, r, sent))
        end = sent + (r.e2e or 0.0)
        if r.request_class == "batch":
            batch_total += 1
            on_low += r.backend == low
            if r.ok and end <= cell.duration:
                batch_tokens += r.completion_tokens or 0
            if r.ok and world.now < cell.duration:  # a refusal would repeat at once
                sim.follow(batch_request(world.now))
            return
        interactive += 1
        if r.ok and r.ttft is not None:
            ttfts.append(r.ttft)
        tpot = None
        if r.ok and r.completion_tokens and r.completion_tokens > 1 and r.ttft is not None:
            tpot = ((r.e2e or 0.0) - r.ttft) / (r.completion_tokens - 1)
        ok = r.ok and r.e2e is not None
        met += ok and slo.met(Outcome(200, True, 0, r.completion_tokens or 0, r.ttft, r.e2e, tpot))

    sim = Simulation(world, pol, policy, on_result, salt=cell.seed, closed_loop=True)
    for _ in range(cell.workers):
        sim.follow(batch_request(0.0))
    sim.run(_interactive(cell, random.Random(cell.seed)))
    error = getattr(pol, "prediction_error", None)
    mape = error() if callable(error) else {}
    return Figures(
        percentile(ttfts, 0.95),
        met / interactive if interactive else float("nan"),
        batch_tokens / cell.duration,
        on_low,
        batch_total,
        dict(mape),
    )


COMPARED = ("round-robin", "class-split", "adaptive")
SPARE = 1.15
"""Round-robin's batch throughput over class-split's that shows spare capacity, and what
adaptive must then reach."""
P95_ALLOWANCE = 1.3
BATCH_SLACK = 0.97
MAPE_TARGET = 0.15


def verdict(figs: Mapping[str, Figures], slo_ttft: float) -> str:
    """Adaptive against class-split (issue 17): ``dominated``, ``better``, ``not dominated``,
    or ``MISSED 1.15x`` where round-robin shows spare capacity adaptive did not take."""
    rr, cs, a = (figs[p] for p in COMPARED)
    worse_both = (
        a.batch_tokens_per_s < BATCH_SLACK * cs.batch_tokens_per_s and a.p95_ttft > cs.p95_ttft
    )
    if worse_both or (cs.p95_ttft <= slo_ttft < a.p95_ttft):
        return "DOMINATED"
    if rr.batch_tokens_per_s < SPARE * cs.batch_tokens_per_s:
        return "not dominated"
    gain = a.batch_tokens_per_s >= SPARE * cs.batch_tokens_per_s
    return "better" if gain and a.p95_ttft <= P95_ALLOWANCE * cs.p95_ttft else "MISSED 1.15x"


HEADER = (
    f"{'workers':>7} {'int/s':>5} {'secs':>4} | "
    + " | ".join(f"{p + ' P95 s, tok/s':>25}" for p in COMPARED)
    + f" | {'x cs':>5} {'MAPE':>5} {'spilled':>8} | verdict"
)


def row(cell: Cell, figs: Mapping[str, Figures], slo_ttft: float, where: str = "") -> str:
    """One line of the grid's table."""
    a, cs = figs["adaptive"], figs["class-split"]
    mape = max(a.mape.values(), default=float("nan"))
    parts = " | ".join(
        f"{figs[p].p95_ttft:>13.3f} {figs[p].batch_tokens_per_s:>11,.0f}" for p in COMPARED
    )
    ratio = a.batch_tokens_per_s / cs.batch_tokens_per_s
    flag = " (MAPE over 15%)" if mape > MAPE_TARGET else ""
    return (
        f"{cell.workers:>7} {cell.rate:>5g} {cell.duration:>4g} | {parts} | {ratio:>5.2f} "
        f"{100 * mape:>4.1f}% {f'{a.batch_on_low}/{a.batch_total}':>8} | "
        f"{verdict(figs, slo_ttft)}{flag}{where}"
    )
