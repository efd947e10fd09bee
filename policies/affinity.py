"""Prefix/session affinity: rendezvous hashing with a load bound, within one engine pool.

Each replica's weight for a key is a stable hash of (key, replica name); the key's home is
the heaviest replica, so adding or removing a replica moves only the keys it wins or held.
A replica whose in-flight count would exceed ``load_bound`` times the pool's mean (counting
the new request) is passed over for the next heaviest, so a hot key or session cannot turn
one replica into a hot spot (consistent hashing with bounded loads).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from policies.types import Candidate, RequestInfo


def affinity_key(req: RequestInfo) -> bytes | None:
    """The session key if the client sent one, else the prompt-prefix hash, else None."""
    if req.session_key is not None:
        return b"s:" + req.session_key.encode()
    if req.prefix_hash is not None:
        return b"p:" + str(req.prefix_hash).encode()
    return None


def _weight(key: bytes, name: str) -> int:
    # A keyed, process-independent hash: Python's hash() is salted per process, and every
    # router worker must send a key to the same replica.
    digest = hashlib.blake2b(key, digest_size=8, key=name.encode()[:64]).digest()
    return int.from_bytes(digest, "big")


def home(key: bytes, pool: Sequence[Candidate], load_bound: float) -> str | None:
    """The replica of ``pool`` that serves ``key``: heaviest weight within the load bound.

    ``load_bound`` must be >= 1; then the least-loaded replica always fits under the cap
    (ceil((total + 1) / n) = floor(total / n) + 1), so some replica is always chosen.
    """
    if not pool:
        return None
    cap = math.ceil(load_bound * (sum(c.inflight for c in pool) + 1) / len(pool))
    ordered = sorted(pool, key=lambda c: _weight(key, c.name), reverse=True)
    return next(c.name for c in ordered if c.inflight + 1 <= cap)
