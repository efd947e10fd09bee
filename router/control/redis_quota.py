"""API keys' usage in Redis, shared by every replica of the router and each of its workers.

``limits.store.redis.url`` set, each router process reserves a request's quota with one Lua
script run on the server (:data:`RESERVE`): the check of every limit and the take from every
bucket happen in one atomic step, so two replicas racing for a key's last tokens cannot
both win, and the request pays one round trip. Buckets are refilled on Redis' own clock
(``TIME``), which every replica reads alike. The settlement (the slot freed, the charge
trued up to the usage) is queued and sent by a background task in batches, off the request's
path.

A key's open requests are counted per process, in one hash field each; a process keeps a
liveness key alive (every :data:`HEARTBEAT` seconds, for :data:`ALIVE_SECONDS`), and a
reservation drops the fields of processes whose liveness key has expired, so a replica that
died with requests open does not hold its slots for ever. The script reads those liveness
keys by name, which a single Redis server (not a cluster) allows.

When Redis cannot be reached, ``on_error`` decides: ``allow`` reserves from the router's own
table (router.control.quota, shared by its workers), ``deny`` refuses with 503. Either way
one line is logged when it starts and one when Redis answers again (by one process of each
router; its other workers log them at debug level), and every request so decided is
counted (``turnout_limits_local_total``); meanwhile a probe asks once a second rather than
each request. Settlements of reservations made in Redis wait for it (at most
:data:`MAX_PENDING`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from router.backends.fleet_load import unique_name
from router.backends.store_client import store_client
from router.config.model import StoreOnError
from router.control.quota import Limits, QuotaTable, Refusal, Settler

log = logging.getLogger("router")

HEARTBEAT = 5.0
ALIVE_SECONDS = 15
PROBE_SECONDS = 1.0
MAX_PENDING = 100_000
IDLE_SECONDS = 300
"""A quota untouched this long is dropped from Redis: its buckets have refilled long since."""
PREFIX = "turnout:limits:"

_LEVEL = """
local function level(cap, l, at, now)
  if not l then return cap end
  return math.min(cap, tonumber(l) + (now - tonumber(at)) * cap / 60)
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
"""

RESERVE = (
    _LEVEL
    + """
-- KEYS: buckets, open; ARGV: rpm, tpm, max open, tokens, process, liveness prefix, idle
local rpm, tpm, cap, charge = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4])
if cap > 0 then
  local held = redis.call('HGETALL', KEYS[2])
  local open = 0
  for i = 1, #held, 2 do
    if redis.call('EXISTS', ARGV[6] .. held[i]) == 1 then
      open = open + tonumber(held[i + 1])
    else
      redis.call('HDEL', KEYS[2], held[i])
    end
  end
  if open >= cap then return {'open', tostring(open)} end
end
local b = redis.call('HMGET', KEYS[1], 'r', 'rt', 't', 'tt')
local r, k
if rpm > 0 then
  r = level(rpm, b[1], b[2], now)
  if r < 1 then return {'requests', tostring((1 - r) * 60 / rpm)} end
end
if tpm > 0 and charge > 0 then
  k = level(tpm, b[3], b[4], now)
  local need = math.min(charge, tpm) - k
  if need > 0 then return {'tokens', tostring(need * 60 / tpm)} end
end
local stamp = string.format('%.6f', now)
if r then redis.call('HSET', KEYS[1], 'r', tostring(r - 1), 'rt', stamp) end
if k then redis.call('HSET', KEYS[1], 't', tostring(k - charge), 'tt', stamp) end
if r or k then redis.call('EXPIRE', KEYS[1], tonumber(ARGV[7])) end
if cap > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[5], 1)
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[7]))
end
return {'ok'}
"""
)

SETTLE = (
    _LEVEL
    + """
-- KEYS: buckets, open; ARGV: tpm, tokens given back (negative: taken), process, had a slot
if tonumber(ARGV[4]) > 0 then
  if redis.call('HINCRBY', KEYS[2], ARGV[3], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[3]) end
end
local tpm, give = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and give ~= 0 then
  local b = redis.call('HMGET', KEYS[1], 't', 'tt')
  local k = math.min(tpm, level(tpm, b[1], b[2], now) + give)
  redis.call('HSET', KEYS[1], 't', tostring(k), 'tt', string.format('%.6f', now))
