"""Several policies simulated in the live comparison's order, on one simulated deployment.

Live, ``replay --policy A --policy B`` does not run A and then B on fresh engines: it warms
the engines up with the trace's first seconds once per policy, then replays the schedule in
interleaved blocks (:mod:`replay.order`), each stretch from an idle target, each block after
the first with a lead-in, on the one router whose engines, pool and policies every run
shares. What the runs then measure depends on that order: engines that are warm (past their
cold start, :mod:`emulator.cold`) and a batch backlog that starts over at every block. So
``replay simulate`` with two policies or more replays the same order on one
:class:`~replay.simulate.world.World`, stretch after stretch on its virtual clock, each
stretch once the previous one's answers are all in; a run's results keep their times on the
trace's clock, as the live runs' do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from replay.client import Result
from replay.order import WARMUP, Stretch, default_warmup, stretches
from replay.plan import Planned
from replay.simulate.loop import OnResult, Simulation
from replay.simulate.world import World
from replay.sources import Item


@dataclass(slots=True)
class _Stretch:
    """The stretch being simulated: how far its virtual clock is ahead of the trace's, and
    the rows of its lead-in (sent, not measured)."""

    shift: float = 0.0
    leading: set[int] = field(default_factory=set)


def _ignore(item: Item, r: Result, sent: float) -> None:
    pass


def live_order(policies: int, span: float) -> list[Stretch]:
    """The live replayer's order for ``policies`` runs over a schedule ``span`` seconds long
    (its defaults: as many blocks as runs, a tenth of the trace as warm-up)."""
    return stretches(policies, policies, span, warmup_s=default_warmup(span), warm=range(policies))


def run_compared(
    world: World,
    runs: Sequence[tuple[str, str]],
    plan: Callable[[], Iterable[Planned]],
    span: float,
    on_result: Sequence[OnResult],
) -> list[tuple[Simulation, float, float]]:
    """Simulate each (policy, label) of ``runs`` over the schedule ``plan()`` gives, in the
    live order (see the module); ``on_result[i]`` gets run ``i``'s measured requests, at
    their trace times. Returns each run's simulation, the virtual seconds its measured
    stretches took and the CPU seconds they took."""
    now = _Stretch()

    def shifted(report: OnResult) -> OnResult:
        def measured(item: Item, r: Result, sent: float) -> None:
            if item.row not in now.leading:
                report(item, r, sent - now.shift)

        return measured

    sims = [
        Simulation(world, world.policies[policy], label, shifted(on_result[i]), salt=i, mark=True)
        for i, (policy, label) in enumerate(runs)
    ]
    took = [0.0] * len(runs)
    cpu = [0.0] * len(runs)
    order = live_order(len(runs), span)
    lead = order[0].hi if order and order[0].block == WARMUP else 0.0
    for stretch in order:
        if stretch.block == WARMUP:  # its own prompts, not measured (as the live replayer's)
            policy, label = runs[stretch.run]
            sim = Simulation(
                world,
                world.policies[policy],
                f"{label} warm-up",
                _ignore,
                salt=len(runs) + stretch.run,
                mark=True,
            )
        else:
            sim = sims[stretch.run]
        start = world.now
        base = stretch.lo - (lead if stretch.block > 0 else 0.0)
        now.shift, now.leading = start - base, set()
        t0 = time.process_time()
        end = sim.run(_stretched(plan(), base, stretch, now), start=start)
        if stretch.block != WARMUP:
            took[stretch.run] += end - start
            cpu[stretch.run] += time.process_time() - t0
    return list(zip(sims, took, cpu, strict=True))


def _stretched(
    plan: Iterable[Planned], base: float, stretch: Stretch, now: _Stretch
) -> Iterator[Planned]:
    """The items of ``[base, stretch.hi)`` at virtual times; a lead-in's (before
    ``stretch.lo``) go unmeasured, and a conversation's turns there are left out (they are the
    previous block's), as the live replayer does."""
    for p in plan:
        if p.at >= stretch.hi:
            return
        if p.at < base:
            continue
        if p.at < stretch.lo:
            if p.item.session is not None:
                continue
            now.leading.add(p.item.row)
        yield Planned(p.at + now.shift, p.item)
