"""Bodies of the emulator's non-generating endpoints: models, tokenize, detokenize, embeddings.

The tokenizer follows the counting rule of turnout/common/tokens.py. Its ids: below ``_SPECIAL`` the
chat template's markers; then every word and punctuation mark the emulator's output is drawn
from, and the rest of ASCII punctuation, so its own output round-trips through
``/detokenize``; any other token gets a stable id by hash, which ``/detokenize`` can only
render as ``<unk>`` (there is no real vocabulary to spell it from).
"""

from __future__ import annotations

import base64
import string
import struct
import time
import uuid
import zlib
from collections.abc import Mapping
from typing import Any

import orjson

from emulator.api import ApiError, check_model
from emulator.text import PUNCTUATION, WORDS, embedding
from turnout.common.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD, message_text, text_tokens

_VOCAB = 100_000
_SPECIAL = 3  # ids below this stand for template markers in chat prompts
_KNOWN = (*WORDS, *PUNCTUATION, *(c for c in string.punctuation if c not in PUNCTUATION))
_IDS = {t: _SPECIAL + i for i, t in enumerate(_KNOWN)}
_HASHED = _SPECIAL + len(_KNOWN)  # the first id given by hash
_UNKNOWN = "<unk>"
_ATTACHED = frozenset(string.punctuation) - {"_"}  # written without a space before ("_" is \w)


def _token_ids(text: str) -> list[int]:
    """Stable ids for the rule's tokens: not a real vocabulary, but stable for the same text."""
    return [
        _IDS.get(t) or _HASHED + zlib.crc32(t.encode()) % (_VOCAB - _HASHED)
        for t in text_tokens(text)
    ]


def models_body(model: str, max_model_len: int, created: int) -> bytes:
    """``GET /v1/models`` in vLLM's model card shape."""
    permission = {
        "id": f"modelperm-{uuid.uuid5(uuid.NAMESPACE_URL, model).hex}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return orjson.dumps({"object": "list", "data": [card]})


def tokenize_body(doc: Mapping[str, Any], model: str, max_model_len: int) -> bytes:
    """``POST /tokenize``: ``{prompt | messages}`` to ``{count, max_model_len, tokens}``."""
    check_model(doc, model)
    if isinstance(doc.get("messages"), list):
        tokens: list[int] = []
        for m in doc["messages"]:
            if not isinstance(m, Mapping):
                raise ApiError(400, "`messages` must be a list of objects.", "messages")
            tokens += [1] * MESSAGE_OVERHEAD + _token_ids(message_text(m.get("content")))
        tokens += [2] * REPLY_OVERHEAD
    elif isinstance(doc.get("prompt"), str):
        tokens = _token_ids(doc["prompt"])
    else:
        raise ApiError(400, "Send `prompt` (a string) or `messages` (a list).", "prompt")
    return orjson.dumps({"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens})


def detokenize_body(doc: Mapping[str, Any], model: str) -> bytes:
    """``POST /detokenize``: ``{tokens}`` to ``{prompt}``; template markers render as nothing,
    a word gets a space before it unless it starts the text, punctuation gets none."""
    check_model(doc, model)
    tokens = doc.get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise ApiError(400, "`tokens` must be a list of integers.", "tokens")
    out: list[str] = []
    for t in tokens:
        if not 0 <= t < _VOCAB:
            raise ApiError(400, f"Token id {t} is out of vocabulary (0..{_VOCAB - 1}).", "tokens")
        if t < _SPECIAL:
            continue
        piece = _KNOWN[t - _SPECIAL] if t < _HASHED else _UNKNOWN
        out.append(" " + piece if out and piece not in _ATTACHED else piece)
    return orjson.dumps({"prompt": "".join(out)})


def _inputs(value: object) -> list[tuple[bytes, int]]:
    """Each input's identifying bytes and token count."""
    if isinstance(value, str):
        return [(value.encode(), len(text_tokens(value)))]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return [(v.encode(), len(text_tokens(v))) for v in value]
        if all(isinstance(v, int) for v in value):
            return [(orjson.dumps(value), len(value))]
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return [(orjson.dumps(v), len(v)) for v in value]
    raise ApiError(400, "`input` must be a string, a list of strings or token ids.", "input")


def embeddings_body(doc: Mapping[str, Any], model: str, seed: int, dim: int) -> bytes:
    """``POST /v1/embeddings`` with deterministic unit vectors (float or base64)."""
    model = check_model(doc, model)
    fmt = doc.get("encoding_format", "float") or "float"
    if fmt not in ("float", "base64"):
        raise ApiError(400, "`encoding_format` must be `float` or `base64`.", "encoding_format")
    data: list[dict[str, object]] = []
    total = 0
    for i, (key, count) in enumerate(_inputs(doc.get("input"))):
        vec = embedding(seed, key, dim)
        total += count
        value: object = vec
        if fmt == "base64":
            value = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": value})
    usage = {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0}
    return orjson.dumps(
        {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": usage,
        }
    )
