"""The Batch API of one router app: its store, line site, executor and routes together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from router.batch.api import BatchApi
from router.batch.executor import Executor
from router.batch.lines import LineSite
from router.batch.metrics import BatchMetrics
from router.batch.pacing import Pacer
from router.batch.sql import SqlStore
from router.config.model import BatchSettings
from router.proxy.state import RouterState


def store_url(settings: BatchSettings) -> str:
    """The configured store, or ``batch.db`` in the data directory."""
    if settings.store:
        return settings.store
    return "sqlite:///" + str(Path(settings.data_dir).resolve() / "batch.db")


class BatchService:
    """Serves ``/v1/files`` and ``/v1/batches`` and runs the batches' lines."""

    def __init__(self, state: RouterState, settings: BatchSettings) -> None:
        self._state = state
        self._store = SqlStore(store_url(settings))
        targets = state.slo.get(state.config.default_policy)
        slo_ttft = targets["interactive"].ttft_s if targets is not None else None
        self.pacer = Pacer(settings, slo_ttft)
        self._site = LineSite(state)
        self.executor = Executor(
            self._store, self._site, self.pacer, BatchMetrics(state.metrics.registry), settings
        )
        self._api = BatchApi(self._store, settings, lambda: state.gate, self.executor.wake)

    def install(self, app: web.Application) -> None:
        """Add the routes, and the store and executor to the app's start and cleanup."""
        self._api.add_routes(app)
        app.cleanup_ctx.append(self._lifespan)

    async def _lifespan(self, _: web.Application) -> AsyncIterator[None]:
        await self._store.open()
        await self._site.start()
        self._state.on_finish.append(self.pacer.observe)
        self.executor.start()
        try:
            yield
        finally:
            await self.executor.aclose()
            self._state.on_finish.remove(self.pacer.observe)
            await self._site.aclose()
            await self._store.close()
