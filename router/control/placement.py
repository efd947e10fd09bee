"""One placement record and one set of learned estimates for the whole router: where each
process sent its prompts, and what each finished request taught, passed to every other
process, whose policies learn it too.

A policy that keeps a record of where prompts went (``shares_placement``: the cache-aware
prefix record, policies.base.SharesPlacement) learns only from what its own process sends.
With ``--workers N`` or several replicas each record would hold a share of the traffic, and
the second turn of a conversation would land wherever that share says. So for each request
such a policy sends, the router passes on ``(policy, backend, prefix blocks)``:

- to the other workers of its router through a ring in a segment the parent maps before it
  forks (:class:`PlacementRings`): one ring per worker, which only that worker writes; every
  worker reads the others' every :data:`POLL` seconds;
- with ``limits.store.redis``, to the other routers through a Redis channel, published in
  batches every :data:`POLL` seconds off the request path; a router skips what it published
  itself (its workers have it from the ring already).

A policy that learns estimates from outcomes (``shares_learning``: ``adaptive``'s TTFT lines,
TPOT, batch pace and interactive attainment, policies.base.SharesLearning) passes on the
:class:`~policies.types.Lesson` of each finished request the same way.

A policy that caps what it spills onto a backend (``shares_spills``: ``adaptive``'s batch
spills, policies.base.SharesSpills) passes on each spill it commits, and its end, to the
other workers, on the rings only. A worker reads the rings again just before such a policy
chooses, so a spill another worker committed a moment ago counts against the limit at once,
not a poll later. What stays unsaid (a worker that died, a ring lapped) the policy drops by
the router's in-flight count, which sums every worker's (router.backends.shared). Replicas
do not exchange spills: nothing they share would bound another replica's notes, so one lost
message would hold a slot for good; each router's spill limit is its own.

Receiving processes call the policy's ``learn`` (a placement) or ``taught`` (a lesson); a
policy stays pure and never sees where an event came from. A prompt's first
:data:`MAX_SHARED_BLOCKS` blocks are passed on. A reader that falls a whole ring behind
loses what it missed (counted), and a router that cannot reach Redis keeps learning
(placements and lessons) from its own workers only, with its own estimates, shown by
``turnout_placement_shared`` at 0, logged once, and once when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
from collections.abc import Callable, Mapping, Sequence

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from policies.base import Policy, SharesLearning, SharesPlacement, SharesSpills
from policies.types import Lesson, Outcome, RequestInfo
from router.backends.store_client import store_client

log = logging.getLogger("router")
_LESSON = "lesson"
"""A lesson's payload is ``[policy, backend, "lesson", [its figures]]``; a placement's has
three items, so a router that knows only placements skips lessons as malformed."""
_SPILL, _SPILL_END = "spill", "spill-end"
"""``[policy, backend, "spill", [origin, request id, prompt tokens]]`` and
``[policy, backend, "spill-end", [origin, request id]]``."""

POLL = 0.02
RING_BYTES = 4 << 20
MAX_SHARED_BLOCKS = 1024
CHANNEL = "turnout:placement"
_HEAD = 8  # bytes written so far (a 64-bit word), then the ring


class PlacementRings:
    """One ring per worker: make it in the parent, before forking."""

    def __init__(self, workers: int, size: int = RING_BYTES) -> None:
        self.workers = workers
        self._size = size
        self._mem = mmap.mmap(-1, workers * (_HEAD + size))

    def ring(self, worker: int) -> WorkerRings:
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} of {self.workers}")
        return WorkerRings(self._mem, self.workers, worker, self._size)


class WorkerRings:
    """One worker's handle: writes its own ring, reads the others'."""

    def __init__(self, mem: mmap.mmap, workers: int, worker: int, size: int) -> None:
        self._size = size
        stride = _HEAD + size
        self._data = [
            memoryview(mem)[w * stride + _HEAD : (w + 1) * stride] for w in range(workers)
        ]
        self._written = [
            memoryview(mem)[w * stride : w * stride + _HEAD].cast("q") for w in range(workers)
        ]
        self.worker = worker
        self._read = [self._written[w][0] for w in range(workers)]  # start from now
        self.lost = 0

    def write(self, payload: bytes) -> None:
        """Append one record (its length, then ``payload``); the count last, so a reader
        never sees a record before all of it is there."""
        record = len(payload).to_bytes(4, "little") + payload
        at = self._written[self.worker][0]
        self._put(self._data[self.worker], at % self._size, record)
        self._written[self.worker][0] = at + len(record)

    def read(self) -> list[bytes]:
        """The records the other workers wrote since the last read."""
        out: list[bytes] = []
        for w, data in enumerate(self._data):
            if w == self.worker:
                continue
            end, pos = self._written[w][0], self._read[w]
            if end - pos > self._size:  # lapped: what was there is overwritten
                self.lost += 1
                pos = end
            while pos < end:
                n = int.from_bytes(self._get(data, pos % self._size, 4), "little")
                payload = self._get(data, (pos + 4) % self._size, n)
                if self._written[w][0] - pos > self._size:  # overwritten while read
                    self.lost += 1
                    pos = self._written[w][0]
                    break
                out.append(payload)
                pos += 4 + n
            self._read[w] = pos
        return out

    def _put(self, data: memoryview, at: int, record: bytes) -> None:
        first = min(len(record), self._size - at)
        data[at : at + first] = record[:first]
        data[: len(record) - first] = record[first:]

    def _get(self, data: memoryview, at: int, n: int) -> bytes:
        first = min(n, self._size - at)
        return bytes(data[at : at + first]) + bytes(data[: n - first])


class PlacementFeed:
    """This process's end of the exchange."""

    def __init__(
        self,
        policies: Callable[[], Mapping[str, Policy]],
        rings: WorkerRings | None,
        redis_url: str | None,
        router: str,
        *,
        speaks: bool = True,
    ) -> None:
        """``policies``: the live ones (a reload swaps them); ``router``: this router's
        name, the same in all its workers; ``speaks``: this process logs the channel's
        outages for its router (its other workers at debug level)."""
        self._policies = policies
        self._rings = rings
        self._router = router.encode()
        self._origin = "" if rings is None else str(rings.worker)
        # No backoff (store_client): a publish stuck in redis-py's backoff would hold up
        # every lesson after it for seconds.
        self._redis = None if redis_url is None else store_client(redis_url)
        self._level = logging.WARNING if speaks else logging.DEBUG
        self._outbox: list[bytes] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.shared = redis_url is not None
        """Whether this router hears from the others (false while Redis is out)."""

    @property
    def active(self) -> bool:
        """Anyone listens: other workers, or other replicas."""
        return self._rings is not None or self._redis is not None

    def placed(self, policy: Policy, backend: str, blocks: Sequence[int]) -> None:
        """``policy`` sent a prompt of ``blocks`` to ``backend``: pass it on."""
        if not blocks or not getattr(policy, "shares_placement", False):
            return
        self._send(orjson.dumps([policy.name, backend, blocks[:MAX_SHARED_BLOCKS]]))

    def catch_up(self, policy: Policy) -> None:
        """Learn now what the other workers wrote since the last poll, when ``policy`` is
        about to choose and counts spills: their latest count against its limit here."""
        if self._rings is not None and getattr(policy, "shares_spills", False):
            for payload in self._rings.read():
                self.learn(payload)

    def committed(self, policy: Policy, request_id: str) -> None:
        """``policy`` has committed ``request_id``: the other workers hear of its spill."""
        self._spill(policy, request_id, _SPILL)

    def finished(self, policy: Policy, req: RequestInfo, backend: str, outcome: Outcome) -> None:
        """``req``, sent by ``policy``, finished on ``backend``: pass on its lesson and the
        end of its spill. Called before the policy's ``on_finish`` (which lets go of what
        they read)."""
        self._spill(policy, req.request_id, _SPILL_END)
        if not isinstance(policy, SharesLearning) or not getattr(policy, "shares_learning", 0):
            return
        lesson = policy.lesson(req, backend, outcome)
        if lesson is not None:
            self._send(orjson.dumps([policy.name, backend, _LESSON, _figures(lesson)]))

    def _spill(self, policy: Policy, request_id: str, kind: str) -> None:
        if self._rings is None or not getattr(policy, "shares_spills", False):
            return
        if not isinstance(policy, SharesSpills) or (spill := policy.spill(request_id)) is None:
            return
        backend, tokens = spill
        figures = [self._origin, request_id] + ([tokens] if kind == _SPILL else [])
        self._rings.write(orjson.dumps([policy.name, backend, kind, figures]))

    def _send(self, payload: bytes) -> None:
        if self._rings is not None:
            self._rings.write(payload)
        if self._redis is not None and len(self._outbox) < 10_000:
            self._outbox.append(payload)

    def learn(self, payload: bytes) -> None:
        """Learn one placement or lesson another process passed on (a malformed one is
        skipped)."""
        try:
            name, backend, *rest = orjson.loads(payload)
            policy = self._policies().get(name)
            if len(rest) == 2 and rest[0] == _LESSON:
                if isinstance(policy, SharesLearning) and getattr(policy, "shares_learning", 0):
                    policy.taught(_lesson(str(backend), rest[1]))
                return
            if len(rest) == 2 and rest[0] in (_SPILL, _SPILL_END):
                if isinstance(policy, SharesSpills) and getattr(policy, "shares_spills", 0):
                    _spilled(policy, str(backend), rest[0] == _SPILL, rest[1])
                return
            [blocks] = rest
        except (ValueError, TypeError, AttributeError):
            return
        if isinstance(policy, SharesPlacement) and getattr(policy, "shares_placement", False):
            policy.learn(str(backend), blocks)

    async def start(self) -> None:
        if self._rings is not None:
            self._tasks.append(asyncio.create_task(self._read_rings(self._rings)))
        if self._redis is not None:
            self._tasks.append(asyncio.create_task(self._publish(self._redis)))
            self._tasks.append(asyncio.create_task(self._listen(self._redis)))

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._redis is not None:
            await self._redis.aclose()

    async def _read_rings(self, rings: WorkerRings) -> None:
        while True:
            await asyncio.sleep(POLL)
            for payload in rings.read():
                self.learn(payload)

    async def _publish(self, redis: Redis) -> None:
        while True:
            await asyncio.sleep(POLL)
            if not self._outbox:
                continue
            batch, self._outbox = self._outbox, []
            message = self._router + b"\n" + b"\n".join(batch)
            try:
                await redis.publish(CHANNEL, message)
            except (RedisError, OSError) as exc:
                self._lost(exc)  # what was sent meanwhile is this router's own

    async def _listen(self, redis: Redis) -> None:
        while True:
            try:
                async with redis.pubsub() as sub:
                    await sub.subscribe(CHANNEL)
                    self._back()
                    async for message in sub.listen():
                        if message.get("type") == "message":
                            self._heard(message["data"])
            except (RedisError, OSError) as exc:
                self._lost(exc)
                await asyncio.sleep(1.0)

    def _heard(self, data: bytes) -> None:
        sender, _, body = data.partition(b"\n")
        if sender == self._router:
            return  # its workers have it from the ring
        for payload in body.split(b"\n"):
            self.learn(payload)

    def _lost(self, exc: BaseException) -> None:
        if self.shared:
            self.shared = False
            log.log(
                self._level,
                "placement channel unreachable (%s): this router learns from itself alone",
                type(exc).__name__,
            )

    def _back(self) -> None:
        if not self.shared:
            self.shared = True
            log.log(self._level, "placement channel reachable again: placements are shared again")


