"""One router's side of the slot grants (router.backends.fleet_load) against a real
redis-server: it admits only below its grant, a waiter is woken when the grant grows (no
request ends here to wake it), and an outage keeps the grant for its time, then
``on_error`` decides."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from redis import Redis

from router.backends.fleet_load import TTL_MS, Admitting, FleetLoad, RouterName
from router.backends.grants import WARM, backend_key
from router.backends.pool import Pool
from router.config.model import (
    AdmissionSettings,
    BackendSpec,
    ClassAdmission,
    HealthSettings,
    StoreOnError,
)
from router.control.admission import Admission
from router.control.plan import Attempt, has_room
from tests.redis_server import RedisServer, start_redis


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with start_redis() as server:
        yield server


def other_router_holds(server: RedisServer, slots: int) -> None:
    """Another live router holds ``slots`` of backend ``capped`` and wants as many."""
    with Redis.from_url(server.url) as client:
        client.set(WARM, 0)
        until = int(time.time() * 1000) + 60_000
        client.hset(backend_key("capped"), "other", f"{slots} {slots} {until}")


def router(url: str, on_error: StoreOnError = "allow") -> tuple[Pool, Admission, FleetLoad]:
    spec = BackendSpec("capped", "vllm", "http://127.0.0.1:9", max_inflight=2)
    pool = Pool([spec], {}, HealthSettings(), granted=True)
    cls = ClassAdmission(queue_size=8, max_wait=10)
    admission = Admission(AdmissionSettings(classes={"interactive": cls}))
    admitting = Admitting(admission.release, admission.queues.queued, admission.taking)
    load = FleetLoad(url, pool, RouterName("me", publishes=True), admitting, on_error)
    return pool, admission, load


async def test_a_waiter_is_woken_when_the_grant_grows(redis: RedisServer) -> None:
    other_router_holds(redis, 2)
    pool, admission, load = router(redis.url)
    await load.exchange()
    backend = pool.backends[0]
    assert backend.fleet.grant == 0 and not has_room(backend)
    waiter = asyncio.create_task(admission.take("interactive", [Attempt(backend, "m")]))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    other_router_holds(redis, 0)  # the other router's requests finished
    await load.exchange()
    got = await asyncio.wait_for(waiter, 1.0)  # without a wake, it would wait its 10 s
    assert got.backend is backend and backend.fleet.grant == 2
    await load.aclose()


async def test_an_outage_keeps_the_grant_for_its_time_then_on_error_decides(
    redis: RedisServer,
) -> None:
    choices: tuple[tuple[StoreOnError, int | None], ...] = (("allow", None), ("deny", 0))
    for on_error, lapsed in choices:
        if on_error == "deny":  # the first round stopped it
            redis.start()
        pool, _, load = router(redis.url, on_error)
        await load.start()
        backend = pool.backends[0]
        assert backend.fleet.grant == 2
        redis.stop()
        await asyncio.sleep(0.6)  # the outage met: the grant holds...
        assert backend.fleet.grant == 2 and not load.up
        await asyncio.sleep(TTL_MS / 1000)  # ...until it would have lapsed in Redis too
        assert backend.fleet.grant == lapsed
        assert backend.limit == (2 if lapsed is None else 0)
        await load.aclose()
