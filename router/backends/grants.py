"""Slot grants: how the router replicas sharing one Redis split a backend's ``max_inflight``.

Each router holds a grant of slots on every capped backend, kept in Redis, and admits
there only while its requests in flight (all its workers') are fewer than the grant, so the
fleet passes the cap only if the grants add up to more than it, which :data:`GRANT`, one
Lua script run on the server in one atomic step, never lets them do. Once a period, off
the request path, one process of each router sends for every capped backend an
:class:`Ask`: what it wants (in flight, waiting, a little headroom), what it has in flight
and what it may hold as it sends (its limit then). The script answers with a *target*, the
router's new limit, and stores what the router may hold from now on: the largest of the
target, what it had in flight and its limit as it sent, since what it admitted while the
answer travelled is bounded by that limit and not yet by the target. So a grant above its
share shrinks over two periods and as its requests finish, never below what is in flight.

:func:`grant` is the arithmetic (the script is its mirror, and a test holds them to each
other): the cap is shared among the live routers by demand (max-min fair: a router wanting
less than an equal share gets what it wants, the rest share the remainder equally); slots
nobody wants are handed out equally as headroom, so a quiet router has a slot for its first
request without waiting a period; and a target never exceeds the slots the other routers'
stored grants leave free. A router's grant on a backend lapses ``ttl`` ms after it last
asked for it, so a dead replica's slots come back to the others (and so do those of a
backend a router no longer caps).

A Redis that lost its data (restarted without persistence) knows no grant while the routers
still hold theirs: a router asking with a limit it has no record of marks the store as
*warming* for one ``ttl``, during which no target exceeds the asker's limit. Every live
router asks within that time, so the grants are all known again before any grows. (A
router starting for the first time in the one period between such a restart and the first
old router's ask is the exception: it may take slots an old router still holds.)

:class:`FleetShare` keeps a backend's grant where every worker of the router reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.backends.shared import Slot

PREFIX = "turnout:slots:"
WARM = PREFIX + "warm"
"""Until when (ms) the store is warming after a loss of its data; 0: it is not."""


@dataclass(frozen=True, slots=True)
class Ask:
    """One router's ask for one backend."""

    want: int
    """Slots it would use: in flight, waiting, plus headroom."""
    inflight: int
    """Its requests in flight there now (all its workers')."""
    held: int
    """The most it may have in flight as it asks: its limit then."""


@dataclass(frozen=True, slots=True)
class Held:
    """Another live router's record for the backend, as it last asked."""

    stored: int
    want: int


