"""What an OpenAI answer says about how it ended: finish reason, token usage, error.

:class:`AnswerFields` reads parsed events of a stream (chat and completions chunks, the Responses
API's typed events) and whole non-streamed bodies, and keeps only those fields. Every field is
checked, since the upstream is not trusted: one that is malformed is ignored and counted in
:attr:`AnswerFields.protocol_errors`, never raised. :class:`turnout.common.sse_events.EventMeter`
builds on it, adding the timing of content, and :class:`turnout.common.sse.StreamMeter` the
framing of the byte stream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson

from turnout.common.tokens import count_text, message_text

PROTOCOL_ERRORS = ("event_too_large", "bad_json", "bad_utf8", "bad_usage", "bad_finish_reason")
"""The kinds :attr:`AnswerFields.protocol_errors` counts (the first is the framing's)."""

MAX_USAGE_TOKENS = 100_000_000
"""Token counts above this (or negative, or not whole numbers) are ignored as ``bad_usage``."""

JSON_WS = rb"[ \t\r\n]*"
"""JSON whitespace, for byte patterns over events."""
BAD = object()  # what AnswerFields._parse returns for an event that is not JSON
_ERROR_START = re.compile(JSON_WS + rb"\{" + JSON_WS + rb'"error"')
_DELTA_KEYS = ("content", "reasoning_content", "reasoning", "tool_calls")
# Responses API events that carry generated content, and those that end a stream.
_CONTENT_TYPES = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)
LAST_TYPES = frozenset({"response.completed", "response.incomplete", "response.failed"})


