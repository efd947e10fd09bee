"""The engine model: a pure, step-by-step continuous-batching scheduler.

Nothing here reads a clock or sleeps. The caller submits sequences at a time ``now``, asks for
:meth:`Engine.next_deadline` and calls :meth:`Engine.advance` with the current time; every
step whose end is due is completed and the next step starts exactly at the previous one's end,
so time never drifts. Unit tests drive it in virtual time; the HTTP server drives it in real
time (scaled). Times are model seconds.

A submitted sequence first spends the profile's front-end delay (API server work), then joins
a data-parallel rank chosen by the profile's rule (balanced by pending prefill work, random or
by hash). Each rank (:mod:`emulator.rank`) has its own KV cache in 16-token blocks (with
automatic prefix caching, :mod:`emulator.kvcache`), running set, waiting queue and step
clocks. Disaggregated serving (a prefill engine holding finished prompts' blocks, a decode
engine pulling them first) is :mod:`emulator.kvtransfer`'s; here are only its two events:
a hold expiring, a pulled sequence arriving.
"""

from __future__ import annotations

import heapq
import math
import random

from emulator.cold import ColdStart
from emulator.dp import DPFrontEnd
from emulator.faults import draw_stragglers
from emulator.kvtransfer import Holds, Link, Pull
from emulator.profiles import Profile
from emulator.rank import Rank, Sequence, State

__all__ = ["Engine", "Sequence", "State"]


