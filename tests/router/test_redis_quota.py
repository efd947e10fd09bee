"""router.control.redis_quota against a real redis-server: one set of limits for several
router processes, the atomic reservation, settlement, and what an outage does."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Iterator

import pytest

from policies.types import RequestInfo
from router.config.model import ApiKeySpec, StoreOnError
from router.control.auth import Gate
from router.control.quota import Limits, QuotaTable, Refusal
from router.control.redis_quota import RedisQuotas
from router.server.errors import RouterError
from tests.redis_server import RedisServer, start_redis


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with start_redis() as running:
        yield running


class Replicas:
    """Stores of router processes sharing one Redis, each with its own local table."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.local: list[str] = []
        self.stores: list[RedisQuotas] = []

    async def add(self, on_error: StoreOnError = "allow") -> RedisQuotas:
        store = RedisQuotas(self.url, on_error, QuotaTable.private(), on_local=self.local.append)
        await store.start()
        self.stores.append(store)
        return store


@pytest.fixture
async def replicas(server: RedisServer) -> AsyncIterator[Replicas]:
    out = Replicas(server.url)
    yield out
    for store in out.stores:
        await store.aclose()


def quota(request: pytest.FixtureRequest) -> str:
    """A quota of the test's own (the server is shared by the module)."""
    return str(request.node.name)


async def eventually_reserved(store: RedisQuotas, name: str, limits: Limits, tokens: int) -> None:
    """A reservation that passes within a second (a settlement is sent in the background)."""
    for _ in range(100):
        if not isinstance(await store.reserve(name, limits, tokens), Refusal):
            return
        await asyncio.sleep(0.01)
    pytest.fail("the settlement never reached the other replica")


async def test_two_replicas_racing_for_the_last_tokens_cannot_both_win(
    replicas: Replicas, request: pytest.FixtureRequest
) -> None:
    a, b = await replicas.add(), await replicas.add()
    limits = Limits(tokens_per_minute=1000)
    tries = [s.reserve(quota(request), limits, 30) for s in (a, b) for _ in range(40)]
    got = await asyncio.gather(*tries)
    won = [g for g in got if not isinstance(g, Refusal)]
    # 33 charges of 30 fit in 1000; the refill during the race (17 a second) adds none.
    assert len(won) == 33
    refused = [g for g in got if isinstance(g, Refusal)]
    assert {r.kind for r in refused} == {"tokens"} and all(0 < r.wait <= 60 for r in refused)
    assert replicas.local == []  # all decided in Redis


async def test_the_concurrency_cap_holds_across_replicas_and_a_settlement_frees_a_slot(
    replicas: Replicas, request: pytest.FixtureRequest
) -> None:
    a, b = await replicas.add(), await replicas.add()
    limits = Limits(max_concurrency=3)
    got = await asyncio.gather(*(s.reserve(quota(request), limits, 0) for s in (a, b, a, b, a)))
    held = [g for g in got if not isinstance(g, Refusal)]
    assert len(held) == 3
    refusal = await b.reserve(quota(request), limits, 0)
    assert isinstance(refusal, Refusal) and refusal.kind == "open" and refusal.held == 3
    held[0].settle(quota(request), limits, 0)  # sent in the background
    await eventually_reserved(b, quota(request), limits, 0)


async def test_a_settlement_gives_back_the_unused_charge(
    replicas: Replicas, request: pytest.FixtureRequest
) -> None:
    a, b = await replicas.add(), await replicas.add()
    limits = Limits(tokens_per_minute=100)
    taken = await a.reserve(quota(request), limits, 90)
    assert not isinstance(taken, Refusal)
    assert isinstance(await b.reserve(quota(request), limits, 50), Refusal)
    taken.settle(quota(request), limits, 80)  # used 10 of the 90
    await eventually_reserved(b, quota(request), limits, 50)


async def test_a_replica_gone_with_requests_open_does_not_hold_their_slots(
    replicas: Replicas, request: pytest.FixtureRequest
) -> None:
    limits = Limits(max_concurrency=2)
    gone = RedisQuotas(replicas.url, "allow", QuotaTable.private())
    await gone.start()
    for _ in range(2):
        assert not isinstance(await gone.reserve(quota(request), limits, 0), Refusal)
    survivor = await replicas.add()
    assert isinstance(await survivor.reserve(quota(request), limits, 0), Refusal)
    await gone.aclose()  # stands for its liveness key expiring: it settled nothing
    assert not isinstance(await survivor.reserve(quota(request), limits, 0), Refusal)


async def test_an_outage_falls_back_to_local_buckets_logged_once_and_counted(
    caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    with start_redis() as own:
        replicas = Replicas(own.url)
        store = await replicas.add("allow")
        try:
            limits = Limits(requests_per_minute=3)
            own.stop()
            with caplog.at_level(logging.WARNING, logger="router"):
                got = [await store.reserve(quota(request), limits, 0) for _ in range(5)]
            assert [isinstance(g, Refusal) for g in got] == [False] * 3 + [True] * 2
            assert replicas.local == ["allowed"] * 3 + ["refused"] * 2
            assert not store.up
            lost = [r for r in caplog.records if "unreachable" in r.getMessage()]
            assert len(lost) == 1 and own.url not in lost[0].getMessage()
            caplog.clear()
            own.start()
            with caplog.at_level(logging.WARNING, logger="router"):
                for _ in range(150):  # the probe asks every second or so
                    if store.up:
                        break
                    await asyncio.sleep(0.1)
            assert store.up
            assert len([r for r in caplog.records if "again" in r.getMessage()]) == 1
            # Redis' own buckets again (the restarted server's are fresh and full).
            assert not isinstance(await store.reserve(quota(request), limits, 0), Refusal)
            assert len(replicas.local) == 5
        finally:
            await store.aclose()


async def test_on_error_deny_answers_503(request: pytest.FixtureRequest) -> None:
    with start_redis() as own:
        replicas = Replicas(own.url)
        store = await replicas.add("deny")
        try:
            own.stop()
            key = ApiKeySpec("u", sha256=hashlib.sha256(b"k").hexdigest(), max_concurrency=5)
            gate = Gate([key], required=True, store=store)
            tenant = gate.identify({"Authorization": "Bearer k"})
            info = RequestInfo("r", "chat", "m", "interactive", max_tokens=1)
            with pytest.raises(RouterError) as exc:
                await gate.admit(tenant, info, 100)
            assert exc.value.status == 503 and exc.value.code == "limits_unavailable"
            assert exc.value.headers["Retry-After"] == "1"
            assert replicas.local == ["denied"]
        finally:
            await store.aclose()
