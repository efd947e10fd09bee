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

What is decided (which attempt is cut at its deadline, when a failover or a hedge goes, who
wins, what a miss counts against) is :class:`router.control.race.Race`'s, the one core that
``replay simulate`` drives in virtual time too; this module carries its moves out on
sockets: a cut closes the attempt's connection (the engine frees the slot) and releases its
lease, an opening is :func:`~router.proxy.upstream.open_upstream` down the rest of the
ranking, and the metrics (``turnout_first_token_deadlines_missed_total``,
``turnout_hedges_*``, ``turnout_hedge_wasted_tokens_total``) count what it did.

The request's record, quota, capture and policy feedback see only the winner (the handler
keeps one :class:`~router.proxy.upstream.Opened`); every attempt held its own backend lease
while it lasted, so in-flight counts stayed true.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from policies.types import RequestClass, RequestInfo
from router.config.model import RouterConfig
from router.config.tail import TailSettings
from router.control.admission import Admission, QueueRejected
from router.control.race import Held, Moves
from router.control.race import Race as Decisions
from router.control.race import queueing as busy
from router.control.tailstate import TailMemory
from router.observe.metrics import Metrics
from router.proxy.keepalive import ConnectionPool
from router.proxy.state import RouterState
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
    """An attempt's connection and the scan of its buffered stream."""

    opened: Opened
    probe: StreamMeter
    watch: asyncio.Task[None]


@dataclass(slots=True)
class Race:
    """One request's held attempts on sockets: :class:`router.control.race.Race` decides,
    this carries its moves out; :meth:`run` returns the winner."""

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
    """Whether another attempt on this target would only wait (the budget then collapses)."""
    _core: Decisions[_Attempt, Target] | None = None
    _opening: asyncio.Task[Opened] | None = None
    _hedging: bool = False

    async def run(self, first: Opened, sent: float, rest: Sequence[Target]) -> Opened:
        """The attempt whose stream the client gets; every other one is cut."""
        if not _is_stream(first):
            first.lease.ok()
            return first
        req = self.req
        core = self._core = Decisions(
            self.tail, self.memory, req.request_class, req.prompt_tokens, rest,
            self.queueing, self.hold_max,
        )  # fmt: skip
        core.start(self._attempt(first, sent), first.target.backend.name, sent)
        winner: Held[_Attempt] | None = None
        try:
            while winner is None:
                now = time.monotonic()
                winner = self._apply(core.due(now))
                if winner is not None:
                    break
                timer = core.next_timer()
                waits: set[asyncio.Future[Any]] = {a.handle.watch for a in core.live}
                opening = self._opening
                if opening is not None:
                    waits.add(opening)
                timeout = None if timer == math.inf else max(0.0, timer - now)
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if opening is not None and opening.done():
                    self._opening = None
                    winner = self._opened(opening)
                winner = winner or self._settled()
            opened = winner.handle.opened
            opened.lease.ok()
            return replace(opened, failovers=core.attempts - 1)
        finally:
            if self._opening is not None:  # a client gone, or a winner before it answered
                self._opening.cancel()
                self._opening.add_done_callback(self._discard)
            for a in list(core.live):
                if a is not winner:
                    self._cut(a)

    def _attempt(self, opened: Opened, sent: float) -> _Attempt:
        probe = StreamMeter(sent, max_event_size=self.max_event_size, choices=self.req.choices)
        watch = asyncio.ensure_future(_scan(opened, probe, self.max_event_size))
        return _Attempt(opened, probe, watch)

    def _apply(self, moves: Moves[_Attempt, Target]) -> Held[_Attempt] | None:
        """Carry out the core's moves; the winner, if they name one."""
        for a, missed in moves.cut:
            self._cut(a, missed=missed)
        if moves.open is not None:
            self._opening = asyncio.ensure_future(self.open_more(moves.open))
            self._hedging = moves.hedge
        winner = moves.winner
        if winner is not None and winner.handle.probe.first_content is not None:
            for late in moves.blame:  # another backend served in time: the miss counts
                late.handle.opened.lease.failed()
            if winner.hedge:
                self.metrics.hedge_won(self.policy, winner.backend, self.req)
        return winner

    def _opened(self, task: asyncio.Task[Opened]) -> Held[_Attempt] | None:
        """A hedge's or a failover's opening ended; a winner if its answer is not a stream."""
        core = self._core
        assert core is not None
        try:
            opened = task.result()
        except (UpstreamFailed, QueueRejected):
            core.open_failed()
            return None
        if self._hedging:
            self.metrics.hedge_fired(self.policy, opened.target.backend.name, self.req)
        now = time.monotonic()
        moves = core.opened(
            self._attempt(opened, now), opened.target, now,
            failovers=opened.failovers, stream=_is_stream(opened),
        )  # fmt: skip
        return self._apply(moves)

    def _discard(self, task: asyncio.Task[Opened]) -> None:
        """An opening no longer wanted ended: cut what it opened, if anything."""
        if not task.cancelled() and task.exception() is None:
            opened = task.result()
            opened.conn.abort()
            self.connections.release(opened.conn)
            opened.lease.release()

    def _settled(self) -> Held[_Attempt] | None:
        """The attempt whose scan ended (content, or an answer not to be held), if any."""
        core = self._core
        assert core is not None
        for a in list(core.live):
            att = a.handle
            if not att.watch.done():
                continue
            probe = att.probe
            if probe.first_content is not None:
                return self._apply(core.content(a, probe.first_content))
            broke = not probe.done and probe.failure is None and att.opened.conn.over
            moves = core.ended(a, broke=broke)
            if moves.winner is None:
                att.opened.lease.failed()  # broke off before its first token: the backend's
            winner = self._apply(moves)
            if winner is not None:
                return winner
        return None

    def _cut(self, a: Held[_Attempt], *, missed: bool = False) -> None:
        """Close ``a``'s connection (the engine frees its slot) and end its lease."""
        core = self._core
        assert core is not None
        att = a.handle
        att.watch.cancel()
        opened = att.opened
        opened.conn.abort()
        self.connections.release(opened.conn)
        opened.lease.release()
        backend = opened.target.backend.name
        if missed:
            self.metrics.deadline_missed(self.policy, backend, self.req)
        if core.hedged:
            wasted = core.wasted(att.probe.content_events)
            self.metrics.hedge_cancelled(self.policy, backend, self.req, wasted)


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
    """Whether a copy to a target would wait (router.control.race.queueing)."""
    return lambda target: busy(target.backend, admission.waiting(cls))
