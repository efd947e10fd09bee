"""One policy's run over a schedule, in virtual time: the router's request path without I/O.

An event loop over three kinds of event, taken in time order (on a tie: engine steps, then
the router's scrape, then arrivals, as a step that ends at the very moment a request arrives
completes before the request can join one). Each arrival goes the router's way: classify,
the policy chooses over the pool's snapshots, the first ranked backend that serves the model
and is not at ``max_inflight`` takes it under a lease, and its engine model schedules it.
Each answer ends the lease, feeds ``on_finish`` with the outcome the router would measure,
and becomes the :class:`~replay.client.Result` the live replayer would have recorded.
Nothing sleeps and nothing is sent: the clock jumps from one event to the next.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from emulator.rank import Sequence
from policies.base import Policy
from policies.types import Outcome
from replay.client import Result
from replay.plan import Planned
from replay.simulate.requests import Refused, Routed, engine_sequence, understand
from replay.simulate.world import Backend, World
from replay.sources import Item
from router.backends.pool import BackendLease

OnResult = Callable[[Item, Result, float], None]
"""Called with each answered or failed request, its result and its send time (seconds)."""


@dataclass(slots=True, eq=False)
class Flight:
    """One request in an engine."""

    routed: Routed
    backend: Backend
    lease: BackendLease
    sent: float
    finish: str
    first: float | None = None
    last: float = 0.0
    itls: list[float] = field(default_factory=list)


class Simulation:
    """Runs ``policy`` over a schedule in ``world``; reports each request to ``on_result``."""

    def __init__(self, world: World, policy: Policy, label: str, on_result: OnResult) -> None:
        self.world = world
        self.policy = policy
        self.label = label
        self.on_result = on_result
        self.flights: dict[Sequence, Flight] = {}
        self._due: list[tuple[float, int]] = []  # (deadline, backend index); stale entries skipped
        self._model = world.model()
        self.events = 0

    def run(self, plan: Iterable[Planned], *, start: float = 0.0) -> float:
        """Serve the whole schedule and every answer; returns the virtual end time.

        The clock starts at ``start`` (a shard's window), the first scrape with it.
        """
        world, backends, due = self.world, self.world.backends, self._due
        health = world.config.health
        every = health.scrape_interval if health.scrape_metrics else math.inf
        next_scrape = start if health.scrape_metrics else math.inf
        world.now = start
        arrivals = iter(plan)
        nxt = next(arrivals, None)
        while nxt is not None or self.flights:
            while due and due[0][0] != backends[due[0][1]].deadline:
                heapq.heappop(due)
            t_engine = due[0][0] if due else math.inf
            t_arrival = nxt.at if nxt is not None else math.inf
            now = min(t_engine, t_arrival, next_scrape)
            world.now = now
            self.events += 1
            if t_engine <= now:
                self._step(heapq.heappop(due)[1], now)
            elif next_scrape <= now:
                for b in backends:
                    b.scrape()
                next_scrape += every
            elif nxt is not None:
                self._arrive(nxt, now)
                nxt = next(arrivals, None)
        return world.now

    def _schedule(self, index: int) -> None:
        t = self.world.backends[index].refresh()
        if t is not None:
            heapq.heappush(self._due, (t, index))

    def _step(self, index: int, now: float) -> None:
        b = self.world.backends[index]
        for seq in b.engine.advance(now * b.scale):
            f = self.flights[seq]
            if f.first is None:
                f.first = now
                f.lease.prefilled()
            elif f.routed.info.stream:
                f.itls.append(now - f.last)
                f.itls.extend([0.0] * (len(seq.chunks) - 1))
            f.last = now
            seq.chunks.clear()
            if seq.done:
                del self.flights[seq]
                self._answer(f, seq, now)
        self._schedule(index)

    def _arrive(self, planned: Planned, now: float) -> None:
        item, world, policy = planned.item, self.world, self.policy
        routed: Routed | None = None
        try:
            routed = understand(item, self._model, world.config.classification)
            info = routed.info
            if not world.pool.known_model(info.model):
                raise Refused(404, f"model '{info.model}' does not exist")
            candidates = world.pool.candidates(info.model)
            if not candidates:
                raise Refused(503, "no healthy backend serves this model")
            decision = policy.choose(info, candidates)
            backend, served = world.choose(policy, info.model, decision)
            priority = decision.priority if backend.state.spec.priority_capable else None
            seq, finish = engine_sequence(
                routed,
                backend.profile,
                served,
                backend.seed,
                backend.engine.capacity_tokens(),
                priority,
            )
        except Refused as e:
            self._refused(item, routed, e, now)
            return
        lease = backend.state.lease(info)
        self.flights[seq] = Flight(routed, backend, lease, now, finish)
        backend.engine.submit(seq, now * backend.scale)
        self._schedule(backend.index)

    def _refused(self, item: Item, routed: Routed | None, e: Refused, now: float) -> None:
        cls = routed.info.request_class if routed is not None else "default"
        error = {"message": str(e), "code": e.status}
        r = Result(item.record.custom_id, cls, e.status, False, None, None, self.label, error=error)
        if routed is not None:  # the router feeds back refusals too (see Exchange.finish)
            self.policy.on_finish(routed.info, "none", Outcome(e.status, False))
        self.on_result(item, r, now)

    def _answer(self, f: Flight, seq: Sequence, now: float) -> None:
        info = f.routed.info
        f.lease.ok()
        f.lease.release()
        first = f.first if f.first is not None else now
        e2e = now - f.sent
        ttft = first - f.sent if info.stream else e2e
        n = seq.generated
        tpot = (e2e - ttft) / (n - 1) if info.stream and n > 1 else None
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
            itls=f.itls,
            prompt_tokens=seq.prompt_tokens,
            completion_tokens=n,
            finish_reason=f.finish,
        )
        self.on_result(f.routed.item, r, f.sent)
