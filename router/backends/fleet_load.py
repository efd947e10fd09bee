"""Each router replica's requests in flight on the capped backends, exchanged through Redis,
so that a backend's ``max_inflight`` caps the fleet, not each replica.

With ``limits.store.redis``, every :data:`PERIOD` seconds one process of each router (worker
0, or the router itself without workers) writes its router's in-flight count on every
backend that has a ``max_inflight`` into a hash of its own that expires unless rewritten
(:data:`TTL_MS`), and every process reads the other routers' hashes and sets each backend's
:attr:`~router.backends.pool.BackendState.elsewhere` to their sum. The saturation check and
the policies then see the fleet's in-flight count. It is exchanged off the request path, so
it is as old as one period and a round trip: replicas admitting at once may pass a cap by
what they admit within it. When another replica's count falls, waiters in the admission
queues are woken, as a request ending here wakes them. Redis unreachable, each router caps
alone again (the counts of the others drop to 0), logged once (by the process that speaks
for the router), and once when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from router.backends.pool import Pool
from router.store_client import store_client

log = logging.getLogger("router")

PERIOD = 0.2
TTL_MS = 2000
PREFIX = "turnout:load:"
ROUTERS = PREFIX + "routers"


def unique_name() -> str:
    """A name for a router or a process that no other one in the fleet has, now or later."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class RouterName:
    """Which router this process belongs to, and whether it speaks for it (one per router)."""

    id: str
    publishes: bool


class FleetLoad:
    """One process's share in the exchange."""

    def __init__(self, url: str, pool: Pool, name: RouterName, freed: Callable[[], None]) -> None:
        self._redis = store_client(url)
        self._pool = pool
        self._name = name
        self._freed = freed
        self._task: asyncio.Task[None] | None = None
        self.up = True
        self._level = logging.WARNING if name.publishes else logging.DEBUG  # one line per router

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._name.publishes:
            with contextlib.suppress(RedisError, OSError):
                await self._redis.delete(PREFIX + self._name.id)
        await self._redis.aclose()

    async def _run(self) -> None:
        while True:
            try:
                await self.exchange()
            except (RedisError, OSError) as exc:
                self._lost(exc)
            await asyncio.sleep(PERIOD)

    async def exchange(self) -> None:
        """Write this router's counts (if it speaks for it), read the others'."""
        capped = [b for b in self._pool.backends if b.spec.max_inflight is not None]
        me = self._name.id
        pipe = self._redis.pipeline(transaction=False)
        if self._name.publishes and capped:
            key = PREFIX + me
            pipe.hset(key, mapping={b.name: b.own_figures()[0] for b in capped})
            pipe.pexpire(key, TTL_MS)
            pipe.sadd(ROUTERS, me)
        pipe.smembers(ROUTERS)
        others = sorted(m.decode() for m in (await pipe.execute())[-1] if m.decode() != me)
        read = self._redis.pipeline(transaction=False)
        for other in others:
            read.hgetall(PREFIX + other)
        totals: dict[str, int] = {}
        gone: list[str] = []
        for other, counts in zip(others, await read.execute() if others else [], strict=True):
            if not counts:  # expired: that router stopped speaking
                gone.append(other)
            for name, count in counts.items():
                totals[name.decode()] = totals.get(name.decode(), 0) + int(count)
        if gone:
            await self._redis.srem(ROUTERS, *gone)
        if not self.up:
            self.up = True
            log.log(self._level, "fleet load reachable again: max_inflight caps the fleet again")
        self._set(totals)

    def _set(self, totals: dict[str, int]) -> None:
        for backend in self._pool.backends:
            now = totals.get(backend.name, 0)
            for _ in range(backend.elsewhere - now):  # slots freed elsewhere: waiters may go
                self._freed()
            backend.elsewhere = now

    def _lost(self, exc: BaseException) -> None:
        if self.up:
            self.up = False
            log.log(
                self._level,
                "fleet load unreachable (%s): max_inflight caps each router alone until it answers",
                type(exc).__name__,
            )
        self._set({})
