"""The simulated deployment: the router's own pool and policies over engine models.

Every backend of the config gets the engine model of its emulator profile (or of the profile
named for it, for a real engine) and the router's own :class:`~router.backends.pool.
BackendState` on the virtual clock, so a policy gets the very snapshots the router would
build: in-flight counts and outstanding tokens kept by leases, the load scraped every
``health.scrape_interval`` with its age and staleness. Policies are built by the router's
own :func:`~router.app.build_policies` from the same config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from emulator.model import Engine
from emulator.profiles import Profile, load_profile
from policies.base import Policy
from policies.types import EngineLoad
from router.app import build_policies
from router.backends.pool import BackendState, Pool
from router.config.model import ConfigError, RouterConfig


@dataclass(slots=True)
class Backend:
    """One backend: the router's state of it and the engine model behind it."""

    state: BackendState
    engine: Engine
    profile: Profile
    scale: float
    """The emulator's time scale: engine seconds per virtual second."""
    seed: int
    deadline: float | None = None
    """The engine's next event in virtual seconds, as last asked."""
    engine_deadline: float = 0.0
    """The same in engine seconds (a round trip through the time scale may not return it)."""

    def scrape(self) -> None:
        """What the router reads from the engine's /metrics (vLLM's names)."""
        e, p = self.engine, self.profile
        kv_tokens = float(p.kv_blocks_per_rank * p.kv_block_size * len(e.ranks))
        self.state.set_load(
            EngineLoad(float(e.num_waiting), float(e.num_running), e.kv_usage(), kv_tokens)
        )

    def refresh(self) -> float | None:
        """Ask the engine for its next event (virtual seconds) and remember it."""
        t = self.engine.next_deadline()
        self.deadline = None if t is None else t / self.scale
        self.engine_deadline = t or 0.0
        return self.deadline


class World:
    """The backends and policies of one config on one virtual clock."""

    def __init__(self, config: RouterConfig, profiles: Mapping[str, str]) -> None:
        self.now = 0.0
        self.config = config
        self.pool = Pool(config.backends, config.aliases, config.health, clock=self._clock)
        errors: list[tuple[str, str]] = []
        self.backends: list[Backend] = []
        for i, spec in enumerate(config.backends):
            if spec.discover is not None:  # its replicas are found by DNS at run time only
                errors.append((f"backends[{i}]", f"{spec.name}: discovered; list its replicas"))
                continue
            name = profiles.get(spec.name) or (spec.emulator.profile if spec.emulator else None)
            if name is None:
                errors.append((f"backends[{i}]", f"{spec.name}: no emulator; name a --profile"))
                continue
            emu = spec.emulator
            profile = load_profile(name, emu.profile_overrides() if emu else None)
            state = self.pool.by_name[spec.name]
            # What the router's probes would find: the served model and its context length.
            served = spec.emulator.model if spec.emulator is not None else None
            state.discovered_models = (served or profile.model,)
            state.context_tokens = profile.max_model_len
            self.backends.append(
                Backend(
                    state,
                    Engine(profile, seed=emu.seed if emu else 0),
                    profile,
                    emu.time_scale if emu else 1.0,
                    emu.seed if emu else 0,
                )
            )
        if errors:
            raise ConfigError(errors)
        self.by_name = {b.state.name: b for b in self.backends}
        self.policies: dict[str, Policy] = build_policies(config)

    def _clock(self) -> float:
        return self.now

    def model(self) -> str:
        """The model imported traces ask for: the router's first listed one."""
        ids = self.pool.model_ids()
        return ids[0] if ids else "default"
