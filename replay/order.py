"""In which order a comparison's runs replay the trace: a warm-up, then interleaved blocks.

Run one after another, two policies do not see the same target: the first pays the engines'
cold start, the second finds the first one's prompts in their prefix caches, and both see
whatever the machine drifts through meanwhile. So with two runs or more the schedule is cut
into ``blocks`` equal stretches, and each block is replayed once per run before the next
block starts, the runs' order rotated by one each block (A B C, B C A, C A B, ...): every run
goes first, second, ... equally often when the blocks are a multiple of the runs (the
default: as many blocks as runs). Each stretch starts once the previous one's answers are
all in. Before the first block, the first ``warmup`` seconds of the schedule are replayed
once per policy and not measured, so that every engine a policy uses has served before it
is measured; and each later block's stretch begins with the ``warmup`` seconds before the
block, sent and not measured (the replayer's lead-in), so that its engines carry into the
block the load one run would have carried instead of starting it idle.

A run's requests keep their times on the whole schedule (block ``k`` of a run starts where
block ``k - 1`` left off), so its report, results and timeline read as one run of the trace.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from replay.plan import Planned

WARMUP = -1
"""The ``block`` of a warm-up stretch."""
WARMUP_SHARE = 0.1
WARMUP_MAX_S = 60.0


@dataclass(frozen=True, slots=True)
class Stretch:
    """A part of the schedule replayed by one run: ``[lo, hi)`` seconds of it."""

    run: int
    block: int
    lo: float
    hi: float


def default_warmup(span_s: float) -> float:
    """A tenth of the schedule, at most a minute of it."""
    return min(span_s * WARMUP_SHARE, WARMUP_MAX_S)


def stretches(
    runs: int,
    blocks: int,
    span_s: float,
    *,
    warmup_s: float = 0.0,
    warm: Sequence[int] = (),
) -> list[Stretch]:
    """The whole order: the runs ``warm`` over ``[0, warmup_s)``, then every block."""
    out = [Stretch(r, WARMUP, 0.0, warmup_s) for r in warm] if warmup_s > 0 else []
    width = span_s / blocks
    for k in range(blocks):
        lo = k * width
        hi = math.inf if k == blocks - 1 else (k + 1) * width
        for i in range(runs):
            out.append(Stretch((i + k) % runs, k, lo, hi))
    return out


def within(
    plan: Iterable[Planned], lo: float, hi: float, *, by_index: bool = False
) -> Iterator[Planned]:
    """The planned items sent in ``[lo, hi)``, at times relative to ``lo``; ``by_index``:
    the items ``lo`` to ``hi`` instead (a closed loop, where time is not planned)."""
    for n, p in enumerate(plan):
        at = float(n) if by_index else p.at
        if at >= hi:
            return
        if at >= lo:
            yield Planned(p.at - lo if not by_index else p.at, p.item)


def describe(labels: Sequence[str], order: Sequence[Stretch], speed: float) -> dict[str, Any]:
    """The report's ``order``: the warm-up and each block's start (trace seconds), and the
    runs in the order each block was replayed."""
    measured = [s for s in order if s.block != WARMUP]
    warm = [s for s in order if s.block == WARMUP]
    blocks = max((s.block for s in measured), default=-1) + 1
    return {
        "warmup_s": round(warm[0].hi * speed, 3) if warm else 0.0,
        "blocks": blocks,
        "starts_s": [
            round(next(s.lo for s in measured if s.block == k) * speed, 3) for k in range(blocks)
        ],
        "sequence": [[labels[s.run] for s in measured if s.block == k] for k in range(blocks)],
    }


def order_text(order: Mapping[str, Any]) -> str:
    """How the runs were ordered, in one sentence."""
    sequence = order["sequence"]
    if len(sequence) <= 1 and len(sequence[0] if sequence else ()) <= 1:
        return "one run"
    warm = order["warmup_s"]
    head = (
        f"warm-up: the first {warm:g} s of the trace once per policy, not measured; "
        if warm
        else ""
    )
    shown = " | ".join(", ".join(block) for block in sequence[:3])
    more = " | ..." if len(sequence) > 3 else ""
    head = head if warm else ""
    return f"{head}{order['blocks']} blocks, each replayed by every run in turn: {shown}{more}"


def prefix_caches(counts: Mapping[str, int], runs: int) -> dict[str, Any] | None:
    """How runs were kept from finding each other's prompts in engines' prefix caches:
    ``counts`` of the first run's requests by how their prompt was sent (None: one run)."""
    if runs < 2:
        return None
    said = []
    if counts.get("synthesized"):
        said.append(f"{counts['synthesized']} synthesized prompts, salted per run")
    if counts.get("marked"):
        said.append(f"{counts['marked']} recorded prompts marked per run ('(run N) ' first)")
    if counts.get("as_recorded"):
        said.append(
            f"{counts['as_recorded']} sent as recorded (token ids, or a conversation's turns): "
            "a later run may find them in a prefix cache, which the interleaved blocks give "
            "each run alike"
        )
    return {**counts, "handling": "; ".join(said) or "no requests"}
