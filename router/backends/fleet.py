"""The live backend set: the configured backends, plus one per address behind a DNS name.

The :class:`Fleet` keeps the pool equal to what the config asks for: at start, on a reload
(:meth:`Fleet.apply`) and whenever a discovered name resolves to other addresses. Each change
is a set difference:

- a new backend is probed once (health, models, load) before it joins the pool, so no
  request goes to one the router has not judged; then its probe loop and gauges start;
- a removed backend leaves the pool at once (no new request picks it), its probe loop stops
  and its gauges go; the requests it holds finish on the object their lease keeps;
- a backend whose address, engine, key or TLS settings changed is removed and added again
  (a new breaker, a new connection pool key); one whose other settings changed (models,
  ``max_inflight``, ...) keeps its state and gets the new spec.

Discovery (``discover: {dns, port, scheme, interval_seconds}``) names each replica
``<backend>@<address>`` (``vllm@10.0.3.7``), so health, scraped load, breaker, affinity and
metrics are per replica, while policies still refer to the configured name (see
:func:`policies.types.group_of`). A lookup that fails keeps the last set: a DNS outage must
not empty the pool, and the probes still judge each replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from router.backends.health import HealthMonitor
from router.backends.pool import BackendState, Pool
from router.config.backends import TlsFileError
from router.config.model import BackendSpec, UpstreamTls

log = logging.getLogger("router")
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(name, port)`` -> the addresses behind it (raises OSError when the lookup fails)."""
Hook = Callable[[BackendState], None]
MAX_REPLICAS = 256
"""The most replicas one name may bring in (a broken or hostile DNS answer is cut there)."""
_REPLACE = ("url", "engine", "api_key_env", "tls")
"""What a backend is: changing any of it makes a new backend (see the module docstring)."""


