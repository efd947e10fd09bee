"""Background probes: each backend's /health, its /v1/models and its engine /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import aiohttp
import orjson

from router.backends.engines import parse_load
from router.backends.pool import BackendState
from router.config.backends import shown_url
from router.config.model import HealthSettings


class HealthMonitor:
    """Runs one probe loop per watched backend (router.backends.fleet decides which)."""

    def __init__(self, session: aiohttp.ClientSession, settings: HealthSettings) -> None:
        self._session = session
        self._settings = settings
        self._tasks: dict[BackendState, asyncio.Task[None]] = {}

    async def first(self, backend: BackendState) -> None:
        """Probe, list models and scrape once: a backend is judged before it is offered."""
        await self._round(backend, models=True, scrape=True, first=True)

    def watch(self, backend: BackendState) -> None:
        """Keep probing ``backend`` until :meth:`unwatch`."""
        self._tasks[backend] = asyncio.create_task(self._loop(backend))

    def unwatch(self, backend: BackendState) -> None:
        """Stop probing ``backend`` (its loop is cancelled; nothing waits for it)."""
        task = self._tasks.pop(backend, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _loop(self, backend: BackendState) -> None:
        s = self._settings
        now = time.monotonic()
        next_probe = now + s.interval
        next_models = now + s.models_refresh
        next_scrape = now + s.scrape_interval
        while True:
            wake = min(next_probe, next_models, next_scrape if s.scrape_metrics else next_probe)
            await asyncio.sleep(max(0.0, wake - time.monotonic()))
            now = time.monotonic()
            probe, models = now >= next_probe, now >= next_models
            scrape = s.scrape_metrics and now >= next_scrape
            if probe:
                next_probe = now + s.interval
            if models:
                next_models = now + s.models_refresh
            if scrape:
                next_scrape = now + s.scrape_interval
            await self._round(backend, models=models, scrape=scrape, probe=probe)

    async def _round(
        self,
        backend: BackendState,
        *,
        models: bool,
        scrape: bool,
        probe: bool = True,
        first: bool = False,
    ) -> None:
        if probe:
            body = await self._get(backend, "/health")
            if isinstance(body, bytes):
                backend.probe_result(True, first=first)
            else:
                where = f"GET {shown_url(backend.spec.url)}/health"
                backend.probe_result(False, first=first, problem=f"{where}: {body}")
        if models and not backend.spec.models:
            body = await self._get(backend, "/v1/models")
            if isinstance(body, bytes):
                backend.discovered_models, backend.context_tokens = _models(body)
        if scrape and self._settings.scrape_metrics:
            body = await self._get(backend, "/metrics")
            if isinstance(body, bytes):
                backend.set_load(parse_load(body.decode(errors="replace"), backend.spec.engine))

    async def _get(self, backend: BackendState, path: str) -> bytes | str:
        """The body of a 200 answer, or what went wrong (``404 Not Found``, ``Connection
        refused``, ...): the probe's verdict, and its reason."""
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout)
        try:
            async with self._session.get(
                backend.spec.url + path,
                headers=headers,
                timeout=timeout,
                ssl=backend.ssl,
                server_hostname=backend.server_name,
            ) as resp:
                if resp.status != 200:
                    # The reason phrase is the backend's: bounded and printable only.
                    phrase = "".join(c for c in (resp.reason or "")[:64] if c.isprintable())
                    return f"{resp.status} {phrase}".rstrip()
                return await resp.read()
        except TimeoutError:
            return f"no answer within {self._settings.timeout:g} s"
        except (aiohttp.ClientError, OSError) as exc:
            return _problem(exc)


def _problem(exc: BaseException) -> str:
    """A failed connection in words that carry no address (the log line names the URL)."""
    errno = getattr(exc, "errno", None)
    if isinstance(errno, int) and errno > 0:
        return os.strerror(errno)  # "Connection refused", "Network is unreachable", ...
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name does not resolve"
    return type(exc).__name__  # ServerDisconnectedError, ClientConnectorCertificateError, ...


def _models(body: bytes) -> tuple[tuple[str, ...], int | None]:
    """The model ids of a /v1/models answer, and the smallest context length it gives: vLLM's
    ``max_model_len``, else llama.cpp's ``meta.n_ctx`` (the context of one of its slots)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return (), None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return (), None
    entries = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
    lengths = [
        n
        for m in entries
        if isinstance(n := m.get("max_model_len", _meta(m).get("n_ctx")), int)
        and not isinstance(n, bool)
        and n > 0
    ]
    return tuple(m["id"] for m in entries), min(lengths, default=None)


def _meta(entry: dict[str, object]) -> dict[str, object]:
    meta = entry.get("meta")
    return meta if isinstance(meta, dict) else {}
