"""The aiohttp application: what it is built from, its lifespan and the server runner (its
routes are router.routes)."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp
from aiohttp import web

from policies.base import Forgets, Policy, ReportsError
from policies.registry import BackendInfo, PolicyConfigError, build_policy
from policies.types import REQUEST_CLASSES
from router.backends.fleet import Fleet, Resolver, resolve_dns
from router.backends.fleet_load import Admitting, FleetLoad, RouterName, unique_name
from router.backends.health import HealthMonitor
from router.backends.pool import BackendState, Pool
from router.backends.shared import WorkerRow
from router.batch.service import BatchService
from router.config.model import ConfigError, RouterConfig
from router.control.admission import Admission
from router.control.auth import Gate, admin_only
from router.control.fair import Ledger
from router.control.placement import PlacementFeed, WorkerRings
from router.control.quota import QuotaStore, QuotaTable
from router.control.redis_quota import RedisQuotas
from router.control.slo import slo_table
from router.observe.capture import CaptureWriter
from router.observe.metrics import Metrics
from router.observe.tracing import Tracing, tracing_from_env
from router.proxy.drain import CLOSE_SECONDS
from router.proxy.keepalive import ConnectionPool
from router.proxy.shadow import Shadows
from router.proxy.state import RouterState, Snapshot
from router.reload import Reloader
from router.routes import add_routes, batch_off, openai_errors, proxied_routes, server_header
from router.server.descriptors import BACKLOG, Budget, connection_budget, open_descriptors
from router.server.errors import SERVER
from router.server.lean import Connections, LeanSite
from router.server.site import Cap, handler_options, single_headers

log = logging.getLogger("router")
STATE = web.AppKey("state", RouterState)
POLL = 0.05
"""Seconds between looks of a worker's first waiter for a slot another worker freed."""
RELOADER = web.AppKey("reloader", Reloader)


def build_policies(config: RouterConfig, metrics: Metrics | None = None) -> dict[str, Policy]:
    """Every named policy, built by the registry; raises ConfigError with all their errors.

    Policies are built against the configured backends (a discovered one by its configured
    name, which its replicas answer to: see policies.types.group_of). With ``metrics``,
    pipeline policies report each plugin's run time and emptied sets there.
    """
    infos = [BackendInfo(b.name, b.engine, b.priority_capable) for b in config.backends]
    out: dict[str, Policy] = {}
    errors: list[tuple[str, str]] = []
    observer = None if metrics is None else metrics.policy
    for spec in config.policies:
        try:
            out[spec.name] = build_policy(
                spec.name,
                spec.type,
                spec.params,
                infos,
                observer=observer,
                failover=config.failover.max_attempts,
            )
            if metrics is not None:
                metrics.policy_known(spec.name)
        except PolicyConfigError as exc:
            errors.extend((f"policies.{spec.name}.{path}", msg) for path, msg in exc.errors)
    if errors:
        raise ConfigError(errors)
    return out


