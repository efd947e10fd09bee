"""Deterministic output text and embeddings.

Output is drawn token by token from a fixed vocabulary of plain words and two punctuation
marks. A word is rendered with a leading space (except at the very start) and punctuation
without one, so counting the concatenated text with :func:`turnout.common.tokens.count_text` gives
back exactly the number of tokens drawn.
"""

from __future__ import annotations

import hashlib
import math
import random

_VOCABULARY = (
    "the of and to in is that for it as with was on be by this are from at or an which have "
    "not they more one can all has their been its also new other into two time when some "
    "these may only first would over such after most then used data model engine token "
    "request batch queue cache latency stream router policy prefill decode throughput tail "
    "load rank block"
)
WORDS = tuple(_VOCABULARY.split())
"""The words output is drawn from."""
PUNCTUATION = (",", ".")
"""The punctuation marks output is drawn from."""


def request_rng(seed: int, *parts: bytes) -> random.Random:
    """A generator seeded from the server seed and the request's identifying bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(seed.to_bytes(8, "little", signed=True))
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return random.Random(int.from_bytes(h.digest(), "little"))


def output_pieces(rng: random.Random, n: int) -> list[str]:
    """``n`` token strings whose concatenation counts as ``n`` tokens."""
    pieces: list[str] = []
    prev_punct = True
    for i in range(n):
        if not prev_punct and i > 0 and rng.random() < 0.12:
            piece = PUNCTUATION[rng.random() < 0.6]
            prev_punct = True
        else:
            word = WORDS[rng.randrange(len(WORDS))]
            piece = word if i == 0 else " " + word
            prev_punct = False
        pieces.append(piece)
    return pieces


def natural_length(rng: random.Random, mean: int) -> int:
    """A plausible stop length (geometric-like around ``mean``) for requests not forced."""
    return max(1, int(-mean * math.log(1.0 - rng.random())))


def embedding(seed: int, text: bytes, dim: int) -> list[float]:
    """A unit vector that depends only on ``seed``, ``text`` and ``dim``."""
    rng = request_rng(seed, b"embedding", text)
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]
