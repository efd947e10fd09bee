"""Sessions: rows that form a conversation replay as one, turn after turn.

A turn is sent when the previous turn's answer has arrived (plus the row's ``delay``, the
think time, when it gives one) and not before its own time on the schedule: closed within a
session, timed across sessions, as inference-perf and aiperf replay multi-turn traffic. Its
prompt is the previous turn's prompt, the answer that turn got in this replay, and the new
message:

* a synthesized turn's new message is sized so the whole prompt has the recorded length
  (Mooncake's ``input_length`` counts the whole context); at least one word when the history
  is already longer than that;
* a recorded turn (a capture) keeps the messages it added after the previous turn's
  messages and the assistant's reply; a turn whose messages do not extend the previous
  turn's that way is sent as recorded.

If the previous turn failed, the turn is sent as a first turn. Which rows belong together is
the source's business (:mod:`replay.sources`): ``X-Session-Id`` in captures, ``session_id`` in
Mooncake rows, or a Mooncake row whose ``hash_ids`` extend an earlier row's prompt.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from replay.client import Result, encode_body
from replay.sources import RESPONSES_URL, Item, Synth
from replay.synth import PromptSynth
from turnout.common.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD

Message = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """What the next turn of a session builds on: the last prompt and its answer."""

    messages: tuple[Message, ...]
    """The prompt's messages as sent (empty where a prompt is not written out)."""
    recorded: int
    """How many messages the turn's recorded body had (captures; 0 for synthesized)."""
    prompt_tokens: int
    output_tokens: int
    answer: str = ""


def new_words(synth: Synth, prev: Turn) -> int:
    """Words of a synthesized turn's new message: the whole prompt (history, answer,
    message) is then ``synth.prompt_tokens`` long, or one word when the history is longer."""
    history = prev.prompt_tokens + prev.output_tokens + 2 * MESSAGE_OVERHEAD
    return max(1, synth.prompt_tokens - history)


def new_message(synth: Synth, prev: Turn) -> Synth:
    """The new user message of a synthesized turn, as a one-message prompt to synthesize."""
    return Synth(new_words(synth, prev) + MESSAGE_OVERHEAD + REPLY_OVERHEAD)


def turn_tokens(synth: Synth, prev: Turn) -> int:
    """The prompt size of a synthesized turn after ``prev`` (its recorded size, or more)."""
    return prev.prompt_tokens + prev.output_tokens + 2 * MESSAGE_OVERHEAD + new_words(synth, prev)


def continued(item: Item, prev: Turn, new_text: str = "") -> list[Message] | None:
    """The messages of ``item``'s turn after ``prev``: the history, the answer, the new
    message(s); None when a recorded turn does not extend the previous one (send it as is)."""
    history = [*prev.messages, {"role": "assistant", "content": prev.answer}]
    if item.synth is not None:
        return [*history, {"role": "user", "content": new_text}]
    messages: Sequence[Message] = item.record.body.get("messages") or ()
    if len(messages) <= prev.recorded + 1 or messages[prev.recorded].get("role") != "assistant":
        return None
    return [*history, *messages[prev.recorded + 1 :]]


class Conversations:
    """The live replayer's sessions: each one's last turn, as a future its next turn awaits.

    :meth:`begin` registers the turn before it first waits, so turns queue in the order the
    runner starts them (the schedule's order); :meth:`end` hands the answer on. At most
    ``limit`` sessions are remembered (least recently continued forgotten first).
    """

    def __init__(
        self,
        synth: PromptSynth,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        limit: int = 10_000,
    ) -> None:
        self._synth = synth
        self._sleep = sleep
        self._limit = limit
        self._last: OrderedDict[str, asyncio.Future[Turn | None]] = OrderedDict()

    async def begin(self, item: Item, body: bytes) -> tuple[bytes, Pending | None]:
        """Wait for the session's previous turn; the body to send (the history continued)
        and the handle for :meth:`end`. Items without a session pass straight through."""
        if item.session is None:
            return body, None
        mine: asyncio.Future[Turn | None] = asyncio.get_running_loop().create_future()
        prev_future = self._last.get(item.session)
        self._last[item.session] = mine
        self._last.move_to_end(item.session)
        if len(self._last) > self._limit:
            self._last.popitem(last=False)
        pending = Pending(item.session, mine)
        prev = await prev_future if prev_future is not None else None
        if prev is None:
            return body, pending
        if item.delay:
            await self._sleep(item.delay)
        rec = item.record
        text = ""
        if item.synth is not None:
            text = self._synth.messages(new_message(item.synth, prev), rec.custom_id)[0]["content"]
        messages = continued(item, prev, text)
        if messages is None:
            return body, pending
        doc = orjson.loads(body)
        doc["input" if rec.url == RESPONSES_URL else "messages"] = messages
        return encode_body(doc, rec.url), pending

    def end(self, item: Item, pending: Pending | None, body: bytes, r: Result | None) -> None:
        """The turn is over: its prompt and answer for the next turn (None if it failed)."""
        if pending is None or pending.future.done():
            return
        if r is None or not r.ok:
            pending.future.set_result(None)
            return
        doc = orjson.loads(body)
        pending.future.set_result(
            Turn(
                tuple(_messages(doc, item.record.url)),
                0 if item.synth is not None else len(item.record.body.get("messages") or ()),
                r.prompt_tokens or 0,
                r.output_tokens,
                r.text or "",
            )
        )


def _messages(doc: Mapping[str, Any], url: str) -> list[Message]:
    """A body's message list (a Responses API request's ``input``, when it is a list)."""
    value = doc.get("input" if url == RESPONSES_URL else "messages")
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class Pending:
    """A turn in progress: its session and the future its next turn awaits."""

    session: str
    future: asyncio.Future[Turn | None]
