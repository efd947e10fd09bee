"""Request bytes and headers -> a validated :class:`Parsed` request with its class.

The body is parsed once (orjson). The class comes from, in order: the ``X-Request-Class``
header, the API key's configured class, OpenAI's ``service_tier`` (``flex`` means batch),
the configured rules over ``stream``, the output budget and the prompt size, then the default.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import orjson

from policies.prefix import prompt_blocks
from policies.types import REQUEST_CLASSES, Endpoint, RequestClass, RequestInfo
from router.config.model import ClassificationSettings, Rule
from router.server.errors import RouterError
from turnout.common.tokens import count_chat, count_text, message_text, response_messages

# What each endpoint must carry besides "model".
_REQUIRED: dict[Endpoint, str] = {
    "chat": "messages",
    "completions": "prompt",
    "embeddings": "input",
    "responses": "input",
}
_PREFIX_CHARS = 512


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request as the router understands it."""

    info: RequestInfo
    doc: dict[str, Any]
    """The decoded body (read-only by convention; rewritten copies go upstream)."""
    include_usage: bool
    """The client itself asked for the usage chunk of a stream."""


def parse_object(body: bytes) -> dict[str, Any]:
    """Decode a body that must be one JSON object; raises :class:`RouterError` (400) if not."""
    if not body:
        raise RouterError(400, "request body is empty; expected a JSON object")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RouterError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RouterError(400, "request body must be a JSON object")
    return doc


