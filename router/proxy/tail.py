"""Holding a stream's head until its first content token: the first-token deadline and
hedged requests of a class's ``tail`` settings (router.config.tail).

An SSE answer's headers (and a chat stream's role chunk) come long before its first token,
and an engine can stall in between. So for a class with ``tail`` settings the router keeps
the head and whatever comes before the first content event in the upstream connection's
buffer (nothing reaches the client) and scans it with a probe meter; the attempt that
produces a content event first wins, and the relay then passes its buffered bytes and the
rest on as they came, byte for byte. The race ends as soon as an answer is plainly not
going to be held: not an event stream, a stream that ended or broke, or more than
``max_event_size`` buffered without content.

- **Deadline.** An attempt with no content by its deadline (from its send) is cut: its
  connection is closed (the engine frees the slot) and its lease released. If another
  attempt is live it simply goes on; else the next backends of the ranking are tried, and the
  late attempt is cut once one of them answered its headers (if none does, it stays). No
  failover goes to a backend that is full or reports waiting requests: under saturation a
  late token is the queue's, and cutting would only requeue the request. The last attempt
  (as is one whose every backend left is queueing) is never cut: it gets
  ``last_attempt_grace`` times its deadline, and past that its stream is let through to the
  client as it is. A cut attempt's lease is told it failed
  only once another backend produced a first token for the same request, so a missed deadline
  counts toward ejection only as failures do (router.proxy.upstream's evidence rule).
- **Hedge.** When the first attempt has no content after the hedge delay, the class's
  budget allows it (router.proxy.tailstate), the prompt is short enough and the next
  backend is not queueing, one copy goes down the rest of the ranking. The first content
  wins; the other attempt is cut and counted (``turnout_hedges_cancelled_total``, and its
  prompt and streamed content events in ``turnout_hedge_wasted_tokens_total``).

The request's record, quota, capture and policy feedback see only the winner (the handler
keeps one :class:`~router.proxy.upstream.Opened`); every attempt held its own backend lease
while it lasted, so in-flight counts stayed true.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from policies.types import RequestClass, RequestInfo
from router.config.model import RouterConfig
from router.config.tail import TailSettings
from router.control.admission import Admission, QueueRejected
from router.control.plan import first_free
from router.observe.metrics import Metrics
from router.proxy.keepalive import ConnectionPool
from router.proxy.state import RouterState
from router.proxy.tailstate import TailMemory
from router.proxy.upstream import Opened, Target, UpstreamFailed
from turnout.common.sse import StreamMeter

_HOLD_MAX = 60.0  # seconds an attempt is held without a deadline when the class sets no idle

Opener = Callable[..., Awaitable[Opened]]
"""Opens the first of the targets it is given that answers, failing over down them
(router.proxy.upstream.open_upstream bound to the request, its lease left unconfirmed)."""


async def hold_first_token(
    state: RouterState,
    config: RouterConfig,
    tail: TailSettings,
    opening: Opener,
    policy: str,
    req: RequestInfo,
    first: Opened,
    sent: float,
    targets: Sequence[Target],
) -> Opened:
    """The attempt whose stream the client gets, after ``first`` (sent at ``sent``, of the
    ranking ``targets``) and what the class's ``tail`` settings sent after it."""
    at = next(i for i, t in enumerate(targets) if t is first.target)
    race = Race(
        state.connections,
        partial(opening, admission=None),  # a failover meets a full fleet by keeping its own
        tail,
        state.tail,
        state.metrics,
        req,
        policy,
        config.limits.max_upstream_event_bytes,
        config.timeouts_for(req.request_class).idle or _HOLD_MAX,
        queueing(state.admission, req.request_class),
    )
    return await race.run(first, sent, targets[at + 1 :])


@dataclass(slots=True, eq=False)
class _Attempt:
    opened: Opened
    sent: float
    deadline: float
    hedge: bool
    probe: StreamMeter
    watch: asyncio.Task[None]
    graced: bool = False
    late: bool = False
    """Past its deadline, kept until a failover's attempt answers."""

    @property
    def content(self) -> bool:
        return self.probe.first_content is not None


