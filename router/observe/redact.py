"""Redaction of captured request bodies (``capture.redaction``: ``none``, ``hash``, ``drop``).

Redaction is by allow-list. A body's strings stay only where the OpenAI API (or vLLM's
extensions) gives them a fixed meaning that a replay needs: the model, and enumerated values
such as a message's ``role``, a content part's or tool's ``type``, ``tool_choice: auto``,
``response_format.type`` (the shapes below, from ``_BODY`` down). Every other string is the
client's: under ``hash`` it becomes keyed filler (:func:`hash_text`), under ``drop`` it goes.
Numbers, booleans and null stay, and so do the key names of objects whose shape the API
defines (a body's, a message's, a tool's, a JSON schema's keywords); the key names of the
client's own maps (``metadata``, a schema's ``properties``, the inside of unknown fields) are
redacted like its strings.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from router.config.model import Redaction
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
    words = stream.translate(_WORD_TABLE).decode("ascii")
    symbols = stream.translate(_SYMBOL_TABLE).decode("ascii")
    return _RUN.sub(lambda m: (words if m.lastindex else symbols)[m.start() : m.end()], text)


def _hash_ids(ids: list[int], key: bytes) -> list[int]:
    """Keyed token ids as many as ``ids`` (a prompt given as token ids)."""
    data = ",".join(map(str, ids)).encode()
    seed = hashlib.blake2b(data, key=key, digest_size=32, person=b"ids").digest()
    stream = hashlib.shake_256(seed).digest(4 * len(ids))
    return [
        _ID_LOW + int.from_bytes(stream[i : i + 4], "big") % _ID_SPAN
        for i in range(0, len(stream), 4)
    ]


@dataclass(frozen=True, slots=True)
class Shape:
    """How one JSON value of a request body is redacted; the default: the client's own data."""

    words: frozenset[str] = frozenset()
    """Strings kept as they are (an enumeration's values)."""
    string: Literal["text", "name", "ref", "keep"] = "text"
    """Any other string: ``text`` is the client's; ``name`` too, but an identifier the API
    requires (``drop`` leaves it empty, not absent); ``ref`` a JSON schema ``$ref`` (its
    local name hashed like the ``$defs`` key it names); ``keep`` is kept (the model)."""
    fields: Mapping[str, Shape] | None = None
    """An object of this known shape: key names kept, values by these shapes (others' by
    ``values``). None: an object whose key names are the client's (a map)."""
    values: Shape | None = None
    """Values of the keys ``fields`` does not name, or of a map; None: the client's data."""
    items: Shape | None = None
    """Elements of a list; None: this same shape (so ``stop: "x"`` and ``stop: ["x"]``)."""
    digit_keys: bool = False
    """A map whose all-digit keys are token ids (``logit_bias``): kept."""
    token_ids: bool = False
    """A list of integers is a prompt as token ids: keyed ids under ``hash``."""


def _obj(**fields: Shape) -> Shape:
    return Shape(fields=fields)


def _enum(words: str, **fields: Shape) -> Shape:
    """Strings kept when one of the space-separated ``words`` (or an object of ``fields``)."""
    return Shape(words=frozenset(words.split()), fields=fields or None)


def _each(names: str, shape: Shape) -> dict[str, Shape]:
    """``shape`` for each of the space-separated ``names``."""
    return dict.fromkeys(names.split(), shape)


_FREE = Shape()
_NAME = Shape(string="name")
_EFFORT = _enum("minimal low medium high")
# A JSON schema (tool parameters, structured output) nests schemas: its table is filled in
# once the shape that refers to it exists, and read-only after.
_schema_fields: dict[str, Shape] = {}
_SCHEMA = Shape(fields=MappingProxyType(_schema_fields))
_schema_fields.update(
    {
        "type": _enum("object array string number integer boolean null"),
        "format": _enum(
            "date-time date time duration email idn-email hostname idn-hostname ipv4 ipv6 uri"
            " uri-reference iri iri-reference uuid uri-template json-pointer"
            " relative-json-pointer regex"
        ),
        "$ref": Shape(string="ref"),
        # maps of the client's names to schemas
        **_each(
            "properties patternProperties $defs definitions dependentSchemas",
            Shape(values=_SCHEMA),
        ),
        # a schema, or a list of schemas
        **_each(
            "items prefixItems additionalItems additionalProperties unevaluatedItems"
            " unevaluatedProperties contains propertyNames not if then else anyOf oneOf allOf",
            _SCHEMA,
        ),
    }
)
_CONTENT = Shape(
    items=_obj(
        type=_enum(
            "text image_url input_audio file video_url audio_url refusal input_text"
            " output_text input_image input_file image audio video"
        ),
        image_url=_obj(detail=_enum("auto low high")),
        input_audio=_obj(format=_enum("wav mp3")),
        video_url=_obj(),
        audio_url=_obj(),
        file=_obj(),
        cache_control=_obj(type=_enum("ephemeral")),
    )
)  # a string, or a list of parts
_FUNCTION = _obj(name=_NAME, parameters=_SCHEMA)
_MESSAGE = _obj(
    role=_enum("system developer user assistant tool function"),
    content=_CONTENT,
    tool_calls=Shape(items=_obj(type=_enum("function"), function=_obj(name=_NAME))),
    function_call=_obj(name=_NAME),
)
_PROMPT = Shape(token_ids=True)  # text, token ids, or a list of either
# An embeddings prompt, or the Responses API's input: text, or a list of items (messages).
_INPUT = Shape(
    token_ids=True,
    fields={
        **(_MESSAGE.fields or {}),
        "type": _enum("message function_call function_call_output reasoning"),
    },
)
_BODY = Shape(
    fields={
        "model": Shape(string="keep"),
        "messages": Shape(items=_MESSAGE),
        "prompt": _PROMPT,
        "input": _INPUT,
        "system": _CONTENT,
        "prediction": _obj(type=_enum("content"), content=_CONTENT),
        "tools": Shape(items=_obj(type=_enum("function"), function=_FUNCTION)),
        "functions": Shape(items=_FUNCTION),
        # a word, or the one function to call
        "tool_choice": _enum(
            "none auto required", type=_enum("function"), function=_obj(name=_NAME)
        ),
        "function_call": _enum("none auto", name=_NAME),
        "response_format": _obj(
            type=_enum("text json_object json_schema regex structural_tag"),
            json_schema=_obj(name=_NAME, schema=_SCHEMA),
            schema=_SCHEMA,
        ),
        "guided_json": _SCHEMA,
        "structured_outputs": _obj(json=_SCHEMA),
        "stream_options": _obj(),
        "logit_bias": Shape(digit_keys=True),
        "documents": Shape(items=_obj()),
        "chat_template_kwargs": _obj(reasoning_effort=_EFFORT),
        "reasoning_effort": _EFFORT,
        "service_tier": _enum("auto default flex scale priority"),
        "modalities": _enum("text audio"),
        "encoding_format": _enum("float base64"),
    }
)


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
        values = shape.values or _FREE
        out: dict[str, Any] = {}
        for k, x in v.items():
            if shape.fields is not None:
                name: Any = k
                w = self.value(x, shape.fields.get(k, values), depth + 1)
            else:
                keep = shape.digit_keys and k.isascii() and k.isdigit()
                name = k if keep else self.text(k)
                w = self.value(x, values, depth + 1)
            if name is not _GONE and w is not _GONE:
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
    return _Redactor(drop, key).mapping(dict(body), _BODY, 1)


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