def parse_body(body: bytes, endpoint: Endpoint) -> dict[str, Any]:
    """Decode and check the body's shape; raises :class:`RouterError` (400) when bad."""
    doc = parse_object(body)
    model = doc.get("model")
    if model is None:
        raise RouterError(
            400, "missing required parameter 'model'", "model", "missing_required_parameter"
        )
    if not isinstance(model, str) or not model:
        raise RouterError(400, "'model' must be a non-empty string", "model", "invalid_type")
    field = _REQUIRED[endpoint]
    value = doc.get(field)
    if value is None:
        raise RouterError(
            400, f"missing required parameter '{field}'", field, "missing_required_parameter"
        )
    if endpoint == "chat" and (
        not isinstance(value, list) or not all(isinstance(m, dict) for m in value) or not value
    ):
        raise RouterError(
            400, "'messages' must be a non-empty list of objects", field, "invalid_type"
        )
    if endpoint != "chat" and not isinstance(value, str | list):
        raise RouterError(400, f"'{field}' must be a string or a list", field, "invalid_type")
    if (
        endpoint == "responses"
        and isinstance(value, list)
        and not all(isinstance(item, dict) for item in value)
    ):
        message = "'input' must be a string or a list of objects"
        raise RouterError(400, message, field, "invalid_type")
    if not isinstance(doc.get("stream", False), bool):
        raise RouterError(400, "'stream' must be a boolean", "stream", "invalid_type")
    instructions = doc.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        message = "'instructions' must be a string"
        raise RouterError(400, message, "instructions", "invalid_type")
    n = doc.get("n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise RouterError(400, "'n' must be a positive integer", "n", "invalid_type")
    if n is not None and n > 1 and endpoint in ("responses", "embeddings"):
        message = f"'n' > 1 is not supported on /v1/{endpoint}, which generates one output"
        raise RouterError(400, message, "n", "unsupported_parameter")
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = doc.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise RouterError(400, f"'{key}' must be a non-negative integer", key, "invalid_type")
    opts = doc.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise RouterError(
            400, "'stream_options' must be an object", "stream_options", "invalid_type"
        )
    return doc


def prompt_text(doc: Mapping[str, Any], endpoint: Endpoint) -> str:
    """The prompt's text (chat messages joined; token-id prompts give an empty string)."""
    if endpoint in ("chat", "responses"):
        return "\n".join(message_text(m.get("content")) for m in _messages(doc, endpoint))
    value = doc[_REQUIRED[endpoint]]
    if isinstance(value, str):
        return value
    return "\n".join(v for v in value if isinstance(v, str))


def _messages(doc: Mapping[str, Any], endpoint: Endpoint) -> list[Mapping[str, Any]]:
    """A chat's messages, or the chat a Responses API request is rendered to."""
    if endpoint == "chat":
        messages: list[Mapping[str, Any]] = doc["messages"]
        return messages
    return response_messages(doc["input"], doc.get("instructions"))


def prompt_tokens(doc: Mapping[str, Any], endpoint: Endpoint) -> int:
    """The prompt size under the documented counting rule (turnout/common/tokens.py)."""
    if endpoint in ("chat", "responses"):
        return count_chat(_messages(doc, endpoint))
    value = doc[_REQUIRED[endpoint]]
    if isinstance(value, str):
        return count_text(value)
    if value and all(isinstance(v, int) for v in value):
        return len(value)  # one prompt given as token ids
    total = 0
    for v in value:
        if isinstance(v, str):
            total += count_text(v)
        elif isinstance(v, list):
            total += len(v)
    return total


class Facts(Protocol):
    """What the classification rules look at (a :class:`RequestInfo` has it all)."""

    @property
    def endpoint(self) -> Endpoint: ...
    @property
    def stream(self) -> bool: ...
    @property
    def max_tokens(self) -> int | None: ...
    @property
    def prompt_tokens(self) -> int: ...


class RuleFacts(NamedTuple):
    """:class:`Facts` of a request being classified: its info is then built once, with its
    class, from the same figures."""

    endpoint: Endpoint
    stream: bool
    max_tokens: int | None
    prompt_tokens: int


def classify(
    body: bytes,
    endpoint: Endpoint,
    *,
    request_id: str,
    header_class: str | None,
    key_class: RequestClass | None,
    session_key: str | None,
    settings: ClassificationSettings,
    prefix: bool = True,
) -> Parsed:
    """Parse ``body`` and build its :class:`RequestInfo`; raises 400 on a bad body or class
    header. Pure and synchronous, so the handler may run it in a worker thread. ``prefix``:
    the policy reads the prompt's prefix (``prefix_hash``, ``prefix_blocks``), so it is
    hashed; otherwise it is not (:func:`with_prefix` hashes it later)."""
    doc = parse_body(body, endpoint)
    stream = bool(doc.get("stream", False))
    max_tokens = doc.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = doc.get("max_tokens")
    if max_tokens is None:
        max_tokens = doc.get("max_output_tokens")  # the Responses API's name
    tokens = prompt_tokens(doc, endpoint)
    text = prompt_text(doc, endpoint) if prefix else ""
    facts = RuleFacts(endpoint, stream, max_tokens, tokens)
    info = RequestInfo(
        request_id=request_id,
        endpoint=endpoint,
        model=doc["model"],
        request_class=choose_class(facts, doc, header_class, key_class, settings),
        stream=stream,
        prompt_tokens=tokens,
        max_tokens=max_tokens,
        session_key=session_key,
        prefix_hash=_prefix_hash(text),
        prefix_blocks=prompt_blocks(text),
        choices=doc.get("n") or 1,
    )
    opts = doc.get("stream_options") or {}
    return Parsed(info=info, doc=doc, include_usage=bool(opts.get("include_usage")))


def with_prefix(parsed: Parsed) -> RequestInfo:
    """``parsed``'s info with its prompt's prefix hashed (when :func:`classify` did not)."""
    info = parsed.info
    if info.prefix_hash is not None:
        return info
    text = prompt_text(parsed.doc, info.endpoint)
    return replace(info, prefix_hash=_prefix_hash(text), prefix_blocks=prompt_blocks(text))


def _prefix_hash(text: str) -> int | None:
    """The affinity hash of a prompt's first characters (None: no text)."""
    return zlib.crc32(text[:_PREFIX_CHARS].encode()) if text else None


def choose_class(
    info: Facts,
    doc: Mapping[str, Any],
    header_class: str | None,
    key_class: RequestClass | None,
    settings: ClassificationSettings,
) -> RequestClass:
    """The class of a request: header, API key, ``service_tier``, rules, then the default."""
    if header_class is not None and settings.honor_header:
        value = header_class.strip().lower()
        for c in REQUEST_CLASSES:
            if value == c:
                return c
        known = ", ".join(REQUEST_CLASSES)
        raise RouterError(400, f"X-Request-Class must be one of: {known}", "X-Request-Class")
    if key_class is not None:
        return key_class
    if settings.flex_is_batch and doc.get("service_tier") == "flex":
        return "batch"
    for rule in settings.rules:
        if matches(rule, info):
            return rule.request_class
    return settings.default


def matches(rule: Rule, info: Facts) -> bool:
    """Whether every condition the rule states holds for the request."""
    if rule.endpoint is not None and rule.endpoint != info.endpoint:
        return False
    if rule.stream is not None and rule.stream != info.stream:
        return False
    budget = info.max_tokens
    if rule.max_tokens_at_least is not None and (
        budget is None or budget < rule.max_tokens_at_least
    ):
        return False
    if rule.max_tokens_below is not None and (budget is None or budget >= rule.max_tokens_below):
        return False
    if rule.prompt_tokens_at_least is not None and info.prompt_tokens < rule.prompt_tokens_at_least:
        return False
    return not (
        rule.prompt_tokens_below is not None and info.prompt_tokens >= rule.prompt_tokens_below
    )
