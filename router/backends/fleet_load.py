"""Each router replica's requests in flight on the capped backends, exchanged through Redis,
and its grant of their slots, so that a backend's ``max_inflight`` caps the fleet, not each
replica.

With ``limits.store.redis``, every :data:`PERIOD` seconds one process of each router (worker
0, or the router itself without workers) writes its router's in-flight count on every
backend that has a ``max_inflight`` into a hash of its own that expires unless rewritten
(:data:`TTL_MS`), and every process reads the other routers' hashes and sets each backend's
:attr:`~router.backends.pool.BackendState.elsewhere` to their sum, which the policies see.

The cap itself is held by slot grants (router.backends.grants): in the same period the
process that speaks for the router asks for its grants in one script run, and sets each
backend's :attr:`~router.backends.grants.FleetShare.grant` (kept in the workers' shared
memory, so every worker admits against it), under the lock under which admission finds a
backend with room and takes its slot. The router then admits on a backend only while its
own requests there are fewer than its grant, and the grants never add up to more than the
cap: exact, and no Redis round trip on the request path. It asks for what it has in flight,
waiting and turned away since it last asked, plus :data:`HEADROOM`; a request turned away
has it ask again after a quarter of a period, not a whole one. When a grant grows, or another
replica's count falls, waiters in the admission queues are woken, as a request ending here
wakes them.

Redis unreachable, the router keeps its last grants for :data:`TTL_MS` (counted from the
last ask that was answered; Redis keeps them as long at least, so none of them is handed
to another replica meanwhile), then ``limits.store.on_error`` decides: ``allow`` (the
default) caps each router alone again (the others' counts drop to 0), ``deny`` admits
nothing more on the capped backends. Logged once (by the process that speaks for the
router), and once when Redis answers again; the first answer then shrinks what a router took
alone back towards its share.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from redis.exceptions import RedisError

from router.backends.grants import GRANT, WARM, backend_key
from router.backends.pool import BackendState, Pool
from router.backends.store_client import store_client
from router.config.model import StoreOnError

log = logging.getLogger("router")

PERIOD = 0.2
TTL_MS = 2000
HEADROOM = 0.25
"""A router asks for this much more than it has in flight, waiting and turned away, so that
a busy one's grant grows by a quarter an ask while slots are free."""
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


@dataclass(frozen=True, slots=True)
class Admitting:
    """What the exchange needs of the router's admission."""

    freed: Callable[[], None]
    """A slot may have freed up: wake the router's first waiter."""
    waiting: Callable[[], int]
    """Requests waiting in the router now."""
    taking: Callable[[], AbstractContextManager[object]]
    """The lock under which admission takes a backend's slot."""


class FleetLoad:
    """One process's share in the exchange."""

    def __init__(
        self,
        url: str,
        pool: Pool,
        name: RouterName,
        admission: Admitting,
        on_error: StoreOnError = "allow",
    ) -> None:
        self._redis = store_client(url)
        self._grant = self._redis.register_script(GRANT)
        self._pool = pool
        self._name = name
        self._admission = admission
        self._on_error = on_error
        self._task: asyncio.Task[None] | None = None
        self._asked = -float("inf")  # when the last answered ask for grants was sent
        self._turned: dict[str, int] = {}  # each backend's requests turned away, as last asked
        self.up = True
        self._level = logging.WARNING if name.publishes else logging.DEBUG  # one line per router

    async def start(self) -> None:
        """The first exchange now (so that the router admits under its grants from its
        first request), the others every :data:`PERIOD` seconds."""
        await self._once()
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
            await self._pause()
            await self._once()

    async def _pause(self) -> None:
        """Until the next period; for the process that asks for the router's grants, only
        until a quarter of one has passed and a request found no room since the last ask
        (so that the router's want is heard within that, not a period)."""
        if not self._name.publishes or not self.up:  # an outage is not asked of faster
            await asyncio.sleep(PERIOD)
            return
        for _ in range(4):
            await asyncio.sleep(PERIOD / 4)
            if any(b.fleet.turned_total() > self._turned.get(b.name, 0) for b in self._capped()):
                return

    def _capped(self) -> list[BackendState]:
        return [b for b in self._pool.backends if b.spec.max_inflight is not None]

    async def _once(self) -> None:
        try:
            await self.exchange()
        except (RedisError, OSError) as exc:
            self._lost(exc)

    async def exchange(self) -> None:
        """Write this router's counts and ask for its grants (if it speaks for it), read
        the others' counts."""
        capped = self._capped()
        me = self._name.id
        if self._name.publishes and capped:
            await self._ask(capped)
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

    async def _ask(self, capped: list[BackendState]) -> None:
        """One script run: this router's grant of every capped backend's slots."""
        queued = self._admission.waiting()
        args: list[str | int] = [self._name.id, TTL_MS]
        turned = {b.name: b.fleet.turned_total() for b in capped}
        with self._admission.taking():  # what it holds as it asks: nothing admitted between
            for b in capped:
                cap, inflight, grant = b.spec.max_inflight or 0, b.own_figures()[0], b.fleet.grant
                away = max(0, turned[b.name] - self._turned.get(b.name, 0))
                want = inflight + queued + away + math.ceil(inflight * HEADROOM)
                args += [cap, want, inflight, cap if grant is None else grant]
        asked = time.monotonic()
        keys = [WARM] + [backend_key(b.name) for b in capped]
        targets = await self._grant(keys=keys, args=args)
        self._asked = asked
        self._turned = turned
        self._regrant(capped, [int(t) for t in targets])

    def _regrant(self, backends: list[BackendState], grants: Sequence[int | None]) -> None:
        """Set the router's grants, under admission's lock; a grant grown wakes waiters."""
        with self._admission.taking():
            rooms = [_room(b) for b in backends]
            for b, g in zip(backends, grants, strict=True):
                b.fleet.grant = g
        self._woken(backends, rooms)

    def _set(self, totals: dict[str, int]) -> None:
        backends = self._pool.backends
        rooms = [_room(b) for b in backends]
        for backend in backends:
            backend.elsewhere = totals.get(backend.name, 0)
        self._woken(backends, rooms)

    def _woken(self, backends: list[BackendState], before: list[int | None]) -> None:
        """Wake a waiter for every slot that became free on ``backends`` since ``before``."""
        for backend, was in zip(backends, before, strict=True):
            now = _room(backend)
            if was is not None and now is not None:
                for _ in range(now - max(was, 0)):
                    self._admission.freed()

    def _lost(self, exc: BaseException) -> None:
        if self.up:
            self.up = False
            then = ("caps each backend alone" if self._on_error == "allow"
                    else "admits nothing more on the capped backends")  # fmt: skip
            log.log(
                self._level,
                "fleet load unreachable (%s): this router keeps its grants of max_inflight "
                "for %g s, then %s until it answers",
                type(exc).__name__, TTL_MS / 1000, then,
            )  # fmt: skip
        self._set({})
        if self._name.publishes and time.monotonic() - self._asked > TTL_MS / 1000:
            capped = self._capped()
            lapsed = None if self._on_error == "allow" else 0
            self._regrant(capped, [lapsed] * len(capped))


def _room(backend: BackendState) -> int | None:
    """Requests this router may still admit on ``backend`` (None: uncapped)."""
    limit = backend.limit
    return None if limit is None else limit - backend.inflight
