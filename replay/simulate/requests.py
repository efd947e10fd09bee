"""A trace row as the router and an engine would take it: the policy's ``RequestInfo`` and the
engine's generation request, without sending a byte.

Rows with real prompts go through the router's own classifier and the emulator's own
validation, with the emulator's token ids for its prefix cache. Rows whose prompt is to be
synthesized (imported traces, ``drop``-redacted captures) are not written out as text: the
live replayer sizes such a prompt to the recorded token count under the documented rule,
which both the router and the emulator count by, so the count is used as is, and what the
text would decide (token ids, the router's block chain, the prefix hash) comes from the
prompt's block layout (:mod:`replay.simulate.prompts`).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from emulator.api import Api, ApiError, Generation, check_context, parse_generation
from emulator.profiles import Profile
from emulator.prompt import prompt_ids
from emulator.rank import Sequence
from emulator.server import request_identity
from emulator.text import natural_length, request_rng
from policies.types import Endpoint, RequestInfo
from replay.client import encode_body, request_class
from replay.sessions import Turn, continued, new_words, turn_tokens
from replay.simulate.prompts import NEXT, TAIL, Piece, Prompts, chain, ids
from replay.sources import Item
from replay.synth import salted
from router.config.model import ClassificationSettings
from router.control.classify import choose_class, classify
from router.server.errors import RouterError

ENDPOINTS: Mapping[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}


def engine_api(endpoint: Endpoint) -> Api:
    """The emulator's name for the API an endpoint serves."""
    if endpoint == "chat" or endpoint == "responses":
        return endpoint
    return "completions"


class Refused(Exception):
    """The request is answered with an error before or by an engine (status, message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Routed:
    """One row as the router understands it."""

    item: Item
    info: RequestInfo
    doc: Mapping[str, Any] | None
    """The body with its prompt (None when the prompt is synthesized)."""
    label: str
    """The class label the report files it under before the router answers."""
    tokens: tuple[int, ...] = ()
    """The prompt's token ids for the engine's prefix cache (empty: nothing is shared)."""
    pieces: tuple[Piece, ...] = ()
    """A synthesized prompt's pieces (for the next turn of its session)."""
    sent: Mapping[str, Any] | None = None
    """The body the live replayer sends for a synthesized prompt (its first turn's): the
    engine seeds the answer's length with it, so the simulated engine does too."""


@dataclass(frozen=True, slots=True)
class SimTurn:
    """A session's last turn in simulate: what the live replayer would keep, plus the ids
    and pieces of its prompt and answer."""

    turn: Turn
    tokens: tuple[int, ...]
    pieces: tuple[Piece, ...]


