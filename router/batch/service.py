"""The Batch API of one router app: its store, executor and routes together."""

from __future__ import annotations

import fcntl
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from router.batch.api import BatchApi
from router.batch.executor import Executor
from router.batch.metrics import BatchMetrics
from router.batch.pacing import Pacer
from router.batch.sql import SqlStore
from router.config.batch import BatchSettings
from router.proxy.state import RouterState


def store_url(settings: BatchSettings) -> str:
    """The configured store, or ``batch.db`` in the data directory."""
    if settings.store:
        return settings.store
    return "sqlite:///" + str(Path(settings.data_dir).resolve() / "batch.db")


class StoreBusy(Exception):
    """Another router holds the SQLite store."""


def claim_store(url: str) -> int | None:
    """Make a SQLite store's directory and hold its lock file for this router, whose
    workers inherit it; the returned descriptor is kept open for the process's life.

    Two routers on one file would take each other's lines and run them on their own
    backends (another config's, a test run's): the second is refused, naming the first's
    pid. Replicas share a PostgreSQL store instead, which needs no claim (None).
    Raises :class:`StoreBusy`, or OSError when the directory cannot be made.
    """
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url.removeprefix("sqlite:///"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 16, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StoreBusy(
            f"the batch store {path} is in use by another router (pid {holder}); give this "
            "one its own with batch.data_dir or XDG_DATA_HOME (replicas share a PostgreSQL "
            "batch.store)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


class BatchService:
    """Serves ``/v1/files`` and ``/v1/batches`` and runs the batches' lines."""

    def __init__(self, state: RouterState, settings: BatchSettings) -> None:
        self._state = state
        self._store = SqlStore(store_url(settings))
        targets = state.slo.get(state.config.default_policy)
        slo_ttft = targets["interactive"].ttft_s if targets is not None else None
        self.pacer = Pacer(settings, slo_ttft)
        self.executor = Executor(
            self._store, state, self.pacer, BatchMetrics(state.metrics.registry), settings
        )
        self._api = BatchApi(self._store, settings, state, self.executor.wake)

    def install(self, app: web.Application) -> None:
        """Add the routes, and the store and executor to the app's start and cleanup."""
        self._api.add_routes(app)
        app.cleanup_ctx.append(self._lifespan)

    async def _lifespan(self, _: web.Application) -> AsyncIterator[None]:
        await self._store.open()
        self._state.on_finish.append(self.pacer.observe)
        self.executor.start()
        try:
            yield
        finally:
            await self.executor.aclose()
            self._state.on_finish.remove(self.pacer.observe)
            await self._store.close()
