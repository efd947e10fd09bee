"""One policy's run over a schedule, in virtual time: the router's request path without I/O.

The router acts at two kinds of moment: an arrival (classify, the policy chooses over the
pool's snapshots, the first ranked backend that serves the model and is not at
``max_inflight`` takes the request under a lease, its engine model schedules it) and a
scrape of every engine's load. Between two such moments the engines run on their own, so
each engine model is advanced to the next moment in one call (every step due by then,
in order); the answers that ended meanwhile are then settled in the order they ended, each
at its own time: the lease ends, ``on_finish`` gets the outcome the router would measure,
and the :class:`~replay.client.Result` is what the live replayer would have recorded. On a
tie a step that ends at the moment of an arrival completes first, as in the engine model.
Nothing sleeps and nothing is sent: the clock jumps from one moment to the next.

A ``pd`` policy's request takes its two hops as in the router (router/proxy/pd.py): when its
first attempt is launched, a one-token prefill goes to the first prefill engine with room
(none has: the decode engine prefills it), and when that ends the attempt's decode engine
pulls its blocks (:mod:`emulator.kvtransfer`); a decode attempt after a failed one prefills
afresh. While a prefill is in flight the engines run event by event, so it hands over at its
own moment.

TTFT, E2E and TPOT come from the engine model's own times for each sequence (its first and
last token). The gaps between a stream's chunks are reported as that stream's mean gap, one
per gap: the mean ITL is exact, ITL percentiles are over per-request means.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable

from emulator.rank import Sequence
from policies.base import Policy, reads_prefix
from policies.pd import PdPolicy, PhasePlan
from policies.types import Outcome
from replay.client import Result
from replay.plan import Planned
from replay.simulate.attempts import Attempts, Flight, Waiter
from replay.simulate.conversations import Conversations, sim_turn
from replay.simulate.handoff import prefill_engine, pull
from replay.simulate.prompts import Prompts
from replay.simulate.requests import Refused, Routed, engine_sequence, understand
from replay.simulate.tail import Tails
from replay.simulate.world import Backend, World
from replay.sources import Item
from router.control.plan import Attempt, Refusal, plan
from turnout.common.figures import first_token, per_token

OnResult = Callable[[Item, Result, float], None]
"""Called with each answered or failed request, its result and its send time (seconds)."""


class Simulation:
    """Runs ``policy`` over a schedule in ``world``; reports each request to ``on_result``."""

    def __init__(
        self,
        world: World,
        policy: Policy,
        label: str,
        on_result: OnResult,
        *,
        salt: int = 0,
        mark: bool = False,
        closed_loop: bool = False,
    ) -> None:
        self.world = world
        self.prompts = Prompts(salt, mark=mark)
        """Prompts salted as the live replayer salts its ``salt``-th run (``mark``: recorded
        ones marked, as when it compares runs)."""
        self.policy = policy
        self.label = label
        self.on_result = on_result
        self.flights: dict[Sequence, Flight] = {}
        self._talks = Conversations()
        self._prefills: dict[Sequence, Attempt] = {}  # pd prefill hops: their decode attempt
        self._pulls: dict[Waiter, tuple[Backend, Sequence] | None] = {}  # prefill hop ended
        self.router = Attempts(world.config, self._launch, self._refuse)
        """Admission, failover and timeouts, on the virtual clock."""
        self.tails = Tails(world.config, self.router, self._copy, self._cut, self._arm)
        """First-token deadlines and hedges of the classes with ``tail`` settings."""
        self._model = world.model()
        self.events = 0
        """Router moments (arrivals and scrapes) simulated."""
        self._closed_loop = closed_loop
        self._prefix = reads_prefix(policy)

    def follow(self, planned: Planned) -> None:
        """Schedule a closed-loop source's next request (from ``on_result``, at or after the
        answer's time; needs ``closed_loop=True`` so engines run one event at a time)."""
        self._talks.follow(planned)

    def run(self, plan: Iterable[Planned], *, start: float = 0.0) -> float:
        """Serve the whole schedule and every answer; returns the virtual end time.

        The clock starts at ``start`` (a shard's window), the first scrape with it.
        """
        world = self.world
        health = world.config.health
        every = health.scrape_interval if health.scrape_metrics else math.inf
        next_scrape = start if health.scrape_metrics else math.inf
        world.now = start
        arrivals = iter(plan)
        nxt = next(arrivals, None)
        ready = self._talks.ready
        router = self.router
        while nxt is not None or self.flights or ready or router.next_timer() is not None:
            t_plan = nxt.at if nxt is not None else math.inf
            t_ready = ready[0][0] if ready else math.inf
            t_timer = router.next_timer()
            t_timer = math.inf if t_timer is None else t_timer
            now = min(t_plan, t_ready, next_scrape, t_timer)
            if not self._advance(now) or (ready and ready[0][0] < now):
                continue  # stepping towards ``now``, or an answer let a turn go earlier
            if nxt is None and not self.flights and not ready and router.next_timer() is None:
                break  # the last answer is in
            world.now = now
            self.events += 1
            if next_scrape <= now:
                for b in world.backends:
                    b.scrape()
                next_scrape += every
            elif t_timer <= now:
                router.fire(now)
            elif t_ready <= now:
                self._arrive(heapq.heappop(ready)[2], now, ready=True)
            elif nxt is not None:
                self._arrive(nxt, now)
                nxt = next(arrivals, None)
        return world.now

    def _advance(self, until: float) -> bool:
        """Every engine to ``until``, then the answers that ended, in the order they ended.

        While turns wait for answers, only as far as the earliest engine event (an answer
        may let a turn go before ``until``); returns whether the engines reached ``until``.
        """
        ended: list[tuple[float, int, Flight, Sequence]] = []
        firsts: list[tuple[float, int, Flight]] = []
        flights = self.flights
        target = until
        # an answer may release a turn or a waiting request before then
        busy = self.router.waiting or self._prefills or self.tails.racing
        if self._talks.queued or self._closed_loop or busy:
            due = [b.deadline for b in self.world.backends if b.deadline is not None]
            until = min([until, *due])
        for b in self.world.backends:
            if b.deadline is None or b.deadline > until:
                continue
            scale = b.scale
            # at least to its own next event, exactly (``until`` may be that event, scaled)
            for seq in b.engine.advance(max(until * scale, b.engine_deadline)):
                f = flights[seq]
                if f.first is None and seq.first_token_at is not None:
                    f.first = seq.first_token_at / scale
                    f.lease.prefilled()
                    firsts.append((f.first, seq.key, f))
                f.chunks += len(seq.chunks)
                seq.chunks.clear()
                if seq.finished_at is not None:
                    ended.append((seq.finished_at / scale, seq.key, f, seq))
            b.refresh()
        firsts.sort(key=lambda e: (e[0], e[1]))
        for t, _, f in firsts:  # a held stream's race: the first token wins, the others cut
            if flights.get(f.seq) is f:
                self.tails.first(f, t)
        ended.sort(key=lambda e: (e[0], e[1]))
        for t, _, f, seq in ended:
            if flights.get(seq) is not f:
                continue  # cut by a race
            del flights[seq]
            self.world.now = t
            decode = self._prefills.pop(seq, None)
            if decode is not None:
                self._hand_over(f, seq, decode, t)
            else:
                self._answer(f, seq, t)
        return until >= target

    def _arrive(self, planned: Planned, now: float, *, ready: bool = False) -> None:
        item, world = planned.item, self.world
        routed: Routed | None = None
        go, prev = self._talks.begin(planned, now, ready)
        if not go:
            return
        try:
            routed = understand(
                item,
                self._model,
                world.config.classification,
                self.prompts,
                prev,
                prefix=self._prefix,
            )
        except Refused as e:
            self._refused(item, routed, e, now)
            return
        # the router's own planning (router.control.plan), then its admission and attempts
        chosen = plan(world.pool, self.policy, routed.info, world.config.failover.max_attempts)
        if isinstance(chosen, Refusal):
            self._refused(item, routed, Refused(chosen.status, chosen.message), now)
            return
        share = self.router.share_of(routed)
        self.router.send(Waiter(routed, chosen, now, list(chosen.attempts), share=share), now)

    def _launch(self, w: Waiter, attempt: Attempt, now: float) -> None:
        """``w``'s attempt on ``attempt``'s backend: the engine model takes it at ``now``."""
        info, backend = w.routed.info, self.world.by_name[attempt.backend.name]
        hopped = w in self._pulls
        first = not w.failovers and not hopped
        if first:  # committed to its first attempt's backend
            self.policy.committed(info, w.plan.decision, backend.state.name)
        phases = w.plan.decision.memo
        two_hops = not hopped and isinstance(phases, PhasePlan) and phases.prefill is not None
        if two_hops and isinstance(phases, PhasePlan) and self._prefill(w, attempt, phases, now):
            return
        try:
            f = self._start(w, attempt, now)
        except Refused as e:  # the engine's own error answer
            self.router.left(w, now)
            self._refused(w.routed.item, w.routed, e, now, backend.state.name)
            return
        # held until its first token: a pd request's hops are not (as router.proxy.pd)
        if not (first and not two_hops and self.tails.hold(f, now)):
            self._arm(f, now)

    def _start(self, w: Waiter, attempt: Attempt, now: float) -> Flight:
        """The engine model of ``attempt``'s backend takes ``w`` at ``now`` (raises
        :class:`Refused` for the engine's own error answer)."""
        backend = self.world.by_name[attempt.backend.name]
        seq, finish, reply = engine_sequence(
            w.routed,
            backend.profile,
            attempt.model,
            backend.seed,
            backend.engine.capacity_tokens(),
            w.plan.priority(backend.state, w.share.band),
            self.prompts,
        )
        held = self._pulls.pop(w, None)
        if held is not None:  # the decode hop of a pd request: it pulls the prefill's blocks
            pull(held[0], held[1], backend, seq, now)
        f = Flight(w, seq, backend, backend.state.lease(w.routed.info), finish, reply)
        self.flights[seq] = f
        backend.engine.submit(seq, now * backend.scale)
        backend.refresh()
        return f

    def _copy(self, w: Waiter, attempt: Attempt, now: float) -> Flight | None:
        """A held stream's failover or hedge (None: the engine refused it)."""
        try:
            return self._start(w, attempt, now)
        except Refused:
            return None

    def _arm(self, f: Flight, now: float) -> None:
        """``f``'s timeouts from ``now``: a stream's idle bound, an answer's deadline."""
        info, seq = f.routed.info, f.seq
        timeouts = self.world.config.timeouts_for(info.request_class)
        flying = lambda: self.flights.get(seq) is f  # noqa: E731
        if info.stream and timeouts.idle is not None:
            self.router.at(now + timeouts.idle, lambda t: self._idle(f, t), flying)
        elif not info.stream and (deadline := timeouts.deadline(False)) is not None:
            self.router.at(now + deadline, lambda t: self._timed_out(f, t), flying)

    def _prefill(self, w: Waiter, decode: Attempt, phases: PhasePlan, now: float) -> bool:
        """A ``pd`` request's prefill hop, one token long, its blocks held for ``decode``
        (False: no prefill engine has room)."""
        assert isinstance(self.policy, PdPolicy)
        info = w.routed.info
        found = prefill_engine(self.world, phases, info.model)
        if found is None:
            return False
        backend, model = found
        self.policy.prefill_committed(info, phases, backend.state.name)
        try:
            seq, finish, reply = engine_sequence(
                w.routed, backend.profile, model, backend.seed,
                backend.engine.capacity_tokens(), None, self.prompts,
            )  # fmt: skip
        except Refused as e:
            self.router.left(w, now)
            self._refused(w.routed.item, w.routed, e, now, backend.state.name)
            return True
        seq.output_tokens, seq.hold_kv = 1, True
        self.flights[seq] = Flight(w, seq, backend, backend.state.lease(info), finish, reply)
        self._prefills[seq] = decode
        backend.engine.submit(seq, now * backend.scale)
        backend.refresh()
        return True

    def _hand_over(self, f: Flight, seq: Sequence, decode: Attempt, now: float) -> None:
        """A ``pd`` request's prefill ended at ``now``: its decode attempt goes, and pulls."""
        assert isinstance(self.policy, PdPolicy)
        f.lease.ok()
        f.lease.release()
        self.router.released(now)
        self.policy.prefilled(f.routed.info, f.backend.state.name, Outcome(200, True))
        self._pulls[f.waiter] = (f.backend, seq)
        self._launch(f.waiter, decode, now)

    def _cut(self, f: Flight, now: float) -> bool:
        """End ``f``'s attempt unanswered (the router closed its connection); False when it
        is over already."""
        if self.flights.get(f.seq) is not f:
            return False
        del self.flights[f.seq]
        f.backend.engine.cancel(f.seq, now * f.backend.scale)
        f.backend.refresh()
        f.lease.release()
        self.router.released(now)
        return True

    def _timed_out(self, f: Flight, now: float) -> None:
        """An answer not streamed is not whole by its deadline: the attempt fails over."""
        if self._cut(f, now):
            self.router.failed(f.waiter, f.lease, f.backend.state.name, now)

    def _idle(self, f: Flight, now: float) -> None:
        """A stream's first token has not come within ``idle``: the stream is cut."""
        if f.first is None and self._cut(f, now):
            message = f"backend {f.backend.state.name} sent nothing for too long"
            self.router.left(f.waiter, now)
            self._refused(f.routed.item, f.routed, Refused(200, message), now, f.backend.state.name)

    def _refuse(self, w: Waiter, e: Refused, now: float) -> None:
        self.router.left(w, now)
        self._refused(w.routed.item, w.routed, e, now)

    def _refused(
        self, item: Item, routed: Routed | None, e: Refused, now: float, backend: str = "none"
    ) -> None:
        cls = routed.info.request_class if routed is not None else "default"
        error = {"message": str(e), "code": e.status}
        r = Result(item.record.custom_id, cls, e.status, False, None, None, self.label, error=error)
        if routed is not None:  # the router feeds back refusals too (see Exchange.finish)
            self.policy.on_finish(routed.info, backend, Outcome(e.status, False))
        self._talks.turn_over(item, None, now)
        self.on_result(item, r, now)

    def _answer(self, f: Flight, seq: Sequence, now: float) -> None:
        info = f.routed.info
        f.lease.ok()
        f.lease.release()
        self.router.answered(f.waiter)
        self.router.left(f.waiter, now)
        self.router.released(now)
        first = f.first if f.first is not None else now
        e2e = now - f.sent
        gaps = f.chunks - 1
        itls = [(now - first) / gaps] * gaps if info.stream and gaps > 0 else []
        ttft = first_token(info.stream, first - f.sent, e2e)
        n = seq.generated
        tpot = per_token(ttft, e2e, n, info.choices) if info.stream else None
        name = f.backend.state.name
        self.policy.on_finish(info, name, Outcome(200, True, seq.prompt_tokens, n, ttft, e2e, tpot))
        r = Result(
            info.request_id,
            info.request_class,
            200,
            info.stream,
            None,
            name,
            self.label,
            ttft=ttft,
            e2e=e2e,
            itls=itls,
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=n,
            finish_reason=f.finish,
        )
        if f.routed.item.session is not None:
            self._talks.turn_over(f.routed.item, sim_turn(f, seq), now)
        self.on_result(f.routed.item, r, f.sent)
