"""The live objects one router process works with."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from policies.base import Policy
from router.backends.pool import Pool
from router.config.parse import RouterConfig
from router.control.admission import Admission
from router.control.auth import Gate
from router.control.slo import SloTable
from router.observe.capture import CaptureWriter
from router.observe.metrics import Metrics
from router.proxy.connection import ConnectionPool
from router.proxy.shadow import Shadows


@dataclass(slots=True)
class RouterState:
    """Everything a request handler needs; one per app, never module-level.

    ``session``, ``upstreams`` and ``capture`` exist only between the app's startup and
    cleanup phases. ``upstreams`` carries the proxied requests (router.proxy.connection);
    ``session`` the router's own calls (health probes, scrapes, shadow mirrors).
    """

    config: RouterConfig
    pool: Pool
    policies: dict[str, Policy]
    metrics: Metrics
    gate: Gate
    """Client API keys and their limits (swapped whole by a reload)."""
    admission: Admission
    shadows: Shadows
    slo: SloTable = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    upstreams: ConnectionPool | None = None
    capture: CaptureWriter | None = None

    @property
    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the router app has not been started")
        return self.session

    @property
    def connections(self) -> ConnectionPool:
        if self.upstreams is None:
            raise RuntimeError("the router app has not been started")
        return self.upstreams
