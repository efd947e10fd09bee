"""Redaction of captured request bodies (``capture.redaction``: ``none``, ``hash``, ``drop``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from common.tokens import count_chat, count_text

# The prompt-bearing keys of the OpenAI request bodies the router serves.
_PROMPT_KEYS = ("messages", "prompt", "input", "suffix")
# Keys whose string values are structure, not text: kept as they are under `hash`.
_STRUCTURE_KEYS = frozenset({"role", "type", "id", "tool_call_id"})
_WORD = re.compile(r"\w+")
_FILLER = b"abcdefghijklmnopqrstuvwxyz"


def hash_text(text: str) -> str:
    """Same-length deterministic filler: word characters replaced, punctuation and spaces kept.

    The filler is keyed on the whole text, so identical texts (shared system prompts) stay
    identical and prefix caches still see the sharing, and the token count under
    :mod:`common.tokens` is unchanged (word runs stay word runs of the same length).
    """
    digest = hashlib.blake2b(text.encode(), digest_size=64).digest()
    n = len(digest)
    i = 0

    def fill(m: re.Match[str]) -> str:
        nonlocal i
        start = i
        i += len(m.group())
        return bytes(_FILLER[digest[k % n] % 26] for k in range(start, i)).decode()

    return _WORD.sub(fill, text)


def _hash_value(v: Any) -> Any:
    """Apply :func:`hash_text` to every string inside a prompt-bearing value."""
    if isinstance(v, str):
        return hash_text(v)
    if isinstance(v, list):
        return [_hash_value(x) for x in v]
    if isinstance(v, dict):  # every text inside a message (content, tool-call arguments, ...)
        return {k: (x if k in _STRUCTURE_KEYS else _hash_value(x)) for k, x in v.items()}
    return v


def prompt_size(body: Mapping[str, Any]) -> int | None:
    messages = body.get("messages")
    if isinstance(messages, list):
        return count_chat(m for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    return count_text(prompt) if isinstance(prompt, str) else None


def redact(body: dict[str, Any], mode: str) -> dict[str, Any]:
    """The body as written under redaction ``mode`` (``none``, ``hash`` or ``drop``)."""
    if mode == "none":
        return body
    if mode == "drop":
        return {k: v for k, v in body.items() if k not in _PROMPT_KEYS}
    return {k: (_hash_value(v) if k in _PROMPT_KEYS else v) for k, v in body.items()}
