"""The live objects one router app works with."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from policies.base import Policy
from router.backends.fleet import Fleet
from router.backends.pool import Pool
from router.config.model import RouterConfig
from router.control.admission import Admission
from router.control.auth import Gate
from router.control.placement import PlacementFeed
from router.control.slo import SloTable
from router.control.tailstate import TailMemory
from router.observe.access import AccessLog
from router.observe.capture import CaptureWriter
from router.observe.metrics import Metrics
from router.observe.tracing import NoTracing, Tracing
from router.proxy.drain import Drain
from router.proxy.keepalive import ConnectionPool
from router.proxy.shadow import Shadows


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a reload changes, swapped as one value (router.reload): a request takes it once,
    when it begins, and sees one config whole, its policies, keys and targets with it, however
    long it runs and whatever is reloaded meanwhile."""

    config: RouterConfig
    policies: Mapping[str, Policy]
    gate: Gate
    """Client API keys and their limits."""
    slo: SloTable


@dataclass(slots=True)
class RouterState:
    """Everything a request handler needs; one per app, never module-level.

    The I/O objects (:attr:`session`, :attr:`connections`, :attr:`capture`) exist only
    between the app's startup and cleanup phases (:meth:`started`, :meth:`stopped`).
    """

    snapshot: Snapshot
    """The reloadable part, whole: a request reads this once (its one writer: a reload)."""
    pool: Pool
    metrics: Metrics
    admission: Admission
    shadows: Shadows
    drain: Drain = field(default_factory=Drain)
    """The open requests, for SIGTERM's drain."""
    capture: CaptureWriter | None = None
    """The capture writer, when the config captures."""
    access_log: AccessLog = field(default_factory=AccessLog)
    fleet: Fleet | None = None
    """Adds and removes backends (between the app's startup and cleanup)."""
    on_finish: list[Callable[[str, str, float | None, str], None]] = field(default_factory=list)
    """Told each finished request's class, backend, TTFT and reason (the batch pacing)."""
    tracing: Tracing = field(default_factory=NoTracing)
    """Request traces (router.observe.tracing): a no-op unless OpenTelemetry is set up."""
    tail: TailMemory = field(default_factory=TailMemory)
    """Hedge budgets and measured TTFTs of the classes with ``tail`` settings."""
    placement: PlacementFeed | None = None
    """Passes this process's placements to the router's others (router.control.placement),
    while the app runs and anyone listens."""
    _session: aiohttp.ClientSession | None = None
    _connections: ConnectionPool | None = None

    @property
    def config(self) -> RouterConfig:
        """The current config (a request reads its :attr:`snapshot` instead, once)."""
        return self.snapshot.config

    @property
    def policies(self) -> Mapping[str, Policy]:
        return self.snapshot.policies

    @property
    def gate(self) -> Gate:
        return self.snapshot.gate

    @property
    def slo(self) -> SloTable:
        return self.snapshot.slo

    @property
    def session(self) -> aiohttp.ClientSession:
        """The router's own HTTP calls: health probes, scrapes, shadow mirrors."""
        if self._session is None:
            raise RuntimeError("the router app has not been started")
        return self._session

    @property
    def connections(self) -> ConnectionPool:
        """Keep-alive connections that carry the proxied requests (router.proxy.connection)."""
        if self._connections is None:
            raise RuntimeError("the router app has not been started")
        return self._connections

    def started(
        self,
        session: aiohttp.ClientSession,
        connections: ConnectionPool,
        capture: CaptureWriter | None,
    ) -> None:
        """The app's startup phase opened its I/O objects."""
        self._session, self._connections, self.capture = session, connections, capture

    def stopped(self) -> None:
        """The app's cleanup phase closed them."""
        self._session = self._connections = self.capture = None
