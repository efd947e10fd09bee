"""Configuration reload without a restart (SIGHUP or ``POST /turnout/reload``).

A reload reads the config file again, validates it completely (the same checks as at start,
plus the API keys' sources) and only then swaps it in; an invalid file is refused with every
error and the running config stays. The config, policies, API keys and SLO targets are
swapped as one value (router.proxy.state.Snapshot), which a request takes once when it
begins: an in-flight request keeps the snapshot it started with (and its backend and key
lease), so it sees the old settings or the new ones whole, and nothing is dropped.

What a reload can change: policies (unchanged ones keep their learned state while the
configured backends stay the same), the default policy, the policy header switch, API keys
and their limits, classification, timeouts, failover, aliases, the access log, and the
backends: added, removed, re-pointed or re-discovered (router.backends.fleet; a removed
backend's streams finish, the reload answers once the new backends were probed). Backends
the router runs as emulator children, and the ``health``, ``capture``, ``limits``,
``shutdown``, ``admission`` and ``shadow`` sections, take a restart; a reload that changes
them is refused, as is a new ``listen.max_body_bytes``; ``listen.host``/``port`` stay as
running (the socket is already bound).

Shutdown is not a reload's: SIGTERM's drain is router.proxy.drain's (open requests run to
``shutdown.drain_seconds``, then each is cut with an error its client can read).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
from aiohttp import web

from policies.base import Policy
from router.config.model import BackendSpec, ConfigError, RouterConfig
from router.config.parse import read_config
from router.control.auth import Gate
from router.control.slo import slo_table
from router.proxy.state import RouterState, Snapshot
from router.server.errors import RouterError, error_response

log = logging.getLogger("router")
BuildPolicies = Callable[[RouterConfig], dict[str, Policy]]
_RESTART = ("health", "capture", "limits", "shutdown", "admission", "shadow")


class Reloader:
    """Reloads one app's config from ``path``."""

    def __init__(self, state: RouterState, path: Path, build: BuildPolicies) -> None:
        self._state = state
        self._path = path
        self._build = build
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def reload(self) -> list[tuple[str, str]]:
        """Apply the file's config; the errors that refused it (empty when applied)."""
        errors: list[tuple[str, str]] = []
        new = read_config(self._path, errors)
        try:
            self._apply(new, errors)
        except ConfigError as exc:
            for key, message in exc.errors:
                log.warning("reload refused: %s: %s", key, message)
            return exc.errors
        log.info("reloaded %s", self._path)
        return []

    def on_signal(self) -> None:
        """SIGHUP: reload from the event loop, one at a time."""
        task = asyncio.get_running_loop().create_task(self._locked())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _locked(self) -> None:
        async with self._lock:
            if not self.reload() and self._state.fleet is not None:
                await self._state.fleet.settled()

    async def handle(self, _: web.Request) -> web.Response:
        """``POST /turnout/reload`` (admin): 200 when applied (new backends probed and
        in the pool, discovered names looked up), 400 with the errors."""
        async with self._lock:
            errors = self.reload()
            if not errors and self._state.fleet is not None:
                await self._state.fleet.settled()
        if errors:
            message = "; ".join(f"{k}: {m}" if k else m for k, m in errors)
            err = RouterError(
                400, f"config refused, old one kept: {message}", code="invalid_config"
            )
            return error_response(err)
        body = orjson.dumps({"status": "reloaded", "path": str(self._path)})
        return web.Response(body=body, content_type="application/json")

    def _apply(self, new: RouterConfig, errors: list[tuple[str, str]]) -> None:
        """Swap ``new`` in; raises ConfigError with ``errors`` (parsing's) and every other."""
        state, old = self._state, self._state.config
        restart = [
            (k, "changing it needs a restart")
            for k in _RESTART
            if getattr(new, k) != getattr(old, k)
        ]
        if new.listen.max_body_bytes != old.listen.max_body_bytes:  # aiohttp holds the old one
            restart.append(("listen.max_body_bytes", "changing it needs a restart"))
        specs = _backends(old.backends, new.backends, restart)
        if not errors:  # else ``new`` has fallbacks for wrong values: changes nobody made
            errors.extend(restart)
        gate: Gate | None = None
        try:
            gate = Gate(
                new.api_keys,
                required=new.require_api_key,
                protect_metrics=new.metrics_require_admin,
                anonymous=new.anonymous,
                store=state.gate.store,  # usage carries over: a reload resets nobody's quota
            )
        except ConfigError as exc:
            errors.extend(exc.errors)
        policies: dict[str, Policy] = {}
        try:
            policies = self._build(replace(new, backends=specs))
        except ConfigError as exc:
            errors.extend(exc.errors)
        if errors or gate is None:
            raise ConfigError(errors)
        # Keep the live (learning) instance of an unchanged policy, unless the backends it
        # was built against changed: it may have resolved an engine kind to a list of names.
        if _infos(old.backends) == _infos(specs):
            for policy in old.policies:
                if policy in new.policies:
                    policies[policy.name] = state.policies[policy.name]
        if state.fleet is not None:
            state.fleet.apply(specs)
        state.pool.aliases = new.aliases
        # One assignment: a request that began before it keeps the old snapshot whole.
        state.snapshot = Snapshot(
            replace(
                new,
                listen=replace(new.listen, host=old.listen.host, port=old.listen.port),
                backends=specs,
            ),
            policies,
            gate,
            slo_table(policies, new.default_policy),
        )


def _backends(
    old: tuple[BackendSpec, ...], new: tuple[BackendSpec, ...], errors: list[tuple[str, str]]
) -> tuple[BackendSpec, ...]:
    """The new specs, emulator children's with their running URLs; errors for changes to
    those (their children are started with the router)."""
    running = {b.name: b for b in old if b.emulator is not None}
    out = []
    for i, spec in enumerate(new):
        was = running.pop(spec.name, None)
        if was is not None and spec.emulator is not None:
            spec = replace(spec, url=was.url)  # filled in when its child started
        changed = was is not None and was.emulator != spec.emulator
        if changed or (was is None) != (spec.emulator is None):
            errors.append((f"backends[{i}]", "emulator backends are fixed at start (restart)"))
        out.append(spec)
    for name in running:
        errors.append(("backends", f"emulator backend {name!r} is fixed at start (restart)"))
    return tuple(out)


def _infos(specs: tuple[BackendSpec, ...]) -> list[tuple[str, str, bool]]:
    return [(b.name, b.engine, b.priority_capable) for b in specs]