def fair_share(cap: int, want: int, others: Sequence[int]) -> int:
    """What a router wanting ``want`` of ``cap`` slots gets beside routers wanting
    ``others``: max-min fair (a remainder rounds up for the asker, so that one slot is not
    left to nobody), and of the slots nobody wants an equal part, rounded up."""
    everyone = len(others) + 1
    total = want + sum(others)
    if total <= cap:
        return want + -(-(cap - total) // everyone)
    left, count = cap, everyone
    for other in sorted(others):
        level = -(-left // count)
        if want <= level and want <= other:
            return want
        if other >= level:
            return level
        left -= other
        count -= 1
    return min(want, left)


def grant(cap: int, ask: Ask, others: Sequence[Held], warming: bool) -> tuple[int, int]:
    """(target, stored): the asker's new limit on a backend of ``cap`` slots, and what it
    may hold from now on (see the module)."""
    free = cap - sum(o.stored for o in others)
    target = max(0, min(fair_share(cap, ask.want, [o.want for o in others]), free))
    if warming:
        target = min(target, ask.held)
    return target, max(target, ask.inflight, ask.held)


GRANT = """
local me, ttl = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local warm_until = tonumber(redis.call('GET', KEYS[1]) or '-1')
local lost = false
local function share(cap, want, others)
  local total, everyone = want, #others + 1
  for _, o in ipairs(others) do total = total + o end
  if total <= cap then
    return want + math.ceil((cap - total) / everyone)
  end
  table.sort(others)
  local left, count = cap, everyone
  for _, other in ipairs(others) do
    local level = math.ceil(left / count)
    if want <= level and want <= other then return want end
    if other >= level then return level end
    left = left - other
    count = count - 1
  end
  return math.min(want, left)
end
local out = {}
for k = 2, #KEYS do
  local a = 3 + (k - 2) * 4
  local cap, want = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local inflight, held = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local fields = redis.call('HGETALL', KEYS[k])
  local others, stored, mine = {}, 0, false
  for j = 1, #fields, 2 do
    local who = fields[j]
    if who == me then
      mine = true
    else
      local s, w, u = string.match(fields[j + 1], '^(%d+) (%d+) (%d+)$')
      if s and tonumber(u) >= now then
        stored = stored + tonumber(s)
        others[#others + 1] = tonumber(w)
      else
        redis.call('HDEL', KEYS[k], who)
      end
    end
  end
  if held > 0 and not mine and warm_until < 0 then lost = true end
  out[#out + 1] = {k, cap, want, inflight, held, others, stored}
end
if warm_until < 0 then
  warm_until = lost and now + ttl or 0
  redis.call('SET', KEYS[1], warm_until)
end
local warming = warm_until > now
local targets = {}
for _, r in ipairs(out) do
  local k, cap, want, inflight, held, others, stored = unpack(r)
  local target = math.max(0, math.min(share(cap, want, others), cap - stored))
  if warming then target = math.min(target, held) end
  local keep = math.max(target, inflight, held)
  redis.call('HSET', KEYS[k], me, keep .. ' ' .. want .. ' ' .. (now + ttl))
  redis.call('PEXPIRE', KEYS[k], ttl * 2)
  targets[#targets + 1] = target
end
return targets
"""
"""KEYS: :data:`WARM`, then one hash per backend (:func:`backend_key`); ARGV: the router's
id, the ``ttl`` (ms) of what it stores, then per backend its cap and the :class:`Ask`'s three
figures. Returns the targets, in the backends' order. Each hash maps a router's id to
``"stored want until"``, ``until`` on Redis' clock (ms); an entry past it is dropped."""


def backend_key(name: str) -> str:
    return PREFIX + "backend:" + name


_UNHEARD, _ALONE, _GRANTED = 0, 1, 2
"""How a grant is kept: none heard yet, capping alone, or the grant plus :data:`_GRANTED` (so
that a fresh shared slot's zero reads as unheard)."""


class FleetShare:
    """One backend's grant for this router, and the requests that found no room on it: in
    its workers' shared memory (router.backends.shared), or, without workers, here."""

    __slots__ = ("_code", "_shared", "_turned", "granted")

    def __init__(self, shared: Slot | None, granted: bool) -> None:
        self._shared = shared
        self.granted = granted
        """The router's replicas share the backend's cap by slot grants."""
        self._code = _UNHEARD
        self._turned = 0

    @property
    def grant(self) -> int | None:
        """The slots this router may hold on the backend: None while it caps alone (no
        Redis, or its grant lapsed in an outage with ``on_error: allow``). A router that
        shares its cap but has heard no grant yet holds none."""
        code = self._shared.grant() if self._shared is not None else self._code
        if code == _UNHEARD:
            return 0 if self.granted else None
        return None if code == _ALONE else code - _GRANTED

    @grant.setter
    def grant(self, slots: int | None) -> None:
        """Set by the one process of the router that asks for its grants."""
        code = _ALONE if slots is None else slots + _GRANTED
        if self._shared is not None:
            self._shared.set_grant(code)
        else:
            self._code = code

    def turned_away(self) -> None:
        """A request found no room on the backend (it waits, or is refused): the router
        asks for more of the fleet's slots next time (router.backends.fleet_load)."""
        if self._shared is not None:
            self._shared.turned_away()
        else:
            self._turned += 1

    def turned_total(self) -> int:
        """The requests :meth:`turned_away` counted, every worker's, since they started."""
        return self._shared.turned_total() if self._shared is not None else self._turned
