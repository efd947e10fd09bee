"""Request validation for the emulator's OpenAI surface, with vLLM's statuses and messages.

Bodies are checked field by field; unknown fields are accepted and ignored, as vLLM does.
Anything invalid raises :class:`ApiError`, which the server turns into OpenAI's error JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from turnout.common.tokens import count_chat, count_text, response_messages

Api = Literal["chat", "completions", "responses"]

_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answered as ``{"error": {message, type, param, code}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> bytes:
        """The OpenAI-shaped JSON body."""
        err = {
            "message": self.message,
            "type": _TYPES.get(self.status, "APIError"),
            "param": self.param,
            "code": self.status,
        }
        return orjson.dumps({"error": err})


@dataclass(frozen=True, slots=True)
class Generation:
    """What a chat, completion or Responses API request asks the engine for."""

    api: Api
    model: str
    prompt_tokens: int
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    priority: int


def parse_json(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(doc, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return doc


def _int(doc: Mapping[str, Any], key: str, low: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(400, f"`{key}` must be an integer, got {value!r}.", key)
    if value < low:
        raise ApiError(400, f"`{key}` must be at least {low}, got {value}.", key)
    return value


def _number(doc: Mapping[str, Any], key: str, low: float, high: float) -> None:
    value = doc.get(key)
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise ApiError(400, f"`{key}` must be a number in [{low}, {high}], got {value!r}.", key)


def _bool(doc: Mapping[str, Any], key: str) -> bool:
    value = doc.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"`{key}` must be a boolean, got {value!r}.", key)
    return value


def check_model(doc: Mapping[str, Any], served: str) -> str:
    """The requested model, which must be the served one (absent means the served one)."""
    model = doc.get("model", served)
    if model is None:
        return served
    if not isinstance(model, str):
        raise ApiError(400, f"`model` must be a string, got {model!r}.", "model")
    if model != served:
        raise ApiError(404, f"The model `{model}` does not exist.", "model")
    return model


def _prompt_tokens(doc: Mapping[str, Any], api: Api) -> int:
    if api == "responses":
        value, instructions = doc.get("input"), doc.get("instructions")
        if not (isinstance(value, str) or _items(value)):
            raise ApiError(400, "`input` must be a string or a list of input items.", "input")
        if instructions is not None and not isinstance(instructions, str):
            raise ApiError(400, "`instructions` must be a string.", "instructions")
        return count_chat(response_messages(value, instructions))
    if api == "chat":
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "`messages` must be a non-empty list.", "messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, f"`messages[{i}]` must be an object with a `role`.", "messages")
        return count_chat(messages)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return count_text(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    if isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError(400, "Batched prompts are not supported; send one prompt.", "prompt")
    raise ApiError(400, "`prompt` must be a string or a list of token ids.", "prompt")


def _items(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def parse_generation(doc: Mapping[str, Any], *, api: Api, served: str) -> Generation:
    """Validate a chat, completions or Responses API body."""
    model = check_model(doc, served)
    prompt_tokens = _prompt_tokens(doc, api)
    max_tokens = _int(doc, "max_tokens", 1)
    if api == "chat":
        max_tokens = _int(doc, "max_completion_tokens", 1) or max_tokens
    elif api == "responses":
        max_tokens = _int(doc, "max_output_tokens", 1)
        if _bool(doc, "background"):  # nothing is stored to fetch it from later
            raise ApiError(400, "`background` mode is not supported.", "background")
    min_tokens = _int(doc, "min_tokens", 0) or 0
    if max_tokens is not None and min_tokens > max_tokens:
        raise ApiError(400, "`min_tokens` must not exceed `max_tokens`.", "min_tokens")
    n = _int(doc, "n", 1)
    if n is not None and n > 1:
        raise ApiError(400, "`n` > 1 is not supported by this emulator.", "n")
    _number(doc, "temperature", 0.0, 2.0)
    _number(doc, "top_p", 0.0, 1.0)
    _int(doc, "seed", -(2**63))
    priority = doc.get("priority", 0)
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ApiError(400, f"`priority` must be an integer, got {priority!r}.", "priority")
    stream = _bool(doc, "stream")
    options = doc.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(
                400, "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        if not isinstance(options, dict):
            raise ApiError(400, "`stream_options` must be an object.", "stream_options")
        include_usage = _bool(options, "include_usage")
    return Generation(
        api=api,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        ignore_eos=_bool(doc, "ignore_eos"),
        stream=stream,
        include_usage=include_usage,
        priority=priority,
    )


def check_context(prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """The output cap for this request; 400 naming both numbers if it cannot fit."""
    if max_tokens is None:
        if prompt_tokens >= max_model_len:
            raise ApiError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the "
                "input messages.",
                "messages",
            )
        return max_model_len - prompt_tokens
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "max_tokens",
        )
    return max_tokens
