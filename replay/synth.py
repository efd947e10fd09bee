"""Prompt synthesis: chat prompts of an exact token length, with shared prefixes on request.

Synthetic text is made of short lower-case words, each one token under the documented rule
(:mod:`turnout.common.tokens`). A target with its own tokenizer may count differently, so a
:class:`Calibration` (fitted once per run from two ``/tokenize`` probes, or taken from the
rule when the target has no ``/tokenize``) turns a token length into a word count.

Mooncake's ``hash_ids`` name 512-token blocks: block text is a pure function of its id, so
requests that share leading ids share a prompt prefix byte for byte, and a prefix cache sees
the recorded sharing. Prompts without ids get blocks seeded by their request id instead.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from replay.sources import BLOCK_TOKENS, CHAT_URL, RESPONSES_URL, Synth
from turnout.common.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD

_VOCAB = (
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "was",
    "for",
    "on",
    "that",
    "with",
    "as",
    "by",
    "at",
    "from",
    "his",
    "her",
    "they",
    "this",
    "which",
    "are",
    "were",
    "be",
    "an",
    "has",
    "had",
    "it",
    "not",
    "or",
    "but",
    "all",
    "one",
    "two",
    "new",
    "more",
    "time",
    "year",
    "day",
    "people",
    "way",
    "state",
    "part",
    "work",
    "life",
    "world",
    "school",
    "system",
    "group",
    "number",
    "place",
    "point",
    "city",
    "case",
    "week",
    "company",
    "water",
    "home",
    "room",
    "fact",
    "night",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "eye",
    "name",
    "side",
    "head",
    "house",
    "service",
    "friend",
    "power",
    "hour",
    "field",
    "river",
    "road",
    "table",
    "idea",
    "story",
    "door",
    "paper",
    "music",
    "market",
)
WORD_CHARS = sum(len(w) + 1 for w in _VOCAB) / len(_VOCAB)
"""Characters per synthesized word, its space included, on average."""
_CACHE_BLOCKS = 4096

Counter = Callable[[list[dict[str, Any]]], Awaitable[int]]
"""Counts the prompt tokens of chat ``messages`` under the target's tokenizer."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """``tokens = overhead + per_word * words`` for a one-message synthetic chat prompt."""

    overhead: float = MESSAGE_OVERHEAD + REPLY_OVERHEAD
    per_word: float = 1.0

    def words_for(self, tokens: int) -> int:
        """How many words make a prompt of ``tokens`` tokens (at least one)."""
        return max(1, round((tokens - self.overhead) / self.per_word))


async def calibrate(count: Counter) -> Calibration:
    """Fit the target's count of synthetic prompts from two probes (0 and one block)."""
    n = BLOCK_TOKENS
    c0 = await count([{"role": "user", "content": ""}])
    c1 = await count([{"role": "user", "content": _block_text(0, n)}])
    per_word = (c1 - c0) / n
    if per_word <= 0:
        raise ValueError(f"target counts {c0} and {c1} tokens for 0 and {n} words")
    return Calibration(overhead=float(c0), per_word=per_word)


def _block_text(block_id: int, words: int, salt: int = 0) -> str:
    """``words`` vocabulary words, a pure function of ``block_id`` and ``salt``."""
    x = ((block_id * 2654435761) ^ (salt * 0x9E3779B1 + 12345)) & 0xFFFFFFFF
    out = []
    v = len(_VOCAB)
    for _ in range(words):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        out.append(_VOCAB[(x >> 16) % v])
    return " ".join(out)


class PromptSynth:
    """Builds synthetic chat messages; caches block texts (a bounded LRU).

    ``salt`` changes every block's text but not which requests share blocks: the replayer
    gives each policy's run its own salt, so a run never finds the previous run's prompts in
    an engine's prefix cache.
    """

    def __init__(self, calibration: Calibration | None = None, *, salt: int = 0) -> None:
        self.calibration = calibration or Calibration()
        self.salt = salt
        self._blocks: OrderedDict[tuple[int, int], str] = OrderedDict()

    def block(self, block_id: int, words: int) -> str:
        """The text of block ``block_id`` cut to ``words`` words (kept in a bounded cache)."""
        key = (block_id, words)
        text = self._blocks.get(key)
        if text is None:
            text = _block_text(block_id, words, self.salt)
            self._blocks[key] = text
            if len(self._blocks) > _CACHE_BLOCKS:
                self._blocks.popitem(last=False)
        else:
            self._blocks.move_to_end(key)
        return text

    def layout(self, synth: Synth, seed: str) -> list[tuple[int, int]]:
        """The prompt's blocks in order, as (block id, words): the text of
        :meth:`messages` is these blocks' texts joined by single spaces."""
        words = self.calibration.words_for(synth.prompt_tokens)
        per_block = max(1, round(BLOCK_TOKENS / self.calibration.per_word))
        ids: list[int] = list(synth.hash_ids)
        if not ids:
            # Unshared blocks: ids from the request's own seed, far from Mooncake's small ints.
            base = (zlib.crc32(seed.encode()) + 1) << 24
            ids = [base + k for k in range(-(-words // per_block))]
        out: list[tuple[int, int]] = []
        left = words
        for block_id in ids:
            if left <= 0:
                break
            n = min(per_block, left)
            out.append((block_id, n))
            left -= n
        k = len(ids)
        while left > 0:  # more tokens than the ids cover: extend with derived blocks
            n = min(per_block, left)
            out.append(((ids[-1] + 1) * 1_000_003 + k, n))
            left -= n
            k += 1
        return out

    def messages(self, synth: Synth, seed: str) -> list[dict[str, Any]]:
        """One user message of ``synth.prompt_tokens`` tokens under the calibration."""
        text = " ".join(self.block(b, n) for b, n in self.layout(synth, seed))
        return [{"role": "user", "content": text}]

    def body(
        self, base: Mapping[str, Any], synth: Synth, seed: str, url: str = CHAT_URL
    ) -> dict[str, Any]:
        """``base`` (model and parameters) with synthesized ``messages`` (the ``input`` of a
        Responses API request, which takes the same message list)."""
        key = "input" if url == RESPONSES_URL else "messages"
        return {**base, key: self.messages(synth, seed)}


def salted(body: Mapping[str, Any], salt: int) -> Mapping[str, Any] | None:
    """``body`` with its prompt's first text begun by a mark of ``salt``, or None when the
    prompt has no text to mark (token ids). A recorded prompt so marked shares no prefix
    with another salt's (another run's, in an engine's prefix cache), while the requests of
    one run still share what they shared: the mark is the same at the start of each."""
    marked = _marked(body, f"(run {salt}) ", ("messages", "input", "prompt"))
    return marked if isinstance(marked, dict) else None


def _marked(item: object, mark: str, keys: tuple[str, ...] = ("content", "text")) -> object:
    """``item`` (a body, a message, a content part, or a string) with ``mark`` before its
    first text, found under the first of ``keys`` it has; None when it has none."""
    if isinstance(item, str):
        return mark + item
    if not isinstance(item, dict):
        return None
    for key in keys:
        value = item.get(key)
        if isinstance(value, str):
            return {**item, key: mark + value}
        if isinstance(value, list) and value:
            first = _marked(value[0], mark)
            if first is not None:
                return {**item, key: [first, *value[1:]]}
    return None