@dataclass(slots=True)
class Race:
    """One request's held attempts; :meth:`run` returns the winner."""

    connections: ConnectionPool
    open_more: Opener
    tail: TailSettings
    memory: TailMemory
    metrics: Metrics
    req: RequestInfo
    policy: str
    max_event_size: int
    hold_max: float
    """The longest an attempt is held without a deadline (the class's idle timeout)."""
    queueing: Callable[[Target], bool]
    """Whether a hedge to this target would only queue (the budget then collapses)."""
    live: list[_Attempt] = field(default_factory=list)
    rest: list[Target] = field(default_factory=list)
    """The ranking's targets no attempt or opening has gone to yet."""
    cut_late: list[_Attempt] = field(default_factory=list)
    hedged: bool = False
    attempts: int = 1
    _given: list[Target] = field(default_factory=list)

    async def run(self, first: Opened, sent: float, rest: Sequence[Target]) -> Opened:
        """The attempt whose stream the client gets; every other one is cut."""
        if not _is_stream(first):
            first.lease.ok()
            return first
        self.rest = list(rest)
        hedge, budget = self.tail.hedge, None
        if hedge is not None:
            budget = self.memory.budget(self.req.request_class, hedge.max_fraction)
            budget.earn()
        self._add(first, sent, hedge=False)
        winner: _Attempt | None = None
        opening: asyncio.Task[Opened] | None = None
        opening_hedge = False
        hedge_at = self._hedge_at(first, sent)
        try:
            while winner is None:
                now = time.monotonic()
                if hedge_at <= now and opening is None and budget is not None and self.rest:
                    hedge_at = math.inf
                    if budget.spend(self.queueing(self.rest[0])):
                        opening, opening_hedge = self._open(), True
                        self.hedged = opening is not None
                winner = self._expire(now, opening is not None)
                if winner is not None:
                    break
                if opening is None and any(a.late for a in self.live) and self.rest:
                    opening, opening_hedge = self._open(), False
                timer = min([hedge_at, *(a.deadline for a in self.live if not a.late)])
                waits: set[asyncio.Future[Any]] = {a.watch for a in self.live}
                if opening is not None:
                    waits.add(opening)
                timeout = None if timer == math.inf else max(0.0, timer - now)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if opening is not None and opening.done():
                    winner = self._opened(opening, opening_hedge)
                    opening = None
                winner = winner or self._settled()
            return replace(self._won(winner), failovers=self.attempts - 1)
        finally:
            if opening is not None:  # a client gone, or a winner before it answered
                opening.cancel()
                opening.add_done_callback(self._discard)
            for a in list(self.live):
                if a is not winner:
                    self._cut(a)

    # -- attempts -------------------------------------------------------------------------

    def _add(self, opened: Opened, sent: float, *, hedge: bool) -> _Attempt:
        backend = opened.target.backend.name
        limit = self.memory.deadline(self.tail, self.req.request_class, backend)
        probe = StreamMeter(sent, max_event_size=self.max_event_size, choices=self.req.choices)
        watch = asyncio.ensure_future(_scan(opened, probe, self.max_event_size))
        deadline = sent + (self.hold_max if limit is None else limit)
        a = _Attempt(opened, sent, deadline, hedge, probe, watch)
        self.live.append(a)
        return a

    def _open(self) -> asyncio.Task[Opened] | None:
        """Open the rest of the ranking from its first backend with room (the opening fails
        over down it by itself); None when every one is full."""
        at = first_free(self.rest)
        if at is None:
            return None
        self._given, self.rest = self.rest[at:], []
        return asyncio.ensure_future(self.open_more(self._given))

    def _opened(self, task: asyncio.Task[Opened], hedge: bool) -> _Attempt | None:
        """A hedge's or a failover's opening ended; a winner if its answer is not a stream."""
        try:
            opened = task.result()
        except (UpstreamFailed, QueueRejected):
            for a in self.live:  # they stay; the last of them gets its grace
                a.late = False
            return None
        given = self._given
        at = next(i for i, t in enumerate(given) if t is opened.target)
        self.rest = given[at + 1 :]
        self.attempts += opened.failovers + 1
        if hedge:
            self.metrics.hedge_fired(self.policy, opened.target.backend.name, self.req)
        a = self._add(opened, time.monotonic(), hedge=hedge)
        if not _is_stream(opened):
            return a
        for late in [x for x in self.live if x.late]:
            self._cut(late, missed=True)
        return None

    def _discard(self, task: asyncio.Task[Opened]) -> None:
        """An opening no longer wanted ended: cut what it opened, if anything."""
        if not task.cancelled() and task.exception() is None:
            opened = task.result()
            opened.conn.abort()
            self.connections.release(opened.conn)
            opened.lease.release()

    def _expire(self, now: float, opening: bool) -> _Attempt | None:
        """Cut or mark the attempts past their deadline; a graced one past its grace wins."""
        for a in list(self.live):
            if a.deadline > now or a.late:
                continue
            others = any(x is not a and not x.late for x in self.live)
            if others:
                self._cut(a, missed=True)
            elif opening or self._may_fail_over():
                a.late = True  # cut once a failover's attempt has answered
            elif not a.graced:
                a.graced = True
                a.deadline = a.sent + (a.deadline - a.sent) * self.tail.last_attempt_grace
            else:
                return a  # let through, however late: never a 504 for a valid answer
        return None

    def _may_fail_over(self) -> bool:
        """A backend is left that has room and does not queue: under saturation a late
        first token is the queue's, and another attempt would only join another queue."""
        at = first_free(self.rest)
        return at is not None and not self.queueing(self.rest[at])

    def _settled(self) -> _Attempt | None:
        """The attempt whose scan ended (content, or an answer not to be held), if any; one
        that broke before any content is cut while another attempt is live."""
        for a in list(self.live):
            if not a.watch.done():
                continue
            probe = a.probe
            broke = not a.content and not probe.done and probe.failure is None
            if broke and a.opened.conn.over and len(self.live) > 1:
                a.opened.lease.failed()  # broke off before its first token: the backend's
                self._cut(a)
                continue
            return a
        return None

    def _won(self, a: _Attempt) -> Opened:
        opened = a.opened
        opened.lease.ok()
        if a.content:
            cls, backend = self.req.request_class, opened.target.backend.name
            first = a.probe.first_content or a.sent
            self.memory.window(cls, backend).add(first - a.sent)
            for late in self.cut_late:  # another backend served in time: the miss counts
                late.opened.lease.failed()
            if a.hedge:
                self.metrics.hedge_won(self.policy, backend, self.req)
        return opened

    def _cut(self, a: _Attempt, *, missed: bool = False) -> None:
        """Close ``a``'s connection (the engine frees its slot) and end its lease."""
        if a in self.live:
            self.live.remove(a)
        a.watch.cancel()
        opened = a.opened
        opened.conn.abort()
        self.connections.release(opened.conn)
        opened.lease.release()
        if missed:
            self.cut_late.append(a)
            self.metrics.deadline_missed(self.policy, opened.target.backend.name, self.req)
        if self.hedged:
            wasted = self.req.prompt_tokens + a.probe.content_events
            self.metrics.hedge_cancelled(self.policy, opened.target.backend.name, self.req, wasted)

    def _hedge_at(self, first: Opened, sent: float) -> float:
        tail, req = self.tail, self.req
        hedge = tail.hedge
        if hedge is None or not self.rest:
            return math.inf
        if hedge.max_prompt_tokens is not None and req.prompt_tokens > hedge.max_prompt_tokens:
            return math.inf
        delay = self.memory.hedge_delay(tail, req.request_class, first.target.backend.name)
        return math.inf if delay is None else sent + delay


def _is_stream(opened: Opened) -> bool:
    ctype = opened.head.headers.get("Content-Type", "")
    return 200 <= opened.head.status < 300 and ctype.startswith("text/event-stream")


async def _scan(opened: Opened, probe: StreamMeter, limit: int) -> None:
    """Until the buffered stream shows content, ends, breaks or grows past ``limit``."""
    conn = opened.conn
    seen = 0
    while True:
        data = conn.buffered(seen)
        if data:
            seen += len(data)
            probe.feed(data, time.monotonic())
        if probe.first_content is not None or probe.done or probe.failure is not None:
            return
        if conn.over or seen > limit:
            return
        await conn.more()


def queueing(admission: Admission, cls: RequestClass) -> Callable[[Target], bool]:
    """Whether a copy to a target would wait: its class queues for admission, or the backend
    is at its ``max_inflight`` or its engine last reported requests waiting."""

    def busy(target: Target) -> bool:
        b = target.backend
        cap = b.spec.max_inflight
        waiting = b.load.waiting if b.load is not None else None
        full = cap is not None and b.inflight >= cap
        return admission.waiting(cls) > 0 or full or bool(waiting)

    return busy
