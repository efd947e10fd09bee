"""One data-parallel rank of the engine model: its queue, KV cache and step clocks.

A rank admits waiting sequences in queue order (FCFS, or by ``priority`` then arrival) without
skipping, while a running slot and KV blocks for the prompt are free. When a decode step needs
a KV block and none is free, it preempts the latest admission (of the lowest priority under
priority scheduling): its blocks are freed and it waits again, to be prefilled again with its
prompt and the tokens it already generated (vLLM's recompute preemption). ``mixed`` and
``overlap`` scheduling are described on :class:`~emulator.profiles.Profile`.

KV blocks live in a :class:`~emulator.kvcache.BlockPool` with automatic prefix caching: a
sequence that carries its token ids is admitted with its longest cached prefix already
computed (at least its last prompt token is always computed, to have logits, as in vLLM), and
registers each full block it computes for later sequences.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from enum import Enum

from emulator.cold import ColdStart
from emulator.kvcache import BlockPool, block_hashes
from emulator.profiles import Profile


class State(Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"


@dataclass(eq=False, slots=True)
class Sequence:
    """One request inside the engine.

    ``output_tokens`` is the length it will generate; ``rng`` draws its tokens-per-chunk (seed
    it from the request so the same request is chunked the same way under any load).
    ``chunks`` collects the size of every chunk emitted and not yet taken by the caller.
    ``tokens`` are the ids of the prompt followed by the output to come; with them its full
    blocks are looked up in and added to the prefix cache (empty: nothing is cached).
    ``cached_tokens`` is how much of the prompt the cache held when it was first admitted.
    ``hold_kv``: when it finishes its KV blocks stay allocated for a decode engine to pull
    (:mod:`emulator.kvtransfer`), under ``transfer_id``; ``remote_tokens``: that many of its
    prompt tokens were computed elsewhere and pulled, so they need no prefill here.
    """

    prompt_tokens: int
    output_tokens: int
    priority: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    key: int = 0
    state: State = State.WAITING
    rank: int = -1
    generated: int = 0
    prefilled: int = 0
    prefill_target: int = 0
    blocks: int = 0
    step_tokens: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    chunks: list[int] = field(default_factory=list)
    tokens: tuple[int, ...] = ()
    cached_tokens: int = 0
    hashes: list[int] = field(default_factory=list)  # block hash chain, computed lazily
    held: list[int] = field(default_factory=list)  # cached blocks it holds (hashes)
    hashed: int = 0  # leading blocks already looked up or offered to the cache
    cold: bool = False  # prefilled under a cold engine's limit (emulator.cold)
    hold_kv: bool = False
    remote_tokens: int = 0
    transfer_id: str = ""
    # Stragglers (emulator.faults; None: the engine draws them from its profile at submit).
    stall: float | None = None  # first-token stall still to serve, model seconds
    stall_end: float | None = None  # admitted and stalled: no prefill before this time
    slow_factor: int | None = None  # after the first token, one token every this many steps
    slow_tokens: int = 0  # tokens still to decode slowly
    slow_phase: int = 0  # steps since its last slow token

    @property
    def done(self) -> bool:
        """Whether the sequence has left the engine (finished or cancelled)."""
        return self.state in (State.FINISHED, State.CANCELLED)

    @property
    def waiting(self) -> bool:
        """Whether the sequence waits on a rank to be admitted."""
        return self.state is State.WAITING


class Rank:
    """One data-parallel rank: KV cache, queue, running set and its step clock(s)."""

    def __init__(self, profile: Profile, cold: ColdStart | None = None) -> None:
        self.p = profile
        self.cold = cold
        self.overlap = profile.scheduling == "overlap"
        self.by_priority = profile.scheduling_policy == "priority"
        self.pool = BlockPool(profile.kv_blocks_per_rank, profile.kv_block_size)
        self.waiting: list[tuple[int, int, Sequence]] = []  # heap of (priority, key, seq)
        self.n_waiting = 0
        self.running: list[Sequence] = []  # admission order
        self.step_end: float | None = None
        self.step_decode: list[Sequence] = []
        self.step_prefill: list[tuple[Sequence, int]] = []
        self.lane_end: float | None = None  # overlap: the prefill lane's current job
        self.lane_job: Sequence | None = None
        self.wakes: list[float] = []  # heap: when stalled sequences may begin their prefill
        self.preemptions = 0
        # (waiting, running) as last published, before and after each step: what vLLM's DP
        # front end balances on. Requests that arrive during a step are not in it until the
        # step ends (they wait in the rank's input queue).
        self.published = (0, 0)

    @property
    def free(self) -> int:
        """KV blocks no running sequence holds."""
        return self.pool.free

    # queue ---------------------------------------------------------------------------
    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.p.kv_block_size)

    def enqueue(self, seq: Sequence) -> None:
        seq.state = State.WAITING
        seq.prefill_target = seq.prompt_tokens + seq.generated
        seq.prefilled = 0
        prio = seq.priority if self.by_priority else 0
        heapq.heappush(self.waiting, (prio, seq.key, seq))
        self.n_waiting += 1
        if self.cold is not None:
            self.cold.queued(seq, (prio, seq.key))

    def _head(self, now: float) -> Sequence | None:
        while self.waiting and self.waiting[0][2].state is not State.WAITING:
            heapq.heappop(self.waiting)  # cancelled while waiting
        return self.waiting[0][2] if self.waiting else None

    def _admit(self, now: float) -> Sequence | None:
        """Pop the queue's head if a running slot and its KV blocks are free (and a cold
        engine lets another prefill begin)."""
        head = self._head(now)
        if head is None or len(self.running) >= self.p.max_num_seqs:
            return None
        cold = self.cold
        if cold is not None and not cold.admits(head):
            return None
        size = self.p.kv_block_size
        target = head.prefill_target
        limit = (target - 1) // size  # the last prompt token is always computed
        block_hashes(head.tokens, size, head.hashes, limit)
        hits, evictable = self.pool.lookup(head.hashes, limit)
        need = self.blocks_for(target + 1) - hits
        if need > self.free - evictable:
            return None
        heapq.heappop(self.waiting)
        self.n_waiting -= 1
        held = head.hashes[:hits]
        self.pool.touch(held)
        self.pool.allocate(need)
        head.blocks, head.held, head.hashed = need, held, hits
        head.prefilled = hits * size
        if not head.preemptions:  # vLLM counts a request once, not its recomputations
            head.cached_tokens = head.prefilled
            self.pool.queries += head.prompt_tokens
            self.pool.hits += head.prefilled
        # pulled from a prefill engine: computed, but not a hit of this engine's cache
        head.prefilled = max(head.prefilled, min(head.remote_tokens, target - 1))
        head.state = State.RUNNING
        self.running.append(head)
        if cold is not None:
            cold.began(head)
        if head.stall:  # it holds its slot and blocks from now, its prefill waits
            head.stall_end = now + head.stall
            head.stall = 0.0  # once: a preempted sequence is not stalled again
            heapq.heappush(self.wakes, head.stall_end)
        return head

    def _cache(self, seq: Sequence, computed: int) -> None:
        """Offer ``seq``'s full blocks among its first ``computed`` tokens to the cache."""
        size = self.p.kv_block_size
        full = computed // size
        if full <= seq.hashed or not seq.tokens:
            return
        block_hashes(seq.tokens, size, seq.hashes, full)
        end = min(full, len(seq.hashes))
        for h in seq.hashes[seq.hashed : end]:
            if seq.blocks and self.pool.register(h):
                seq.blocks -= 1
                seq.held.append(h)
        seq.hashed = end

    def _release(self, seq: Sequence, keep: bool = False) -> None:
        """``seq`` leaves the running set; its blocks are freed unless ``keep`` (a finished
        prefill whose blocks a decode engine will pull: :meth:`drop_held` frees them)."""
        self._prefilled(seq)
        if seq.blocks or seq.held:
            decoding = seq.prefilled >= seq.prefill_target
            # A decoding sequence has computed the KV of all its tokens but the last sampled.
            self._cache(seq, seq.prompt_tokens + seq.generated - 1 if decoding else seq.prefilled)
        if not keep:
            self.drop_held(seq)
        if seq in self.running:
            self.running.remove(seq)

    def drop_held(self, seq: Sequence) -> None:
        """Free the blocks ``seq`` still holds."""
        self.pool.release(seq.blocks, seq.held)
        seq.blocks, seq.held, seq.hashed = 0, [], 0

    def _prefilled(self, seq: Sequence) -> None:
        """``seq`` no longer holds a cold engine's prefill place, if it held one."""
        if seq.cold and self.cold is not None:
            self.cold.ended(seq)

    def _preempt(self, seq: Sequence) -> None:
        self._release(seq)
        seq.remote_tokens = 0  # what it pulled is gone with its blocks: recomputed here
        seq.preemptions += 1
        self.preemptions += 1
        self.enqueue(seq)

    def _victim(self) -> Sequence:
        """Who is preempted first: the latest admission (of the lowest priority, if used)."""
        if self.by_priority:
            return max(reversed(self.running), key=lambda s: s.priority)
        return self.running[-1]

    def _grow(self, seq: Sequence, tokens: int) -> bool:
        """Reserve KV for ``tokens`` more tokens, preempting others if needed.

        Returns False if ``seq`` itself had to be preempted.
        """
        have = seq.blocks + len(seq.held)
        need = self.blocks_for(seq.prompt_tokens + seq.generated + tokens) - have
        while need > self.free:
            victim = self._victim()
            self._preempt(victim)
            if victim is seq:
                return False
        if need > 0:
            self.pool.allocate(need)
            seq.blocks += need
        return True

    def load(self) -> tuple[int, int]:
        """Balancing key: prompt tokens still to prefill, then sequences held."""
        pending = sum(s.prefill_target - s.prefilled for s in self.running)
        pending += sum(s.prefill_target for _, _, s in self.waiting if s.state is State.WAITING)
        return pending, len(self.running) + self.n_waiting

    def cancel(self, seq: Sequence) -> None:
        if seq.state is State.WAITING:
            self.n_waiting -= 1
            if self.cold is not None:
                self.cold.left_line()
        seq.state = State.CANCELLED
        self._release(seq)
        if self.lane_job is seq:
            self.lane_job = None
            self.lane_end = None

    # clocks ----------------------------------------------------------------------------
    def deadline(self) -> float | None:
        t = self.step_end if self.lane_end is None else self.lane_end
        if self.step_end is not None and self.lane_end is not None:
            t = min(self.lane_end, self.step_end)
        if self.wakes and (t is None or self.wakes[0] < t):
            return self.wakes[0]
        return t

    def kick(self, now: float) -> None:
        """Start whatever can start at ``now`` on an idle lane or step loop."""
        if self.overlap and self.lane_end is None:
            self._start_lane(now)
        if self.step_end is None:
            if self.overlap:
                self._start_decode(now)
            else:
                self._start_mixed(now)

    def fire(self, out: list[Sequence]) -> None:
        """Complete the earliest due event (prefill lane first on a tie) and restart."""
        wakes, lane = self.wakes, self.lane_end
        if wakes and wakes[0] == self.deadline():  # a stall ended: an idle rank starts
            now = heapq.heappop(wakes)
        elif lane is not None and (self.step_end is None or lane <= self.step_end):
            now = lane
            self._end_lane(now, out)
        else:
            assert self.step_end is not None
            now = self.step_end
            self._end_step(now, out)
        self.kick(now)

    def _emit(self, seq: Sequence, n: int, now: float, out: list[Sequence]) -> None:
        n = min(n, seq.output_tokens - seq.generated)
        seq.generated += n
        if not seq.chunks:
            out.append(seq)
        seq.chunks.append(n)
        if seq.first_token_at is None:
            seq.first_token_at = now
        if seq.generated >= seq.output_tokens:
            seq.state = State.FINISHED
            seq.finished_at = now
            self._release(seq, keep=seq.hold_kv)

    # mixed scheduling (vLLM V1) ------------------------------------------------------------
    def _start_mixed(self, now: float) -> None:
        self.published = (self.n_waiting, len(self.running))
        decode: list[Sequence] = []
        for seq in list(self.running):
            decoding = seq.state is State.RUNNING and seq.prefilled >= seq.prefill_target
            if decoding and self._grow(seq, 1):
                decode.append(seq)
        decode = [s for s in decode if s.state is State.RUNNING]  # some became victims
        budget = self.p.max_num_batched_tokens - len(decode)
        prefill: list[tuple[Sequence, int]] = []
        for seq in self.running:
            if budget <= 0:
                break
            left = seq.prefill_target - seq.prefilled
            if left > 0 and (seq.stall_end is None or seq.stall_end <= now):
                chunk = min(left, budget)
                prefill.append((seq, chunk))
                budget -= chunk
        while budget > 0:
            new = self._admit(now)
            if new is None:
                break
            if new.stall_end is not None and new.stall_end > now:
                continue
            chunk = min(new.prefill_target - new.prefilled, budget)
            prefill.append((new, chunk))
            budget -= chunk
        if not decode and not prefill:
            return
        tokens = sum(c for _, c in prefill)
        self.step_decode, self.step_prefill = decode, prefill
        self.step_end = now + (
            self.p.step_base_ms / 1e3
            + self.p.step_per_prefill_token_us / 1e6 * tokens
            + self.p.step_per_decode_seq_ms / 1e3 * len(decode)
        )

    def _end_step(self, now: float, out: list[Sequence]) -> None:
        self.step_end = None
        for seq in self.step_decode:
            if seq.state is State.RUNNING:
                if seq.slow_tokens:  # a slow-decode straggler emits every slow_factor steps
                    seq.slow_phase += 1
                    if seq.slow_phase < (seq.slow_factor or 1):
                        continue
                    seq.slow_phase = 0
                    seq.slow_tokens -= 1
                self._emit(seq, seq.step_tokens or 1, now, out)
        for seq, chunk in self.step_prefill:
            if seq.state is State.RUNNING:
                seq.prefilled += chunk
                self._cache(seq, seq.prefilled)
                if seq.prefilled >= seq.prefill_target:
                    self._prefilled(seq)
                    self._emit(seq, 1, now, out)
        self.step_decode, self.step_prefill = [], []
        self.published = (self.n_waiting, len(self.running))

    # overlap scheduling (separate prefill lane) ------------------------------------------------
    def _start_lane(self, now: float) -> None:
        seq = self._admit(now)
        if seq is None:
            return
        self.lane_job = seq
        left = seq.prefill_target - seq.prefilled  # cached blocks skip the compute
        if seq.stall_end is not None and seq.stall_end > now:
            now = seq.stall_end  # a stalled prefill holds the lane (one serial lane per rank)
        self.lane_end = now + (
            self.p.prefill_base_ms / 1e3 + self.p.prefill_per_token_us / 1e6 * left
        )

    def _end_lane(self, now: float, out: list[Sequence]) -> None:
        seq = self.lane_job
        self.lane_job = self.lane_end = None
        if seq is not None and seq.state is State.RUNNING:
            self._prefilled(seq)
            seq.prefilled = seq.prefill_target
            self._cache(seq, seq.prefilled)
            self._emit(seq, 1, now, out)

    def _start_decode(self, now: float) -> None:
        decode: list[Sequence] = []
        per = self.p.tokens_per_chunk
        whole = int(per)
        frac = per - whole
        for seq in list(self.running):
            if seq.state is State.RUNNING and seq.prefilled >= seq.prefill_target:
                k = whole + (1 if frac and seq.rng.random() < frac else 0)
                seq.step_tokens = min(k, seq.output_tokens - seq.generated)
                if self._grow(seq, seq.step_tokens):
                    decode.append(seq)
        decode = [s for s in decode if s.state is State.RUNNING]  # some became victims
        if self.lane_job is not None and self.lane_job.state is not State.RUNNING:
            self.lane_job = self.lane_end = None  # preempted while prefilling
        if not decode:
            return
        self.step_decode = decode
        self.step_end = now + (
            self.p.step_base_ms / 1e3 + self.p.step_per_decode_seq_ms / 1e3 * len(decode)
        )
