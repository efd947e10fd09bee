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

# The chat template's markers (see emulator.prompt); a block's ids are a range of 2^20 from
# its own base; fresh pieces (answers, new messages) count up from 2^62.
_EMPTY = {"role": "user", "content": ""}
_T = chat_ids([_EMPTY, {"role": "assistant", "content": ""}, _EMPTY])
HEAD, TAIL, NEXT = tuple(_T[:2]), tuple(_T[2:6]), tuple(_T[6:10])
"""<start> user | <end> <nl> <start> assistant | (after a reply) <end> <nl> <start> user"""
_SPAN = 1 << 20
_ROUTER_WORDS = max(1, round(BLOCK_CHARS / WORD_CHARS))
_FRESH_BASE = 1 << 62


Piece = tuple[int, int]
"""A run of a prompt's words: the id of its first token (the rest follow) and its length."""


class Prompts:
    """One run's synthesized prompts: layout salted as the live run's, ids, router blocks."""

    def __init__(self, salt: int, *, mark: bool = False) -> None:
        self.salt = salt
        self.synth = PromptSynth(salt=salt)
        self.mark = mark
        """Recorded prompts are marked with the salt, as the live replayer marks them when it
        compares runs (:func:`replay.synth.salted`)."""
        self._fresh = itertools.count(_FRESH_BASE, _SPAN)

    def pieces(self, item: Item, synth: Synth) -> list[Piece]:
        """The prompt's blocks as pieces (equal blocks, equal pieces)."""
        layout = self.synth.layout(synth, item.record.custom_id)
        mask = (1 << 40) - 1
        return [((hash((self.salt, block)) & mask) * _SPAN, words) for block, words in layout]

    def fresh(self, words: int) -> Piece:
        """A piece no other prompt or answer shares (an answer, a session's new message)."""
        return next(self._fresh), words

    def shape(self, item: Item, synth: Synth) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """The engine's token ids (none when nothing is shared), the router's block chain and
        the prefix hash of ``item``'s synthesized prompt."""
        pieces = self.pieces(item, synth)
        tokens = ids(pieces) if synth.hash_ids else ()
        first = pieces[0][0] if pieces else 0
        return tokens, chain(pieces), zlib.crc32(f"{first}".encode())


def ids(pieces: list[Piece]) -> tuple[int, ...]:
    """A one-message chat prompt of ``pieces``: the template's markers around their ids."""
    out = list(HEAD)
    for base, words in pieces:
        out += range(base, base + words)
    out += TAIL
    return tuple(out)


def chain(pieces: list[Piece]) -> tuple[int, ...]:
    """The router's hash chain over ``pieces`` at the synthesized text's characters a word."""
    out: list[int] = []
    parent, part, filled = 0, [], 0
    for base, words in pieces:
        at = 0
        while at < words and len(out) < MAX_BLOCKS:
            take = min(words - at, _ROUTER_WORDS - filled)
            part.append((base + at, take))
            at += take
            filled += take
            if filled == _ROUTER_WORDS:
                parent = hash((parent, tuple(part)))
                out.append(parent)
                part, filled = [], 0
    return tuple(out)
