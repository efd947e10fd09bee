"""The pure parts of a ``pd`` request's two hops in simulate (replay/simulate/loop.py)."""

from __future__ import annotations

from emulator.rank import Sequence
from policies.pd import PhasePlan
from replay.simulate.world import Backend, World
from router.control.plan import has_room


def prefill_engine(world: World, phases: PhasePlan, model: str) -> tuple[Backend, str] | None:
    """The first prefill engine of the plan that serves ``model`` and has room, with the
    name it serves it by (None: none has room)."""
    assert phases.prefill is not None
    for name in phases.prefill.ranked:
        backend = world.by_name[name]
        served = world.pool.upstream_model(backend.state, model)
        if served is not None and has_room(backend.state):
            return backend, served
    return None


def pull(prefill: Backend, held: Sequence, decode: Backend, seq: Sequence, now: float) -> None:
    """``seq`` on ``decode`` pulls the blocks ``held`` left on ``prefill`` at ``now``; when
    they are gone (expired) it prefills them itself, counted as a failed transfer."""
    tokens = prefill.engine.hand_over(held.transfer_id, now * prefill.scale)
    prefill.refresh()
    if tokens is None:
        decode.engine.link.failed += 1
    else:
        seq.remote_tokens = min(tokens, seq.prompt_tokens - 1)
