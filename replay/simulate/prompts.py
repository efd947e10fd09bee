"""Synthesized prompts in simulate: their structure without their text.

What a synthesized prompt's text decides downstream is which requests share how much of it:
the engine's prefix cache compares token ids block by block, a cache-aware policy compares
the router's hash chain of 256-character blocks, affinity the hash of the first 512
characters. Writing and tokenizing every prompt would cost more than the rest of the
simulation, so each of those is built from the prompt's block layout, which is the live
replayer's own (:meth:`replay.synth.PromptSynth.layout`, salted per run the same way): a
synthesized block's token ids are a range of its own (equal blocks, equal ids; the template
markers are the emulator's), and the router's blocks are cut from the same layout at the
synthesized text's mean characters per word. Equal prefixes in the live run are equal here
and unequal ones unequal, at the same token offsets; a router block boundary may fall a few
characters from where the live text puts it. A prompt without ``hash_ids`` shares nothing
with any other: the engine model gets no ids for it (its blocks could only be evicted, never
hit, and free and evictable blocks admit alike), which saves hashing them.
"""

from __future__ import annotations

import itertools
import zlib

from emulator.prompt import chat_ids
from policies.prefix import BLOCK_CHARS, MAX_BLOCKS
from replay.sources import Item, Synth
from replay.synth import WORD_CHARS, PromptSynth

# The chat template's markers: <start> user | content | <end> <nl> <start> assistant (see
# emulator.prompt); a block's ids are a range of 2^20 from its own base, above the template's.
_HEAD_TAIL = chat_ids([{"role": "user", "content": ""}])
HEAD, TAIL = tuple(_HEAD_TAIL[:2]), tuple(_HEAD_TAIL[2:])
_SPAN = 1 << 20
_ROUTER_WORDS = max(1, round(BLOCK_CHARS / WORD_CHARS))
_REPLY_BASE = 1 << 62


class Prompts:
    """One run's synthesized prompts: layout salted as the live run's, ids, router blocks."""

    def __init__(self, salt: int) -> None:
        self.salt = salt
        self.synth = PromptSynth(salt=salt)
        self._replies = itertools.count(_REPLY_BASE, _SPAN)

    def _base(self, block: int) -> int:
        return (hash((self.salt, block)) & ((1 << 40) - 1)) * _SPAN

    def shape(self, item: Item, synth: Synth) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The engine's token ids, the router's block chain and the prefix hash of ``item``."""
        layout = self.synth.layout(synth, item.record.custom_id)
        ids = list(HEAD)
        chain: list[int] = []
        parent, piece, filled = 0, [], 0
        shared = bool(synth.hash_ids)
        for block, words in layout:
            if shared:
                base = self._base(block)
                ids += range(base, base + words)
            at = 0
            while at < words and len(chain) < MAX_BLOCKS:
                take = min(words - at, _ROUTER_WORDS - filled)
                piece.append((block, at, take))
                at += take
                filled += take
                if filled == _ROUTER_WORDS:
                    parent = hash((parent, tuple(piece)))
                    chain.append(parent)
                    piece, filled = [], 0
        ids += TAIL
        first = layout[0][0] if layout else 0
        tokens = tuple(ids) if shared else ()
        return tokens, tuple(chain), zlib.crc32(f"{self.salt}:{first}".encode())

    def reply(self, tokens: int) -> tuple[int, ...]:
        """Ids for an answer of ``tokens`` tokens that no other answer or prompt shares."""
        base = next(self._replies)
        return tuple(range(base, base + tokens))
