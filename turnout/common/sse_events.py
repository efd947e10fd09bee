"""What the events of an OpenAI-style stream say, metered as they arrive: when content came
(TTFT and the gaps between content events), and, through
:class:`turnout.common.answer_fields.AnswerFields`, how the answer ended. An event's data is
JSON-decoded only when a byte pattern says it may matter. :class:`turnout.common.sse.StreamMeter`
adds the framing of the byte stream into events.
"""

from __future__ import annotations

import re

import orjson

from turnout.common.answer_fields import BAD, JSON_WS, AnswerFields, error_object, has_content
from turnout.common.figures import StreamFigures

DONE = b"[DONE]"
_NOT_NULL = JSON_WS + b":" + JSON_WS + rb"[^n \t\r\n]"  # after a key: a value other than null
# An event is parsed only if one of these keys occurs in it with a value: the content keys
# until the first content (in every event when tracking gaps), the others in any event.
_CONTENT_HINT = re.compile(
    rb'"(?:content|text|reasoning|reasoning_content|tool_calls|delta)"' + _NOT_NULL
)
_META_HINT = re.compile(rb'"(?:error|finish_reason|usage)"' + _NOT_NULL)


def is_content_event(payload: bytes) -> bool:
    """Whether one SSE ``data`` payload carries generated content (a non-empty text, reasoning
    or tool call in one of its choices)."""
    if not _CONTENT_HINT.search(payload):
        return False
    try:
        return has_content(orjson.loads(payload))
    except orjson.JSONDecodeError:
        return False


class EventMeter(AnswerFields):
    """Meters the data of each event, and a non-streamed body, into :class:`StreamFigures`.

    **Untrusted.** What the events say is read and checked by
    :class:`turnout.common.answer_fields.AnswerFields` (malformed fields are counted in
    :attr:`protocol_errors`, never raised). Counts are per event read (an event is read only
    if it may matter, so a malformed event after the first content that names none of those
    keys goes unnoticed, and unharmed).

    ``strip_usage``: the usage-only event (a non-null ``usage`` and ``choices`` empty or
    absent) is not to be forwarded, for when the router asked the engine for usage on the
    client's behalf.

    ``track_gaps``: look for content in every event (needed for ITL). The router passes False:
    after the first content event it only watches for the finish, usage, error and ``[DONE]``
    events, which roughly halves the per-chunk scan; its TPOT then comes from the usage figures.

    ``choices``: the request's ``n``, so that TPOT is per choice (see :class:`StreamFigures`).
    """

    __slots__ = (
        "_choices",
        "_last_content",
        "_start",
        "_strip_usage",
        "_track_gaps",
        "body_bytes",
        "content_events",
        "data_events",
        "first_content",
        "itl_sum",
        "itls",
        "last_event",
    )

    def __init__(
        self,
        start: float,
        *,
        keep_itl: bool = False,
        strip_usage: bool = False,
        track_gaps: bool = True,
        choices: int = 1,
    ) -> None:
        super().__init__()
        self._start = start
        self._choices = max(1, choices)
        self._strip_usage = strip_usage
        self._track_gaps = track_gaps or keep_itl
        self._last_content: float | None = None
        self.first_content: float | None = None
        self.last_event: float | None = None
        self.content_events = 0
        self.data_events = 0
        """Data events other than ``[DONE]``: about one token each in an engine's stream (a
        settlement's estimate when the engine reports no usage)."""
        self.body_bytes = 0
        """The size of a non-streamed body (:meth:`feed_body`)."""
        self.itl_sum = 0.0
        self.itls: list[float] | None = [] if keep_itl else None

    def _payload(self, payload: bytes, now: float) -> bool:
        """Meter an event's data; False if the event must not be forwarded."""
        self.last_event = now
        if payload == DONE or (len(payload) < 16 and payload.strip() == DONE):
            self.done = True
            return True
        self.data_events += 1
        if (self._track_gaps or self.first_content is None) and _CONTENT_HINT.search(payload):
            doc = self._parse(payload)
            if has_content(doc):
                if self.first_content is None:
                    self.first_content = now
                else:
                    gap = now - self._last_content  # type: ignore[operator]
                    self.itl_sum += gap
                    if self.itls is not None:
                        self.itls.append(gap)
                self._last_content = now
                self.content_events += 1
        elif _META_HINT.search(payload):
            doc = self._parse(payload)
        else:
            return True  # nothing else to read (e.g. `"finish_reason":null`)
        if not isinstance(doc, dict):
            if doc is not BAD:
                self._count("bad_json")
            return True
        kind = doc.get("type")
        if kind is not None:
            self._typed(kind, doc)
            return True
        err = doc.get("error")
        if err is not None:
            self.error = error_object(err)
            return True
        choices = doc.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                if isinstance(choice, dict):
                    self._finish(choice.get("finish_reason"))
                else:
                    self._count("bad_json")
        elif choices is not None:
            self._count("bad_json")
        usage = doc.get("usage")
        if usage is None:
            return True
        self._usage(usage)
        # The usage-only event: the one to drop when the router asked for it, not the client.
        return not (self._strip_usage and (choices is None or choices == []))

    def feed_body(self, body: bytes, now: float) -> None:
        """Meter a non-streamed JSON answer that arrived whole at ``now``."""
        self.first_content = self.last_event = now
        self.body_bytes = len(body)
        if self.read_body(body):
            self.content_events = 1

    def figures(self, end: float | None = None) -> StreamFigures:
        """The stream's figures; ``end`` defaults to the last event's arrival."""
        finish = end if end is not None else self.last_event
        return StreamFigures(
            ttft=None if self.first_content is None else self.first_content - self._start,
            e2e=None if finish is None else finish - self._start,
            content_events=self.content_events,
            itl_sum=self.itl_sum,
            itls=self.itls,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            finish_reason=self.finish_reason,
            error=self.error,
            done=self.done,
            choices=self._choices,
        )
