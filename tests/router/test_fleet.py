"""router/backends/fleet.py in an in-process app, against the fake engine on loopback:
what a lookup's failures do, and which reload changes keep a backend's state."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from router.app import RELOADER, STATE, build_app, listen_socket, serve
from router.config.parse import load_config
from tests.router.fake_upstream import FakeEngine
from tests.router.harness import base_config, write_config
from tests.router.rawserver import until


class Steered:
    """A resolver that raises ``error`` while it is set, else answers ``addresses``."""

    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.addresses = ["127.0.0.1"]
        self.calls = 0

    async def __call__(self, name: str, port: int) -> list[str]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.addresses


@contextlib.asynccontextmanager
async def _engine() -> AsyncIterator[int]:
    """The fake engine on a loopback port (the one every discovered address leads to)."""
    server = TestServer(FakeEngine().app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield server.port or 0
    finally:
        await server.close()


def _doc(port: int, **discover: Any) -> dict[str, Any]:
    doc = base_config([("pool", "vllm", "http://unused:1")])
    doc["backends"] = [
        {
            "name": "pool",
            "engine": "vllm",
            "discover": {"dns": "engines.test", "port": port, "interval_seconds": 0.1},
            **discover,
        }
    ]
    return doc


@pytest.mark.parametrize("error", [OSError("no such name"), UnicodeError("label too long")])
async def test_a_failing_lookup_neither_hangs_the_start_nor_empties_the_pool(
    tmp_path: Path, error: Exception
) -> None:
    resolver = Steered(error)
    async with _engine() as port:
        app = build_app(load_config(write_config(tmp_path, _doc(port))), resolver=resolver)
        served = await serve(app, listen_socket("127.0.0.1", 0))  # returns: lookups settled
        try:
            pool = app[STATE].pool
            assert pool.backends == []
            resolver.error = None
            await until(lambda: [b.name for b in pool.backends] == ["pool@127.0.0.1"], 5)
            backend = pool.backends[0]
            resolver.error = error  # the name stops resolving: the replica stays
            calls = resolver.calls
            await until(lambda: resolver.calls >= calls + 3, 5)
            assert pool.backends == [backend]
        finally:
            await served.runner.cleanup()


async def test_reload_keeps_a_replica_unless_what_it_is_changed(tmp_path: Path) -> None:
    async with _engine() as port:
        path = write_config(tmp_path, _doc(port))
        app = build_app(load_config(path), config_path=path, resolver=Steered(None))
        served = await serve(app, listen_socket("127.0.0.1", 0))
        state = app[STATE]
        try:
            assert state.fleet is not None
            (first,) = state.pool.backends
            write_config(tmp_path, _doc(port, max_inflight=7))
            assert app[RELOADER].reload() == []
            await state.fleet.settled()
            (same,) = state.pool.backends
            assert same is first and same.spec.max_inflight == 7  # in place: breaker, load kept
            write_config(tmp_path, _doc(port, api_key_env="ENGINE_KEY"))
            assert app[RELOADER].reload() == []
            await state.fleet.settled()
            (other,) = state.pool.backends
            assert other is not first and other.name == first.name  # a new backend
        finally:
            await served.runner.cleanup()