class Engine:
    """A whole engine: one or more ranks and the rule that assigns requests to them."""

    def __init__(self, profile: Profile, seed: int = 0) -> None:
        self.profile = profile
        self._rng = random.Random(seed)
        self._fault_rng = random.Random(seed + 1)  # stragglers, apart from rank assignment
        self._cold = (
            ColdStart(profile.cold_prefills, profile.cold_concurrency)
            if profile.cold_prefills
            else None
        )
        self.ranks = [Rank(profile, self._cold) for _ in range(profile.ranks)]
        self._keys = 0
        self.holds = Holds(profile.kv_hold_timeout_s)
        self.link = Link(profile)
        self._incoming: list[tuple[float, int, Sequence]] = []  # heap: in the front end
        # Heap of (deadline, rank index). An entry is current while the rank's deadline still
        # equals it; entries a rank moved away from are dropped when they surface. So the next
        # event costs a heap operation, not a scan of every rank (the virtual-time simulator
        # takes millions of them).
        self._due: list[tuple[float, int]] = []
        self._dp = (
            DPFrontEnd(profile.ranks, profile.api_servers, profile.dp_stats_interval_ms, seed)
            if profile.rank_assignment == "vllm-dp"
            else None
        )

    def capacity_tokens(self) -> int:
        """The most tokens (prompt plus output) one request may hold in one rank's KV cache."""
        return self.profile.kv_blocks_per_rank * self.profile.kv_block_size - 1

    def submit(self, seq: Sequence, now: float, spent: float = 0.0) -> Pull | None:
        """Accept ``seq`` at ``now``; it reaches a rank after the front-end delay, of which
        ``spent`` (model seconds) already went by before it was submitted: the HTTP server's
        own reading and parsing of the request, which is the front end's work too. A
        sequence with ``remote_tokens`` then waits for their pull, which is returned.

        Call :meth:`advance` up to ``now`` first, so a step that began earlier cannot take it.
        """
        self._keys += 1
        seq.key = self._keys
        p = self.profile
        if seq.stall is None or seq.slow_factor is None:
            draw_stragglers(seq, p.faults, self._fault_rng)
        # Tokenizing grows with the prompt; how long it takes varies with the server's load.
        per_token = p.frontend_per_token_us * 2.0 * seq.rng.random()
        delay = p.frontend_ms / 1e3 + seq.prompt_tokens * per_token / 1e6 - spent
        pull = None
        if seq.remote_tokens:
            pull = self.link.pull(seq.remote_tokens, now + max(delay, 0.0))
            delay = pull.end - now
        if delay > 0:
            heapq.heappush(self._incoming, (now + delay, seq.key, seq))
        else:
            self._dispatch(seq, now)
        return pull

    def hand_over(self, transfer_id: str, now: float) -> int | None:
        """A decode engine pulls the blocks held under ``transfer_id`` at ``now``: they are
        freed here; returns the prompt tokens they hold (None: expired or never held).

        Call :meth:`advance` up to ``now`` first (a hold due to expire by then is gone).
        """
        taken = self.holds.take(transfer_id, now)
        if taken is None:
            return None
        seq, expired = taken
        self._free_held(seq, now)
        return None if expired else seq.prompt_tokens

    def _free_held(self, seq: Sequence, now: float) -> None:
        rank = self.ranks[seq.rank]
        rank.drop_held(seq)
        rank.kick(now)  # the blocks may let a waiting sequence in
        self._track(seq.rank)

    def _dispatch(self, seq: Sequence, now: float) -> None:
        """Queue ``seq`` on a rank chosen by the profile's rule."""
        how = self.profile.rank_assignment
        if len(self.ranks) == 1:
            rank = 0
        elif how == "random":
            rank = self._rng.randrange(len(self.ranks))
        elif how == "hash":
            rank = seq.rng.getrandbits(32) % len(self.ranks)
        elif self._dp is not None:
            rank = self._dp.pick(now)
        else:
            loads = [r.load() for r in self.ranks]
            rank = loads.index(min(loads))
        seq.rank = rank
        target = self.ranks[rank]
        idle = target.deadline() is None
        target.enqueue(seq)
        target.kick(now)
        self._track(rank)
        if self._dp is not None and idle:  # a busy rank takes it in when its step ends
            self._dp.published(rank, target.published, now)

    def _track(self, rank: int) -> None:
        """Note rank ``rank``'s current deadline in the heap (after anything that moved it)."""
        t = self.ranks[rank].deadline()
        if t is not None:
            heapq.heappush(self._due, (t, rank))

    def _next_rank(self) -> tuple[float, int] | None:
        """The earliest current (deadline, rank), dropping entries that are out of date."""
        due, ranks = self._due, self.ranks
        while due:
            t, i = due[0]
            if ranks[i].deadline() == t:
                return t, i
            heapq.heappop(due)
        return None

    def cancel(self, seq: Sequence, now: float) -> None:
        """Remove ``seq`` (client gone) at ``now``: frees its slot and KV blocks at once."""
        if seq.rank < 0:  # still in the front end
            seq.state = State.CANCELLED
        elif not seq.done:
            rank = self.ranks[seq.rank]
            rank.cancel(seq)
            rank.kick(now)  # its prefill lane may have just become free
            self._track(seq.rank)
            self._warm_up(now)

    def _warm_up(self, now: float) -> None:
        """When a cold engine's prefill place came free, let every rank take it up."""
        cold = self._cold
        if cold is not None and cold.freed:
            cold.freed = False
            for i, rank in enumerate(self.ranks):
                rank.kick(now)
                self._track(i)

    def next_deadline(self) -> float | None:
        """Model time of the next step or prefill completion, None when idle."""
        head = self._next_rank()
        t = head[0] if head is not None else math.inf
        if self._incoming:
            t = min(t, self._incoming[0][0])
        expiry = self.holds.next_expiry()
        if expiry is not None:
            t = min(t, expiry)
        return None if t == math.inf else t

    def advance(self, now: float) -> list[Sequence]:
        """Complete every event due by ``now``; return sequences that got new chunks."""
        out: list[Sequence] = []
        incoming = self._incoming
        while True:
            head = self._next_rank()
            best_t = head[0] if head is not None else math.inf
            arrival = incoming[0][0] if incoming else math.inf
            expiry = self.holds.next_expiry()
            due = min(best_t, arrival)
            if expiry is not None and expiry <= now and expiry <= due:
                for seq in self.holds.expire(expiry):
                    self._free_held(seq, expiry)
                continue
            if due > now or due == math.inf:  # nothing due (or nothing at all: idle)
                self._hold(out)
                return out
            if arrival <= best_t:  # on a tie the arrival is queued before the next step starts
                _, _, seq = heapq.heappop(incoming)
                if seq.state is State.WAITING:
                    self._dispatch(seq, arrival)
            elif head is not None:
                heapq.heappop(self._due)
                rank = self.ranks[head[1]]
                rank.fire(out)
                self._track(head[1])
                self._warm_up(best_t)
                if self._dp is not None:
                    self._dp.published(head[1], rank.published, best_t)

    def _hold(self, out: list[Sequence]) -> None:
        """Hold the blocks of the prefills for a decode engine that finished (see
        :mod:`emulator.kvtransfer`)."""
        for seq in out:
            if seq.hold_kv and seq.finished_at is not None and not seq.transfer_id:
                self.holds.hold(seq, seq.finished_at)

    @property
    def num_running(self) -> int:
        """Sequences holding a running slot (prefilling or decoding)."""
        return sum(len(r.running) for r in self.ranks)

    @property
    def num_waiting(self) -> int:
        """Sequences queued for admission (including preempted ones)."""
        return sum(r.n_waiting for r in self.ranks)

    @property
    def num_preemptions(self) -> int:
        """Preemptions since start."""
        return sum(r.preemptions for r in self.ranks)

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache since start (once per request)."""
        return sum(r.pool.queries for r in self.ranks)

    @property
    def prefix_cache_hits(self) -> int:
        """Of :attr:`prefix_cache_queries`, the tokens found cached."""
        return sum(r.pool.hits for r in self.ranks)

    def kv_usage(self) -> float:
        """Share of KV cache blocks in use, 0 to 1."""
        total = self.profile.kv_blocks_per_rank * len(self.ranks)
        free = sum(r.free for r in self.ranks)
        return (total - free) / total if total else 0.0