def _figures(lesson: Lesson) -> list[object]:
    o = lesson.outcome
    return [
        lesson.request_class,
        lesson.stream,
        lesson.prompt_tokens,
        lesson.ahead_tokens,
        o.status,
        o.ok,
        o.prompt_tokens,
        o.output_tokens,
        o.ttft_s,
        o.e2e_s,
        o.tpot_s,
    ]


def _lesson(backend: str, figures: object) -> Lesson:
    """The lesson :func:`_figures` wrote (ValueError or TypeError when it is not one)."""
    if not isinstance(figures, list):
        raise TypeError(figures)
    cls, stream, prompt, ahead, status, ok, p_tokens, o_tokens, ttft, e2e, tpot = figures
    if cls != "interactive" and cls != "batch":
        raise ValueError(cls)
    outcome = Outcome(
        _count(status), ok is True, _count(p_tokens), _count(o_tokens),
        _seconds(ttft), _seconds(e2e), _seconds(tpot),
    )  # fmt: skip
    return Lesson(backend, cls, stream is True, _count(prompt), float(_count(ahead)), outcome)


def _spilled(policy: SharesSpills, backend: str, opened: bool, figures: object) -> None:
    """Tell ``policy`` of the spill :meth:`PlacementFeed._spill` wrote (ValueError or
    TypeError when it is not one)."""
    if not isinstance(figures, list):
        raise TypeError(figures)
    if opened:
        origin, request_id, tokens = figures
        policy.spill_opened(str(origin), str(request_id), backend, _count(tokens))
    else:
        origin, request_id = figures
        policy.spill_closed(str(origin), str(request_id))


def _count(value: object) -> int:
    if not isinstance(value, int | float) or not 0 <= value < 1e12:
        raise ValueError(value)
    return int(value)


def _seconds(value: object) -> float | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or not 0 <= value < 1e6:
        raise ValueError(value)
    return float(value)
