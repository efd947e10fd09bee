"""Redaction of captured request bodies (``capture.redaction``: ``none``, ``hash``, ``drop``).

Redaction is by allow-list (router.observe.shapes). A body's strings stay only where the
OpenAI API (or vLLM's extensions) gives them a fixed meaning that a replay needs: the model,
and enumerated values such as a message's ``role``, a content part's or tool's ``type``,
``tool_choice: auto``, ``response_format.type``. Every other string is the client's: under
``hash`` it becomes keyed filler (:func:`hash_text`), under ``drop`` it goes. Numbers,
booleans and null stay, and so do the key names the API defines (a body's parameters, a
message's, a tool's fields, a JSON schema's keywords, the ``chat_template_kwargs`` that
templates read); every other key name is the client's, in its own maps (``metadata``, a
schema's ``properties``) and in an object of known shape alike (a field no API defines, a
template argument of its own): under ``hash`` it becomes filler, under ``drop`` it goes with
its value. So a client cannot carry text into the capture in a key's name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from router.config.model import Redaction
from router.observe.shapes import BODY, FREE, Shape
from turnout.common.tokens import count_chat, count_text, response_messages

# Removed whole under `drop` (the replayer synthesizes a prompt of the recorded size instead).
_PROMPT_KEYS = frozenset({"messages", "prompt", "input", "instructions", "suffix", "system"})
# orjson writes no line nested deeper than this; a deeper body cannot be captured anyway.
MAX_DEPTH = 254
_RUN = re.compile(r"(\w+)|[^\w\s]+")
# Filler alphabets: word characters for word characters, ASCII symbols (never `_`, a word
# character) for every other non-space character, so the token rule sees the same runs.
_WORDS = b"abcdefghijklmnopqrstuvwxyz012345"
_SYMBOLS = b"!\"#$%&'()*+,-./:;<=>?@[\\]^`{|}~"
_WORD_TABLE = bytes(_WORDS[i % len(_WORDS)] for i in range(256))
_SYMBOL_TABLE = bytes(_SYMBOLS[i % len(_SYMBOLS)] for i in range(256))
# ASCII text is filled by bit masks over a slice at a time rather than a call per run: 0xFF
# where a byte is a word character (whitespace), by the same \w (\s) as _RUN's.
_WORD_MASK = bytes(0xFF if re.fullmatch(r"\w", chr(b)) else 0 for b in range(128)) + bytes(128)
_SPACE_MASK = bytes(0xFF if re.fullmatch(r"\s", chr(b)) else 0 for b in range(128)) + bytes(128)
_SLICE = 1 << 16
# Token ids that a hashed token-id prompt is made of: below any real vocabulary's size and
# above the special tokens at its start.
_ID_LOW, _ID_SPAN = 1000, 29000
_LOCAL_REF = re.compile(r"(#/(?:\$defs|definitions)/)(.+)", re.DOTALL)
_GONE = object()  # what `drop` leaves of a value: the key or list element is removed


def hash_text(text: str, key: bytes) -> str:
    """Keyed same-length filler for ``text``.

    Every character but whitespace is replaced: a word character by a word character, any
    other by an ASCII symbol, each drawn from a stream keyed by ``key`` and the whole text.
    What stays is the length, the whitespace and where word runs and symbols fall, so that
    the token count of :mod:`turnout.common.tokens` is unchanged; what goes is every character
    itself, including which symbol (an SSN's dashes become arbitrary symbols). Identical
    texts under one key stay identical (shared system prompts still share a prefix); without
    the key a guess at the text cannot be checked against its filler.
    """
    seed = hashlib.blake2b(
        text.encode("utf-8", "surrogatepass"), key=key, digest_size=32, person=b"text"
    ).digest()
    stream = hashlib.shake_256(seed).digest(len(text))
    if text.isascii():
        return _ascii_filler(text.encode("ascii"), stream)
    return _run_filler(text, stream)


def _run_filler(text: str, stream: bytes) -> str:
    """``text`` with each word run replaced by word filler drawn from ``stream`` at its place,
    each run of other non-space characters by symbols (a call per run)."""
    words = stream.translate(_WORD_TABLE).decode("ascii")
    symbols = stream.translate(_SYMBOL_TABLE).decode("ascii")
    return _RUN.sub(lambda m: (words if m.lastindex else symbols)[m.start() : m.end()], text)


def _ascii_filler(text: bytes, stream: bytes) -> str:
    """What :func:`_run_filler` makes of ASCII ``text``, by masks over whole integers a slice
    at a time: a call per run costs about 0.4 µs, so 8 MiB of prose took most of a second."""
    out = []
    for at in range(0, len(text), _SLICE):
        part, draw = text[at : at + _SLICE], stream[at : at + _SLICE]
        word = int.from_bytes(part.translate(_WORD_MASK))
        space = int.from_bytes(part.translate(_SPACE_MASK))
        filled = (
            (int.from_bytes(part) & space)
            | (int.from_bytes(draw.translate(_WORD_TABLE)) & word)
            | (int.from_bytes(draw.translate(_SYMBOL_TABLE)) & ~(word | space))
        )
        out.append(filled.to_bytes(len(part)))
    return b"".join(out).decode("ascii")


def _hash_ids(ids: list[int], key: bytes) -> list[int]:
    """Keyed token ids as many as ``ids`` (a prompt given as token ids)."""
    data = ",".join(map(str, ids)).encode()
    seed = hashlib.blake2b(data, key=key, digest_size=32, person=b"ids").digest()
    stream = hashlib.shake_256(seed).digest(4 * len(ids))
    return [
        _ID_LOW + int.from_bytes(stream[i : i + 4], "big") % _ID_SPAN
        for i in range(0, len(stream), 4)
    ]


class _Redactor:
    """One walk over a body under ``hash`` (keyed filler) or ``drop`` (removal)."""

    def __init__(self, drop: bool, key: bytes) -> None:
        self._drop = drop
        self._key = key

    def text(self, s: str) -> Any:
        return _GONE if self._drop else hash_text(s, self._key)

    def string(self, s: str, shape: Shape) -> Any:
        if s in shape.words or shape.string == "keep":
            return s
        if shape.string == "name" and self._drop:
            return ""
        if shape.string == "ref" and not self._drop and (m := _LOCAL_REF.fullmatch(s)):
            return m[1] + hash_text(m[2], self._key)
        return self.text(s)

    def value(self, v: Any, shape: Shape, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(v, str):
            return self.string(v, shape)
        if isinstance(v, list):
            if shape.token_ids and v and all(type(x) is int for x in v):
                return _GONE if self._drop else _hash_ids(v, self._key)
            item = shape.items or shape
            out: Any = [w for x in v if (w := self.value(x, item, depth + 1)) is not _GONE]
        elif isinstance(v, dict):
            out = self.mapping(v, shape, depth)
        else:  # numbers, booleans, null
            return v
        # `drop` removes what held only the client's strings: no `stop: []` or `enum: []`.
        return _GONE if self._drop and v and not out else out

    def mapping(self, v: dict[Any, Any], shape: Shape, depth: int) -> dict[str, Any]:
        values, fields = shape.values or FREE, shape.fields
        out: dict[str, Any] = {}
        for k, x in v.items():
            if fields is not None and k in fields:
                name: Any = k
                w = self.value(x, fields[k], depth + 1)
            else:  # a name the client chose: in a map, or an unknown field
                keep = shape.digit_keys and k.isascii() and k.isdigit()
                name = k if keep else self.text(k)
                if name is _GONE:
                    continue
                w = self.value(x, values, depth + 1)
            if w is not _GONE:
                out[name] = w
        return out


def prompt_size(body: Mapping[str, Any]) -> int | None:
    """The prompt's token count under :mod:`turnout.common.tokens` (chat, text, or a Responses API
    request that shows itself as one: ``instructions`` or a list of items), if it has one."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return count_chat(m for m in messages if isinstance(m, dict))
    value, instructions = body.get("input"), body.get("instructions")
    if instructions is not None or (
        isinstance(value, list) and any(isinstance(v, dict) for v in value)
    ):
        return count_chat(response_messages(value, instructions))
    prompt = body.get("prompt")
    return count_text(prompt) if isinstance(prompt, str) else None