async def resolve_dns(name: str, port: int) -> list[str]:
    """Every address ``name`` resolves to (IPv4 and IPv6), through the system's resolver.

    Link-local IPv6 addresses (``fe80::1%eth0``) are left out: their zone names an interface
    of one host, and no pod is reached that way.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({a for info in infos if "%" not in (a := str(info[4][0]))})


def replica(spec: BackendSpec, address: str) -> BackendSpec:
    """The backend for one address behind ``spec``'s DNS name.

    Over https its certificate is checked against the DNS name unless ``tls.server_name``
    says otherwise: the address is only where the name led.
    """
    d = spec.discover
    assert d is not None
    host = f"[{address}]" if ":" in address else address
    tls = None
    if d.scheme == "https":
        tls = spec.tls or UpstreamTls()
        if tls.verify and tls.server_name is None:
            tls = replace(tls, server_name=d.dns.rstrip("."))
    return replace(
        spec,
        name=f"{spec.name}@{address}",
        url=f"{d.scheme}://{host}:{d.port}",
        tls=tls,
        discover=None,
    )


class Fleet:
    """Adds and removes the pool's backends; see the module docstring."""

    def __init__(
        self,
        pool: Pool,
        monitor: HealthMonitor,
        *,
        added: Hook,
        removed: Hook,
        resolver: Resolver = resolve_dns,
        lookup_timeout: float = 5.0,
    ) -> None:
        """``added``/``removed`` are called as a backend joins or leaves the pool."""
        self._pool = pool
        self._monitor = monitor
        self._added = added
        self._removed = removed
        self._resolver = resolver
        self._lookup_timeout = lookup_timeout
        self._specs: tuple[BackendSpec, ...] = ()
        self._found: dict[str, list[str]] = {}
        """Configured name -> the addresses its last successful lookup gave."""
        self._lookups: dict[str, asyncio.Task[None]] = {}
        self._looked_up: dict[str, asyncio.Event] = {}
        self._joining: dict[str, _Join] = {}

    async def start(self, specs: tuple[BackendSpec, ...]) -> None:
        """Judge the configured backends already in the pool, start discovery, and return
        once every backend found so far has been probed (so /ready is right at once)."""
        backends = list(self._pool.backends)
        await asyncio.gather(*(self._monitor.first(b) for b in backends))
        for b in backends:
            self._monitor.watch(b)
            self._added(b)
        self.apply(specs)
        await self.settled()

    def apply(self, specs: tuple[BackendSpec, ...]) -> None:
        """Make the pool follow ``specs`` (a new config's backends, URLs resolved)."""
        old = {s.name: s for s in self._specs if s.discover is not None}
        self._specs = specs
        for spec in specs:
            if spec.discover is None:
                continue
            if old.pop(spec.name, None) != spec or spec.name not in self._lookups:
                self._stop_lookups(spec.name)
                self._looked_up[spec.name] = asyncio.Event()
                self._lookups[spec.name] = asyncio.create_task(self._discover(spec))
        for name in old:
            self._stop_lookups(name)
            self._found.pop(name, None)
        self._sync()

    async def settled(self) -> None:
        """Wait until each discovered name was looked up once and every new backend was
        probed and joined (or failed to)."""
        await asyncio.gather(*(e.wait() for e in list(self._looked_up.values())))
        while self._joining:
            await asyncio.gather(*(j.task for j in self._joining.values()), return_exceptions=True)

    async def aclose(self) -> None:
        tasks = [*self._lookups.values(), *(j.task for j in self._joining.values())]
        self._lookups.clear()
        self._joining.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    # -- internals --------------------------------------------------------------------------

    def _wanted(self) -> dict[str, BackendSpec]:
        out: dict[str, BackendSpec] = {}
        for spec in self._specs:
            if spec.discover is None:
                out[spec.name] = spec
                continue
            for address in self._found.get(spec.name, ()):
                member = replica(spec, address)
                out[member.name] = member
        return out

    def _sync(self) -> None:
        """Add, remove and update backends until the pool holds what :meth:`_wanted` says."""
        wanted = self._wanted()
        for backend in list(self._pool.backends):
            spec = wanted.get(backend.name)
            if spec is None or _differs(backend.spec, spec):
                self._leave(backend)
            else:
                backend.spec = spec
        for name in list(self._joining):
            join, spec = self._joining[name], wanted.get(name)
            if spec is None or _differs(join.spec, spec):
                del self._joining[name]
                join.task.cancel()
            else:
                join.spec = spec  # it joins with the latest models, limits, ...
        for name, spec in wanted.items():
            if name not in self._pool.by_name and name not in self._joining:
                join = _Join(spec)
                self._joining[name] = join
                join.task = asyncio.create_task(self._join(join))

    async def _join(self, join: _Join) -> None:
        name = join.spec.name
        try:
            try:
                backend = self._pool.state(join.spec)
            except TlsFileError as exc:  # the files changed since the config was checked
                log.warning("backend %s not added: tls.%s", name, exc)
                return
            await self._monitor.first(backend)
            backend.spec = join.spec
            self._pool.add(backend)
            self._monitor.watch(backend)
            self._added(backend)
            log.info("backend %s added (%s)", name, "healthy" if backend.healthy else "down")
        finally:
            if self._joining.get(name) is join:
                del self._joining[name]

    def _leave(self, backend: BackendState) -> None:
        self._pool.remove(backend.name)
        self._monitor.unwatch(backend)
        self._removed(backend)
        log.info("backend %s removed (%d requests still finishing)", backend.name, backend.inflight)

    def _stop_lookups(self, name: str) -> None:
        task = self._lookups.pop(name, None)
        if task is not None:
            task.cancel()
        event = self._looked_up.pop(name, None)
        if event is not None:
            event.set()  # nobody waits for a lookup that will not come

    async def _discover(self, spec: BackendSpec) -> None:
        d = spec.discover
        assert d is not None
        failing = False
        while True:
            try:
                async with asyncio.timeout(self._lookup_timeout):
                    found = await self._resolver(d.dns, d.port)
            except Exception as exc:  # OSError, a timeout, UnicodeError for a bad label, ...
                if not failing:  # once per outage, not once per interval
                    log.warning("backend %s: lookup of its DNS name failed (%s); keeping "
                                "the last set", spec.name, exc.__class__.__name__)  # fmt: skip
                failing = True
            else:
                failing = False
                self._found_now(spec.name, found)
            if (event := self._looked_up.get(spec.name)) is not None:
                event.set()
            await asyncio.sleep(d.interval)

    def _found_now(self, name: str, addresses: Iterable[str]) -> None:
        found = sorted(set(addresses))
        if len(found) > MAX_REPLICAS:
            log.warning("backend %s: %d addresses, only the first %d used",
                        name, len(found), MAX_REPLICAS)  # fmt: skip
            found = found[:MAX_REPLICAS]
        if found != self._found.get(name):
            self._found[name] = found
            self._sync()


class _Join:
    """A backend on its way into the pool: the spec it will join with, and the task."""

    __slots__ = ("spec", "task")

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec
        self.task: asyncio.Task[None]


def _differs(old: BackendSpec, new: BackendSpec) -> bool:
    return any(getattr(old, key) != getattr(new, key) for key in _REPLACE)