class AnswerFields:
    """The finish reason, usage and error an answer reports, read from its events or body.

    ``protocol_errors`` counts what the upstream got wrong, by kind (see
    :data:`PROTOCOL_ERRORS`): ``bad_json`` (an event read that is not JSON, or not an object
    with a list of object choices), ``bad_utf8`` (not UTF-8: the rest is still read from a lossy
    decoding), ``bad_usage`` (a usage that is not an object, or a token count that is not a
    whole number in 0..:data:`MAX_USAGE_TOKENS`), ``bad_finish_reason`` (not a short printable
    ASCII word), and the framing's ``event_too_large``.
    """

    __slots__ = (
        "body_tokens",
        "cached_tokens",
        "completion_tokens",
        "done",
        "error",
        "finish_reason",
        "prompt_tokens",
        "protocol_errors",
    )

    def __init__(self) -> None:
        self.body_tokens: int | None = None
        """The tokens of a non-streamed body's generated text, counted by the router: only
        when the body reports no completion tokens of its own (a settlement's estimate)."""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        """Prompt tokens the engine found in its prefix cache (``prompt_tokens_details``)."""
        self.finish_reason: str | None = None
        self.error: dict[str, object] | None = None
        self.done = False
        self.protocol_errors: dict[str, int] = {}
        """What the upstream got wrong, by kind, with counts (see :data:`PROTOCOL_ERRORS`)."""

    def _count(self, kind: str) -> None:
        errors = self.protocol_errors
        errors[kind] = errors.get(kind, 0) + 1

    def _typed(self, kind: object, doc: Mapping[str, Any]) -> None:
        """A Responses API event: its error event, or a last event and its response."""
        if kind == "error":  # the error's fields at the top: code, message, param
            self.error = {k: doc.get(k) for k in ("message", "code", "param")}
        elif kind in LAST_TYPES:
            self.done = True
            response = doc.get("response")
            if isinstance(response, dict):
                self._response(response)
            else:
                self._count("bad_json")

    def _response(self, response: Mapping[str, Any]) -> None:
        """A Responses API response object's usage, status (as a finish reason: ``stop`` when
        completed, ``length`` when cut at ``max_output_tokens``, else the reason given) and
        error."""
        usage = response.get("usage")
        if usage is not None:
            self._usage(usage)
        err = response.get("error")
        if err is not None:
            self.error = error_object(err)
        status = response.get("status")
        if status == "completed":
            self._finish("stop")
        elif status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if isinstance(details, dict) else None
            self._finish("length" if reason == "max_output_tokens" else reason)

    def _parse(self, payload: bytes) -> object:
        """The JSON in ``payload``, or ``BAD`` (counted) if it is not valid JSON."""
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
        try:
            payload.decode()
        except UnicodeDecodeError:
            self._count("bad_utf8")
            try:  # read what can be read: usage figures do not need the broken text
                return orjson.loads(payload.decode(errors="replace"))
            except orjson.JSONDecodeError:
                pass
        self._count("bad_json")
        if _ERROR_START.match(payload):  # still an error, if a malformed one
            self.error = {"message": payload[:200].decode(errors="replace")}
        return BAD

    def _finish(self, reason: object) -> None:
        """Take a choice's ``finish_reason`` if it is a short printable ASCII word."""
        if reason is None or reason == "":
            return
        if (
            isinstance(reason, str)
            and len(reason) <= 64
            and reason.isascii()
            and reason.isprintable()
        ):
            self.finish_reason = reason
        else:
            self._count("bad_finish_reason")

    def _usage(self, usage: object) -> None:
        """Take the token counts of a ``usage`` object that are whole numbers in range."""
        if not isinstance(usage, dict):
            self._count("bad_usage")
            return
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if prompt is None and completion is None:  # the Responses API's names
            prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        bad = False
        if _is_count(prompt):
            self.prompt_tokens = prompt
        elif prompt is not None:
            bad = True
        if _is_count(completion):
            self.completion_tokens = completion
        elif completion is not None:
            bad = True
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
        if isinstance(details, dict):
            cached = details.get("cached_tokens")
            if _is_count(cached):
                self.cached_tokens = cached
            elif cached is not None:
                bad = True
        if bad:
            self._count("bad_usage")

    def read_body(self, body: bytes) -> bool:
        """Read a non-streamed JSON answer; False if it is not a JSON object at all.

        Malformed fields are ignored and counted as in a stream; a body that is not JSON (an
        HTML error page, say) counts as ``bad_json``.
        """
        doc = self._parse(body)
        if not isinstance(doc, dict):
            if doc is not BAD:
                self._count("bad_json")
            return False
        if doc.get("object") == "response":
            self._response(doc)
            output = doc.get("output")
            if isinstance(output, list) and self.completion_tokens is None:
                self.body_tokens = sum(_output_tokens(o) for o in output if isinstance(o, dict))
            return True
        err = doc.get("error")
        if err is not None:
            self.error = error_object(err)
        usage = doc.get("usage")
        if usage is not None:
            self._usage(usage)
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self._finish(choices[0].get("finish_reason"))
            if self.completion_tokens is None:
                self.body_tokens = sum(_generated_tokens(c) for c in choices if isinstance(c, dict))
        return True


def error_object(err: object) -> dict[str, object]:
    """An error event's ``error``, as an object."""
    return err if isinstance(err, dict) else {"message": str(err)}


def has_content(doc: object) -> bool:
    """Whether a parsed event carries generated content: a non-empty text, reasoning or tool
    call in one of its choices, or a Responses API content delta."""
    if not isinstance(doc, dict):
        return False
    kind = doc.get("type")
    if kind is not None:
        delta = doc.get("delta")
        return kind in _CONTENT_TYPES and isinstance(delta, str) and delta != ""
    choices = doc.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for key in _DELTA_KEYS:
                value = delta.get(key)
                if value and isinstance(value, str | list):
                    return True
        value = choice.get("text")
        if value and isinstance(value, str | list):
            return True
    return False


def _is_count(n: object) -> TypeGuard[int]:
    """A token count a backend may report: a whole number in range (a JSON bool is not)."""
    return type(n) is int and 0 <= n <= MAX_USAGE_TOKENS


def _generated_tokens(choice: Mapping[str, Any]) -> int:
    """Tokens of one choice's generated text (chat ``message`` or completions ``text``)."""
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return count_text(message_text(text)) if text is not None else 0


def _output_tokens(item: Mapping[str, Any]) -> int:
    """Tokens of one Responses API output item's text parts."""
    content = item.get("content")
    if not isinstance(content, list):
        return 0
    return sum(
        count_text(p["text"])
        for p in content
        if isinstance(p, dict) and isinstance(p.get("text"), str)
    )
