"""The Responses API (``POST /v1/responses``) in vLLM's shape: the response object, and the
typed SSE events of a streamed one.

A stream opens with ``response.created`` and ``response.in_progress`` (the response with
``status: in_progress``, no output, no usage), adds one assistant message item and its
``output_text`` part, sends one ``response.output_text.delta`` per engine chunk, closes the
text, part and item with their ``.done`` events, and ends with ``response.completed``, whose
response carries the output and the usage (``input_tokens``, ``output_tokens``). Each event is
``event: TYPE`` plus one ``data:`` line, numbered by ``sequence_number``; there is no
``[DONE]``. A response cut at ``max_output_tokens`` is ``incomplete`` (reason
``max_output_tokens``), which vLLM also reports in ``response.completed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from emulator.api import Generation


def _usage(prompt: int, output: int, cached: int) -> dict[str, object]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def _part(text: str) -> dict[str, object]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseFraming:
    """The events of one streamed response (and its object when not streamed); only a
    delta's sequence number and text change per chunk."""

    __slots__ = ("_base", "_delta", "_finish", "_item", "_seq")

    def __init__(
        self, doc: Mapping[str, Any], gen: Generation, rid: str, created: int, finish: str
    ) -> None:
        self._finish = finish
        self._seq = 0
        self._item = f"msg_{rid.removeprefix('resp_')}"
        # What the response echoes of the request, as vLLM's ResponsesResponse.from_request.
        self._base: dict[str, object] = {
            "id": rid,
            "object": "response",
            "created_at": created,
            "model": gen.model,
            "instructions": doc.get("instructions"),
            "max_output_tokens": gen.max_tokens,
            "metadata": doc.get("metadata"),
            "parallel_tool_calls": doc.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": doc.get("reasoning"),
            "service_tier": doc.get("service_tier", "auto"),
            "temperature": doc.get("temperature", 1.0),
            "text": doc.get("text"),
            "tool_choice": doc.get("tool_choice", "auto"),
            "tools": doc.get("tools") or [],
            "top_logprobs": doc.get("top_logprobs", 0),
            "top_p": doc.get("top_p", 1.0),
            "truncation": doc.get("truncation", "disabled"),
            "user": doc.get("user"),
            "background": False,
            "error": None,
        }
        kind = b"response.output_text.delta"
        self._delta = (
            b"event: " + kind + b"\ndata: " + orjson.dumps({"type": kind.decode()})[:-1]
            + b',"item_id":"%s","output_index":0,"content_index":0,"logprobs":[],'
            b'"sequence_number":' % self._item.encode()
        )  # fmt: skip

    def _event(self, kind: str, **fields: object) -> bytes:
        doc = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps(doc))

    def response(
        self, text: str | None, prompt: int, output: int, cached: int = 0
    ) -> dict[str, object]:
        """The response object: in progress (``text`` None), else finished with ``text``."""
        if text is None:
            extra: dict[str, object] = {"status": "in_progress", "output": [], "usage": None}
            return {**self._base, **extra, "incomplete_details": None}
        item = self._message(text, "completed")
        cut = self._finish == "length"
        return {
            **self._base,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": [item],
            "usage": _usage(prompt, output, cached),
        }

    def _message(self, text: str | None, status: str) -> dict[str, object]:
        content = [] if text is None else [_part(text)]
        return {
            "id": self._item,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def opening(self) -> bytes:
        """``response.created`` to ``response.content_part.added``."""
        started = self.response(None, 0, 0)
        return b"".join(
            (
                self._event("response.created", response=started),
                self._event("response.in_progress", response=started),
                self._event(
                    "response.output_item.added",
                    output_index=0,
                    item=self._message(None, "in_progress"),
                ),
                self._event(
                    "response.content_part.added",
                    item_id=self._item,
                    output_index=0,
                    content_index=0,
                    part=_part(""),
                ),
            )
        )

    def chunk(self, text: str, last: bool = False) -> bytes:
        """One ``response.output_text.delta`` (``last`` changes nothing: the end comes in
        :meth:`closing`)."""
        seq = self._seq
        self._seq += 1
        return self._delta + b'%d,"delta":%b}\n\n' % (seq, orjson.dumps(text))

    def closing(self, text: str, prompt: int, output: int, cached: int) -> bytes:
        """The text, part and item ``.done`` events and ``response.completed``."""
        where = {"item_id": self._item, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=_part(text)),
                self._event(
                    "response.output_item.done",
                    output_index=0,
                    item=self._message(text, "completed"),
                ),
                self._event(
                    "response.completed", response=self.response(text, prompt, output, cached)
                ),
            )
        )