def understand(
    item: Item,
    model: str,
    settings: ClassificationSettings,
    prompts: Prompts,
    prev: SimTurn | None = None,
    *,
    prefix: bool = True,
) -> Routed:
    """What the router's classifier makes of ``item`` (the next turn after ``prev``, if
    given: see :mod:`replay.sessions`); raises :class:`Refused` (400/404). ``prefix``: the
    policy reads the prompt's prefix, so it is hashed (as the router's classifier does)."""
    rec = item.record
    endpoint = ENDPOINTS.get(rec.url)
    if endpoint is None:
        raise Refused(404, f"{rec.url} is not simulated (chat, completions, responses are)")
    header = rec.headers.get("x-request-class")
    session = rec.headers.get("x-session-id")
    synth = item.synth
    if synth is None:
        body = rec.body
        messages = continued(item, prev.turn) if prev is not None else None
        if messages is not None:
            body = {**body, "messages": messages}
        elif prompts.mark and item.session is None:  # a turn's history must match the last's
            body = salted(body, prompts.salt) or body
        try:
            parsed = classify(
                encode_body(body),
                endpoint,
                request_id=rec.custom_id,
                header_class=header,
                key_class=None,
                session_key=session,
                settings=settings,
                prefix=prefix,
            )
        except RouterError as e:
            raise Refused(e.status, e.message) from None
        tokens = tuple(prompt_ids(parsed.doc, engine_api(endpoint)))
        return Routed(item, parsed.info, parsed.doc, request_class(rec), tokens)
    body = rec.body
    budget = body.get("max_completion_tokens", body.get("max_tokens"))
    if prev is None:
        pieces = tuple(prompts.pieces(item, synth))
        tokens = ids(list(pieces)) if synth.hash_ids else ()
        size = synth.prompt_tokens
    else:  # history, answer, new message (replay.sessions)
        new = prompts.fresh(new_words(synth, prev.turn))
        pieces = (*prev.pieces, new)
        tokens = (
            (*prev.tokens, *NEXT, *range(new[0], new[0] + new[1]), *TAIL) if prev.tokens else ()
        )
        size = turn_tokens(synth, prev.turn)
    prefix_hash = zlib.crc32(str(pieces[0][0] if pieces else 0).encode())
    info = RequestInfo(
        request_id=rec.custom_id,
        endpoint=endpoint,
        model=str(body.get("model") or model),
        request_class="interactive",
        stream=bool(body.get("stream", False)),
        prompt_tokens=size,
        max_tokens=budget if isinstance(budget, int) else None,
        session_key=session,
        prefix_hash=prefix_hash if prefix else None,
        prefix_blocks=chain(list(pieces)) if prefix else (),
    )
    try:
        cls = choose_class(info, body, header, None, settings)
    except RouterError as e:
        raise Refused(e.status, e.message) from None
    sent = prompts.synth.body(body, synth, rec.custom_id, rec.url) if prev is None else None
    routed = Routed(item, replace(info, request_class=cls), None, request_class(rec), tokens)
    return replace(routed, pieces=pieces, sent=sent)


def engine_sequence(
    routed: Routed,
    profile: Profile,
    served: str,
    seed: int,
    capacity: int,
    priority: int | None,
    prompts: Prompts,
) -> tuple[Sequence, str, Piece]:
    """The sequence the emulator would schedule for ``routed``, its finish reason and the
    piece its answer makes in a session's next prompt.

    Validation, the output length (forced, or the emulator's natural length seeded by the
    request) and the KV-capacity check are the emulator server's; raises :class:`Refused`.
    """
    info = routed.info
    try:
        if routed.doc is not None:
            doc = dict(routed.doc)
            doc["model"] = served
            if priority is not None:
                doc["priority"] = priority
            gen = parse_generation(doc, api=engine_api(info.endpoint), served=served)
            rng = request_rng(seed, request_identity(doc))
        else:
            body = routed.item.record.body
            gen = Generation(
                api=engine_api(info.endpoint),
                model=served,
                prompt_tokens=info.prompt_tokens,
                max_tokens=info.max_tokens,
                min_tokens=int(body.get("min_tokens") or 0),
                ignore_eos=bool(body.get("ignore_eos")),
                stream=info.stream,
                include_usage=True,
                priority=priority or 0,
            )
            sent = routed.sent
            if sent is None:  # a later turn: its history is not written out
                rng = request_rng(seed, info.request_id.encode())
            else:  # the body as the engine gets it (the router's model name and priority)
                doc = {**sent, "model": served}
                if priority is not None:
                    doc["priority"] = priority
                rng = request_rng(seed, request_identity(doc))
        cap = check_context(gen.prompt_tokens, gen.max_tokens, profile.max_model_len)
    except ApiError as e:
        raise Refused(e.status, e.message) from None
    length = cap if gen.ignore_eos else natural_length(rng, profile.natural_output_tokens)
    length = max(min(length, cap), gen.min_tokens, 1)
    if gen.prompt_tokens + length > capacity:
        raise Refused(400, f"needs {gen.prompt_tokens + length} tokens of KV cache")
    reply = prompts.fresh(length)
    tokens = (*routed.tokens, *range(reply[0], reply[0] + length)) if routed.tokens else ()
    seq = Sequence(
        gen.prompt_tokens,
        length,
        gen.priority,
        rng=random.Random(rng.getrandbits(64)),
        tokens=tokens,
    )
    return seq, "length" if length >= cap else "stop", reply
