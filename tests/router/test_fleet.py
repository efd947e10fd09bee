"""router/backends/fleet.py in an in-process app, against the fake engine on loopback:
what a lookup's failures do, and which reload changes keep a backend's state."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from policies.candidates import CandidateSet
from policies.testing import make_request
from policies.types import RequestInfo
from router.app import RELOADER, STATE, build_app, build_policies, listen_socket, serve
from router.backends.fleet import replica
from router.backends.pool import BackendState, Pool
from router.config.model import HealthSettings
from router.config.parse import load_config, parse_config
from tests.router.fake_upstream import FakeEngine
from tests.router.harness import base_config, write_config
from tests.router.rawserver import until

REQ = RequestInfo("r", "chat", "chat", "interactive")


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


def test_the_pool_treats_replicas_as_their_configured_backend() -> None:
    """Aliases and shadow targets (member) see a discovered backend's replicas; the
    ejection cap follows the set's size as it changes."""
    group = parse_config(_doc(8000)).backends[0]
    pool = Pool((group,), {"chat": {"pool": "served-name"}}, HealthSettings())
    assert pool.backends == []  # replicas join as they are found
    one, two = (pool.state(replica(group, a)) for a in ("10.0.0.1", "fd00::2"))
    for backend in (one, two):
        pool.add(backend)
    assert (one.name, one.spec.url) == ("pool@10.0.0.1", "http://10.0.0.1:8000")
    assert (two.name, two.spec.url) == ("pool@fd00::2", "http://[fd00::2]:8000")
    assert pool.upstream_model(two, "chat") == "served-name"
    assert pool.member("pool") is one and pool.member("other") is None

    def fail(backend: BackendState) -> None:
        for _ in range(HealthSettings().failures_to_eject):
            lease = backend.lease(REQ)
            lease.release()
            lease.failed()

    fail(one)
    fail(two)  # half of two backends may be out: one
    assert one.breaker.ejected and not two.breaker.ejected
    assert pool.member("pool") is two  # the first healthy replica
    for a in ("10.0.0.3", "10.0.0.4"):
        pool.add(pool.state(replica(group, a)))
    fail(two)  # half of four: two
    assert two.breaker.ejected
    assert pool.remove(one.name) is one
    assert pool.member("pool") is pool.by_name["pool@10.0.0.3"]  # two is still out
    for backend in pool.backends:
        backend.probe_result(False, first=True)
    assert pool.member("pool") is pool.backends[0]  # none healthy: the first, as in panic
    pool.backends[1].probe_result(True)
    assert pool.member("pool") is pool.backends[1]


def test_a_sampled_ranking_is_as_long_as_the_configured_failover() -> None:
    """The router builds its policies with its failover depth: past sample_above backends a
    ranking holds failover.max_attempts names, the most any request is tried on."""
    backends = [(f"b{i}", "vllm", f"http://127.0.0.1:{9000 + i}") for i in range(40)]
    for attempts in (2, 4):
        doc = base_config(backends, default_policy="round-robin")
        doc["failover"] = {**doc["failover"], "max_attempts": attempts}
        doc["policies"] = {
            "round-robin": {"type": "round-robin"},
            "least-outstanding": {"type": "least-outstanding"},
        }
        config = parse_config(doc)
        pool = Pool(config.backends, {}, HealthSettings())
        members = CandidateSet(pool.backends)
        for policy in build_policies(config).values():
            decision = policy.choose(make_request(), members.view())
            assert len(decision.ranked) == attempts, policy.name