end
return 1
"""
)

Arg = str | int | float
_Settlement = tuple[str, Limits, float]
_Reservation = tuple[str, Limits, float, "asyncio.Future[list[bytes]]"]


class RedisQuotas:
    """One router process's client of the shared store; ``local`` decides while it is out."""

    def __init__(
        self,
        url: str,
        on_error: StoreOnError,
        local: QuotaTable,
        *,
        on_local: Callable[[str], None] = lambda outcome: None,
        speaks: bool = True,
    ) -> None:
        """``on_local(outcome)``: a request decided without Redis (``allowed`` or
        ``refused`` by the local table, or ``denied`` for the outage). ``speaks``: this
        process logs the outage for its router (the others of its workers at debug level,
        as router.backends.fleet_load.RouterName says who speaks)."""
        self._redis = store_client(url)
        self._on_error = on_error
        self._local = local
        self._on_local = on_local
        self._level = logging.WARNING if speaks else logging.DEBUG
        self._reserve = self._redis.register_script(RESERVE)
        self._settle = self._redis.register_script(SETTLE)
        self.process = unique_name()
        self._alive = f"{PREFIX}alive:"
        self.up = True
        self._blocked: dict[str, float] = {}  # quota -> until when Redis refuses it (monotonic)
        self._pending: deque[_Settlement] = deque()
        self._batch: list[_Reservation] = []
        self._sending: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Say this process is alive, then keep saying it and send settlements."""
        try:
            await self._redis.set(self._alive + self.process, 1, ex=ALIVE_SECONDS)
        except (RedisError, OSError) as exc:
            self._lost(exc)
        self._tasks = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._flush())]

    async def aclose(self) -> None:
        """Send what is still to settle (if Redis answers), then close."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.up and self._pending:
            with contextlib.suppress(RedisError, OSError):
                await self._send()
        with contextlib.suppress(RedisError, OSError):
            await self._redis.delete(self._alive + self.process)
        await self._redis.aclose()

    def check(self, quota: str, limits: Limits, tokens: float) -> Refusal | None:
        if not self.up:
            return self._local.check(quota, limits, tokens)
        until = self._blocked.get(quota)
        if until is None:
            return None
        wait = until - time.monotonic()
        if wait <= 0:
            del self._blocked[quota]
            return None
        return Refusal("requests", wait)  # what Redis last said, only for the early refusal

    async def reserve(self, quota: str, limits: Limits, tokens: float) -> Settler | Refusal:
        if self.up:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[list[bytes]] = loop.create_future()
            self._batch.append((quota, limits, tokens, waiter))
            if len(self._batch) == 1:  # the first of this turn of the loop: all go at its end
                loop.call_soon(self._send_batch)
            try:
                got = await waiter
            except (RedisError, OSError) as exc:
                self._lost(exc)
            else:
                return self._answer(quota, got)
        if self._on_error == "deny":
            self._on_local("denied")
            return Refusal("store")
        taken = self._local.take(quota, limits, tokens)
        self._on_local("refused" if isinstance(taken, Refusal) else "allowed")
        return taken

    def _send_batch(self) -> None:
        batch, self._batch = self._batch, []
        task = asyncio.create_task(self._reserve_all(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _reserve_all(self, batch: list[_Reservation]) -> None:
        """The reservations asked for in one turn of the event loop, in one round trip: a
        pipeline costs a fraction of a call each (benchmarks/limits_store.py)."""
        calls = [
            (
                limits.requests_per_minute or 0,
                limits.tokens_per_minute or 0,
                limits.max_concurrency or 0,
                int(tokens),
                self.process,
                self._alive,
                IDLE_SECONDS,
            )
            for _, limits, tokens, _ in batch
        ]
        keys = [(PREFIX + quota, PREFIX + quota + ":open") for quota, *_ in batch]
        try:
            replies = await self._pipelined(self._reserve, keys, calls)
        except (RedisError, OSError) as exc:
            for *_, waiter in batch:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        for (quota, limits, tokens, waiter), reply in zip(batch, replies, strict=True):
            if not waiter.done():
                waiter.set_result(reply)
            elif reply[0] == b"ok":  # its client left meanwhile: give it all back
                self.settle(quota, limits, tokens)

    async def _pipelined(
        self, script: AsyncScript, keys: list[tuple[str, str]], calls: Sequence[Sequence[Arg]]
    ) -> list[Any]:
        """``script`` run once for each of ``keys`` and ``calls`` in one pipeline (loaded
        first should the server have lost it, as a restarted one has)."""
        for again in (False, True):
            pipe = self._redis.pipeline(transaction=False)
            for two, args in zip(keys, calls, strict=True):
                pipe.evalsha(script.sha, 2, *two, *args)
            try:
                return await pipe.execute()
            except NoScriptError:
                if again:
                    raise
                await self._redis.script_load(script.script)
        raise AssertionError("unreachable")

    def _answer(self, quota: str, got: list[bytes]) -> Settler | Refusal:
        kind = got[0].decode()
        if kind == "ok":
            return self
        if kind == "open":
            return Refusal("open", held=int(got[1]))
        wait = float(got[1])
        if kind == "requests":  # no request of this caller can pass before then
            self._blocked[quota] = time.monotonic() + wait
        return Refusal("requests" if kind == "requests" else "tokens", wait)

    def settle(self, quota: str, limits: Limits, give: float) -> None:
        if len(self._pending) >= MAX_PENDING:
            self._pending.popleft()  # an outage that long: the oldest slot is lost, not memory
        self._pending.append((quota, limits, give))
        self._wake.set()

    async def _flush(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.up:
                continue  # the probe wakes this again once Redis answers
            try:
                await self._send()
            except (RedisError, OSError) as exc:
                self._lost(exc)

    async def _send(self) -> None:
        """Every queued settlement in one pipeline; they stay queued if it fails."""
        batch = list(self._pending)
        keys = [(PREFIX + quota, PREFIX + quota + ":open") for quota, _, _ in batch]
        calls = [
            (limits.tokens_per_minute or 0, give, self.process, limits.max_concurrency or 0)
            for _, limits, give in batch
        ]
        await self._pipelined(self._settle, keys, calls)
        for _ in batch:
            self._pending.popleft()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(PROBE_SECONDS if not self.up else HEARTBEAT)
            try:
                await self._redis.set(self._alive + self.process, 1, ex=ALIVE_SECONDS)
            except (RedisError, OSError) as exc:
                self._lost(exc)
                continue
            if not self.up:
                self.up = True
                log.log(self._level, "limits store reachable again: limits are shared again")
                self._wake.set()

    def _lost(self, exc: BaseException) -> None:
        """Redis failed a call: say so once (without its URL, which may hold a password)."""
        if not self.up:
            return
        self.up = False
        self._blocked.clear()
        then = "this router's own buckets decide" if self._on_error == "allow" else "503"
        log.log(
            self._level,
            "limits store unreachable (%s): %s until it answers",
            type(exc).__name__,
            then,
        )