def build_app(
    config: RouterConfig,
    *,
    metrics: Metrics | None = None,
    config_path: Path | None = None,
    resolver: Resolver = resolve_dns,
    shared: WorkerRow | None = None,
    quotas: QuotaTable | None = None,
    fairness: Ledger | None = None,
    placements: WorkerRings | None = None,
    router: RouterName | None = None,
    tracing: Tracing | None = None,
) -> web.Application:
    """The router app for ``config`` (backend URLs must be resolved already).

    With ``config_path``, ``POST /turnout/reload`` (and :data:`RELOADER`) reload from it.
    ``resolver`` looks up discovered backends' names (a test may give its own).
    ``shared``: this worker's row of the backend load its router's workers share;
    ``quotas``: its handle on their API keys' usage (router.control.quota), ``fairness``:
    on their admission queues' counters (router.control.fair_shared), ``placements``: on
    the rings their placements pass through (router.control.placement); ``router``:
    which router it is one of, for the in-flight counts replicas exchange
    (router.backends.fleet_load; by default a router of its own).
    ``tracing``: what the environment asks for unless given (router.observe.tracing).
    """
    metrics = metrics if metrics is not None else Metrics()
    if router is None:
        router = RouterName(unique_name(), publishes=True)
    pool = Pool(
        config.backends,
        config.aliases,
        config.health,
        on_panic=metrics.panic_routing,
        shared=shared,
        granted=config.limits.store.redis_url is not None,
    )
    policies = build_policies(config, metrics)
    gate = Gate(
        config.api_keys,
        required=config.require_api_key,
        protect_metrics=config.metrics_require_admin,
        anonymous=config.anonymous,
        store=_quota_store(config, quotas or QuotaTable.private(), metrics, router.publishes),
    )
    state = RouterState(
        snapshot=Snapshot(config, policies, gate, slo_table(policies, config.default_policy)),
        pool=pool,
        metrics=metrics,
        # A slot another worker frees wakes nobody here: its waiters look again now and then.
        admission=Admission(config.admission, fairness, None if fairness is None else POLL),
        shadows=Shadows(config.shadow, pool, metrics.shadow, config.limits),
        tracing=tracing if tracing is not None else tracing_from_env(),
    )
    for cls in REQUEST_CLASSES:
        metrics.watch_queue(cls, partial(state.admission.waiting, cls))
    for name, policy in policies.items():
        if isinstance(policy, ReportsError):
            for b in config.backends:
                metrics.policy.watch_prediction_error(
                    name, b.name, partial(_error, state, name, b.name)
                )
    # Bodies are size-checked by the handler so that the 413 is OpenAI-shaped.
    guards = [openai_errors, single_headers, admin_only(lambda: state.gate)]
    app = web.Application(client_max_size=config.listen.max_body_bytes, middlewares=guards)
    app[STATE] = state
    app.cleanup_ctx.append(
        partial(_lifespan, resolver=resolver, router=router, placements=placements)
    )
    app.on_response_prepare.append(server_header)
    add_routes(app, state)
    if config.batch is not None:  # after the app's own lifespan: lines need the router up
        BatchService(state, config.batch).install(app)
    else:
        for path in ("/v1/files", "/v1/files/{rest:.*}", "/v1/batches", "/v1/batches/{rest:.*}"):
            app.router.add_route("*", path, batch_off)
    if config_path is not None:
        app[RELOADER] = reloader = Reloader(
            state, config_path, partial(build_policies, metrics=metrics)
        )
        app.router.add_post("/turnout/reload", reloader.handle)
    return app


def _quota_store(
    config: RouterConfig, local: QuotaTable, metrics: Metrics, speaks: bool
) -> QuotaStore:
    """Redis when the config names one (``local`` decides while it is out), else ``local``;
    ``speaks``: this process logs the router's outages (router.backends.fleet_load)."""
    settings = config.limits.store
    if settings.redis_url is None:
        return local
    store = RedisQuotas(
        settings.redis_url,
        settings.on_error,
        local,
        on_local=metrics.stores.limits_local,
        speaks=speaks,
    )
    metrics.stores.watch_limits_store(lambda: 1.0 if store.up else 0.0)
    return store


def _error(state: RouterState, policy: str, backend: str) -> float:
    """The policy's prediction error for the backend, read from the live policy (a reload may
    have rebuilt it); NaN before it has one."""
    current = state.policies.get(policy)
    if not isinstance(current, ReportsError):
        return float("nan")
    return current.prediction_error().get(backend, float("nan"))


def _watch(metrics: Metrics, backend: BackendState) -> None:
    def inflight() -> float:
        return float(backend.inflight)

    def up() -> float:
        return 1.0 if backend.healthy else 0.0

    def grant() -> float:
        slots = backend.fleet.grant if backend.spec.max_inflight is not None else None
        return -1.0 if slots is None else float(slots)

    metrics.watch_backend(backend.name, inflight, up, grant if backend.fleet.granted else None)


def _left(state: RouterState, backend: BackendState) -> None:
    """A backend left the pool: its gauges go, its idle connections, and what the policies
    learned of it (policies.base.Forgets), so backends that come and go leave nothing."""
    state.metrics.unwatch_backend(backend.name)
    state.connections.forget(backend.spec.url, backend.tls)
    for policy in state.policies.values():
        if isinstance(policy, Forgets):
            try:
                policy.forget(backend.name)
            except Exception:  # an out-of-tree policy's bug must not stop the fleet
                log.exception("policy %s failed to forget %s", policy.name, backend.name)


