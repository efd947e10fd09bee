"""Disaggregated prefill and decode in the engine model, after vLLM's NIXL connector.

Prefill side (:class:`Holds`): a sequence submitted with ``hold_kv`` (a request whose
``kv_transfer_params`` say ``do_remote_decode``) computes its prompt and its one token as any
other, but when it finishes its KV blocks stay allocated under a transfer id until a decode
engine pulls them (:meth:`Holds.take`) or ``kv_hold_timeout_s`` passes (vLLM's
``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``, 480 s by default), when they are freed and counted as
expired. The blocks stay in the prefix cache afterwards, as any freed block does.

Decode side (:class:`Link`): a sequence submitted with ``remote_tokens`` (a request whose
params say ``do_remote_prefill`` and whose blocks were still held) first waits for its pull:
``remote_tokens x kv_bytes_per_token`` bytes over the engine's one inbound link of
``kv_link_gb_per_s`` gigabytes a second, one transfer at a time in arrival order (a busy link
queues the next pull). Then it joins a rank with those tokens already computed, so its
prefill is the last prompt token alone, and it decodes. A pull that finds nothing (expired,
or never held) is counted as a failed transfer and the sequence prefills locally, as vLLM's
decode engine recomputes what it could not load.

The defaults' sources are in docs/emulator.md (Disaggregated prefill and decode). Times here
are model seconds, as everywhere in the engine model.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from emulator.profiles import Profile
from emulator.rank import Sequence


@dataclass(frozen=True, slots=True)
class Pull:
    """One transfer on the decode side: when it began and ended (model seconds), its size."""

    queued: float
    start: float
    end: float
    bytes: int
    blocks: int


class Holds:
    """The prefill side: finished sequences whose KV blocks wait for a decode engine."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._held: dict[str, tuple[Sequence, float]] = {}  # id -> (sequence, expiry)
        self._expiry: list[tuple[float, str]] = []  # heap; an entry is stale once taken
        self._ids = itertools.count(1)
        self.expired = 0
        """Holds freed by the timeout (vLLM's ``nixl_num_kv_expired_reqs``)."""

    def hold(self, seq: Sequence, now: float) -> str:
        """Keep ``seq``'s blocks (it just finished) under a new transfer id."""
        tid = f"{next(self._ids)}"
        seq.transfer_id = tid
        self._held[tid] = (seq, now + self.timeout)
        heapq.heappush(self._expiry, (now + self.timeout, tid))
        return tid

    def next_expiry(self) -> float | None:
        """When the earliest live hold expires (None: nothing is held)."""
        heap, held = self._expiry, self._held
        while heap and heap[0][1] not in held:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def expire(self, now: float) -> list[Sequence]:
        """Drop every hold due by ``now``; the caller frees their blocks."""
        out: list[Sequence] = []
        while (t := self.next_expiry()) is not None and t <= now:
            _, tid = heapq.heappop(self._expiry)
            out.append(self._held.pop(tid)[0])
        self.expired += len(out)
        return out

    def take(self, tid: str, now: float) -> tuple[Sequence, bool] | None:
        """The held sequence ``tid`` names, no longer held, and whether its hold had run out
        by ``now`` (then counted as expired); None: unknown (or expired and freed before)."""
        held = self._held.pop(tid, None)
        if held is None:
            return None
        expired = held[1] <= now
        self.expired += expired
        return held[0], expired

    def __len__(self) -> int:
        return len(self._held)


class Link:
    """The decode side: one inbound link, transfers one at a time in arrival order."""

    def __init__(self, profile: Profile) -> None:
        self.bytes_per_token = profile.kv_bytes_per_token
        self.block_size = profile.kv_block_size
        self.rate = profile.kv_link_gb_per_s * 1e9  # bytes per model second
        self._free_at = 0.0
        self.failed = 0
        """Pulls that found no blocks (vLLM's ``nixl_num_failed_transfers``)."""
        self.pulls = 0

    def pull(self, tokens: int, now: float) -> Pull:
        """Schedule the transfer of ``tokens`` tokens' KV that is asked for at ``now``."""
        size = tokens * self.bytes_per_token
        start = max(now, self._free_at)
        self._free_at = end = start + size / self.rate
        self.pulls += 1
        return Pull(now, start, end, size, -(-tokens // self.block_size))