def redact(body: Mapping[str, Any], mode: Redaction, key: bytes) -> Mapping[str, Any]:
    """The body as written under redaction ``mode``; ``key`` keys the ``hash`` filler.

    Raises ValueError for a body nested deeper than :data:`MAX_DEPTH` (not writable anyway).
    """
    if mode == "none":
        return body
    drop = mode == "drop"
    if drop:  # the prompt goes whole, as `drop` promises (and the replayer looks for)
        body = {k: v for k, v in body.items() if k not in _PROMPT_KEYS}
    return _Redactor(drop, key).mapping(dict(body), BODY, 1)


_CODE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def redact_error(error: Mapping[str, object], mode: Redaction, key: bytes) -> Mapping[str, object]:
    """An answer's error under redaction ``mode``: an engine's message may quote the prompt.

    The message becomes filler (``hash``) or goes (``drop``); ``code`` and ``type`` stay when
    they are identifiers or numbers (what dashboards group by); anything else goes.
    """
    if mode == "none":
        return error
    out: dict[str, object] = {}
    message = error.get("message")
    if isinstance(message, str) and mode == "hash":
        out["message"] = hash_text(message, key)
    for name in ("code", "type"):
        v = error.get(name)
        if (isinstance(v, int) and not isinstance(v, bool)) or (
            isinstance(v, str) and _CODE.fullmatch(v)
        ):
            out[name] = v
    return out