async def _lifespan(
    app: web.Application, resolver: Resolver, router: RouterName, placements: WorkerRings | None
) -> AsyncIterator[None]:
    state = app[STATE]
    # limit=0: the router's own in-flight caps (max_inflight) bound the pool, not aiohttp.
    connector = aiohttp.TCPConnector(limit=0)
    # auto_decompress=False: the client gets the engine's bytes exactly as sent.
    session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, headers={"User-Agent": SERVER}
    )
    connections = ConnectionPool(state.config.limits.upstream_idle_seconds)
    writer = None
    if state.config.capture is not None:
        writer = CaptureWriter(
            state.config.capture,
            on_drop=state.metrics.capture.dropped,
            on_degraded=state.metrics.capture.degraded,
        )
        await writer.start()
    state.started(session, connections, writer)
    state.admission.listen()  # another worker may ring for this one's first waiter
    store = state.gate.store  # a reload's gate keeps it
    await store.start()
    monitor = HealthMonitor(session, state.config.health)
    state.fleet = Fleet(
        state.pool,
        monitor,
        added=partial(_watch, state.metrics),
        removed=partial(_left, state),
        resolver=resolver,
    )
    await state.fleet.start(state.config.backends)
    url = state.config.limits.store.redis_url
    load = None
    if url is not None:
        admission = state.admission
        admitting = Admitting(admission.release, admission.queues.queued, admission.taking)
        load = FleetLoad(url, state.pool, router, admitting, state.config.limits.store.on_error)
    if load is not None:
        await load.start()
    feed = PlacementFeed(
        lambda: state.policies, placements, url, router.id, speaks=router.publishes
    )
    if feed.active:
        state.placement = feed
        await feed.start()
        if url is not None:
            state.metrics.stores.watch_placement(lambda: 1.0 if feed.shared else 0.0)
    try:
        yield
    finally:
        state.admission.close()
        state.placement = None
        await feed.aclose()
        if load is not None:
            await load.aclose()
        await state.fleet.aclose()
        state.fleet = None
        await monitor.aclose()
        await state.shadows.aclose()
        await store.aclose()
        state.stopped()
        if writer is not None:
            await writer.aclose()
        state.tracing.close()
        await session.close()
        connections.close()
        state.access_log.flush()


@dataclass(frozen=True, slots=True)
class Served:
    """A running router: its runner (for cleanup), the URL it listens on, its lean
    server's connections and the descriptor budget they were sized in."""

    runner: web.AppRunner
    url: str
    connections: Connections
    budget: Budget


async def serve(app: web.Application, sock: socket.socket) -> Served:
    """Start ``app`` on an already bound listening socket.

    ``handler_cancellation``: a client disconnect cancels the handler, which closes the
    upstream request at once and frees the engine's slot. TCP_NODELAY is set on every
    accepted socket (aiohttp's base protocol) and upstream socket (router.proxy.connection).
    The connection cap and the listen backlog are sized within the descriptors left once the
    app has started (router.server.descriptors).
    """
    state = app[STATE]
    config = state.config
    options = {"access_log": None, **handler_options(config.limits)}
    connections = Connections()
    app.on_shutdown.append(lambda _: connections.close(CLOSE_SECONDS))
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        # SIGTERM's drain is the router's own (router.proxy.drain), done before cleanup.
        shutdown_timeout=CLOSE_SECONDS,
        **options,
    )
    await runner.setup()
    budget = connection_budget(config, open_descriptors())
    if budget.lowered(config.limits.max_connections):
        log.warning(
            "limits.max_connections lowered from %d to %d: the file descriptor limit is %d, "
            "%d are open and %d kept for probes, mirrors and batch lines, and each connection "
            "may need one more for its upstream request (raise the hard limit, ulimit -Hn, "
            "for more)",
            config.limits.max_connections,
            budget.max_connections,
            budget.soft_limit,
            budget.open_at_start,
            budget.reserved,
        )
    site = LeanSite(
        runner,
        sock,
        config.limits,
        options,
        backlog=budget.backlog,
        cap=Cap(budget.max_connections, state.metrics.connection_refused),
        routes=proxied_routes(state),
        max_body=config.listen.max_body_bytes,
        connections=connections,
    )
    await site.start()
    host, port = sock.getsockname()[:2]
    return Served(runner, f"http://{host}:{port}", connections, budget)


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound, listening TCP socket (SO_REUSEPORT lets several workers share one port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock
