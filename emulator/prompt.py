"""The token ids the prefix cache hashes: a request's prompt and its output.

Tokens follow the shared counting rule (:mod:`turnout.common.tokens`). The cache only needs equal
text to give equal ids within one process, so an id is the token text's own hash (``/tokenize``
has its own stable ids, in :mod:`emulator.surface`). A chat prompt is rendered with a fixed
template whose markers make up the rule's overheads: each message is ``<start> role content
<end> <newline>`` (MESSAGE_OVERHEAD, 4) and the prompt ends with ``<start> assistant``
(REPLY_OVERHEAD, 2), the opening of the reply. So the next turn of a conversation (the same
messages, the reply, a new message) begins with this turn's prompt and reply token for token,
and hits the prefix cache as on a real engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from emulator.api import Api
from turnout.common.tokens import message_text, response_messages, text_tokens

_START, _END, _NEWLINE = "<|start|>", "<|end|>", "\n"


def chat_ids(messages: Iterable[Mapping[str, object]]) -> list[int]:
    """The template-rendered ids of chat ``messages``, ending with the reply's opening."""
    ids: list[int] = []
    for m in messages:
        role = m.get("role")
        ids += [hash(_START), hash(role if isinstance(role, str) else "")]
        ids += map(hash, text_tokens(message_text(m.get("content"))))
        ids += [hash(_END), hash(_NEWLINE)]
    ids += [hash(_START), hash("assistant")]
    return ids


def prompt_ids(doc: Mapping[str, Any], api: Api) -> list[int]:
    """The prompt's ids for a body that passed validation (``messages``, ``prompt``, or a
    Responses API request's ``input`` and ``instructions``, rendered as a chat)."""
    if api == "chat":
        return chat_ids(doc["messages"])
    if api == "responses":
        return chat_ids(response_messages(doc["input"], doc.get("instructions")))
    prompt = doc["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    return [hash(t) for t in text_tokens(prompt)] if isinstance(prompt, str) else list(prompt)


def output_ids(pieces: Sequence[str]) -> list[int]:
    """Ids of the output's token strings (each piece is one token, maybe after a space)."""
    return [hash(p.strip()) for p in pieces]
