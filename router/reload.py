"""Configuration reload without a restart (SIGHUP or ``POST /switchyard/reload``).

A reload reads the config file again, validates it completely (the same checks as at start,
plus the API keys' sources) and only then swaps it in; an invalid file is refused with every
error and the running config stays. In-flight requests keep the objects they started with
(their policy, backend and key lease), so nothing is dropped.

What a reload can change: policies (unchanged ones keep their learned state), the default
policy, the policy header switch, API keys and their limits, classification, timeouts,
failover, aliases, the access log, and each backend's models, ``max_inflight`` and
``priority_capable``.
Adding, removing or re-pointing backends, and the ``health``, ``capture``, ``limits``,
``shutdown``, ``admission`` and ``shadow`` sections, take a restart; a reload that changes
them is refused, as is a new ``listen.max_body_bytes``; ``listen.host``/``port`` stay as
running (the socket is already bound).

Graceful shutdown itself needs no code here: the runner is built with
``shutdown_timeout = shutdown.drain_seconds``, so on SIGTERM aiohttp closes the listening
socket and idle connections, lets running handlers finish for up to that long, then cancels
them; the app's cleanup then flushes the capture.
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
from router.backends.pool import Pool
from router.config.model import BackendSpec, ConfigError, RouterConfig
from router.config.parse import read_config
from router.control.auth import Gate
from router.control.slo import slo_table
from router.proxy.state import RouterState
from router.server.errors import RouterError, error_response

log = logging.getLogger("router")
BuildPolicies = Callable[[RouterConfig, Pool], dict[str, Policy]]
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
            self.reload()

    async def handle(self, _: web.Request) -> web.Response:
        """``POST /switchyard/reload`` (admin): 200 when applied, 400 with the errors."""
        async with self._lock:
            errors = self.reload()
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
            )
        except ConfigError as exc:
            errors.extend(exc.errors)
        policies: dict[str, Policy] = {}
        try:
            policies = self._build(new, state.pool)
        except ConfigError as exc:
            errors.extend(exc.errors)
        if errors or gate is None:
            raise ConfigError(errors)
        for policy in old.policies:  # keep the live (learning) instance of an unchanged policy
            if policy in new.policies:
                policies[policy.name] = state.policies[policy.name]
        for backend, spec in zip(state.pool.backends, specs, strict=True):
            backend.spec = spec
        state.pool.aliases = new.aliases
        state.policies = policies
        state.slo = slo_table(policies, new.default_policy)
        gate.adopt(state.gate)  # usage carries over: a reload resets nobody's quota
        state.gate = gate
        state.config = replace(
            new,
            listen=replace(new.listen, host=old.listen.host, port=old.listen.port),
            backends=specs,
        )


def _backends(
    old: tuple[BackendSpec, ...], new: tuple[BackendSpec, ...], errors: list[tuple[str, str]]
) -> tuple[BackendSpec, ...]:
    """The new specs with the running URLs; errors for changes that need a restart."""
    if [b.name for b in old] != [b.name for b in new]:
        errors.append(("backends", "adding, removing or reordering backends needs a restart"))
        return old
    out = []
    for i, (o, n) in enumerate(zip(old, new, strict=True)):
        # An emulator backend's URL is filled in when its child starts: keep the running one.
        n = replace(n, url=o.url) if n.emulator is not None else n
        for key in ("url", "engine", "emulator", "api_key_env"):
            if getattr(o, key) != getattr(n, key):
                errors.append((f"backends[{i}].{key}", "changing it needs a restart"))
        out.append(n)
    return tuple(out)
