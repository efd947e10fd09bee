"""Disaggregated serving over HTTP: vLLM's ``kv_transfer_params`` both ways, and the pull.

A request's ``kv_transfer_params`` (vLLM's NIXL connector protocol) is read by
:func:`parse_params`. A prefill engine given ``do_remote_decode`` answers with the params a
decode engine needs (:func:`answer_params`: ``do_remote_prefill``, the engine id, the
transfer's id as ``remote_request_id``, the block ids, and where to pull from). A decode
engine given ``do_remote_prefill`` pulls with :func:`pull`: where vLLM reads the blocks over
NIXL after a side-channel handshake at ``remote_host:remote_port``, the emulator asks the
prefill emulator's ``POST /kv_transfer/pull`` on that address (its HTTP port) to hand the
blocks over, and models the transfer's duration itself (:mod:`emulator.kvtransfer`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from emulator.api import ApiError
from emulator.profiles import Profile

PULL_PATH = "/kv_transfer/pull"
_PULL_SECONDS = 5.0  # a prefill engine that does not answer the pull: prefill locally
_PULL_MAX_BODY = 4096


@dataclass(frozen=True, slots=True)
class Params:
    """What a request's ``kv_transfer_params`` ask of this engine."""

    remote_decode: bool
    remote_prefill: bool
    engine_id: str | None = None
    transfer_id: str | None = None
    host: str | None = None
    port: int | None = None


def _field(params: dict[str, Any], key: str, kind: type) -> Any:
    value = params.get(key)
    wrong = not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)
    if value is not None and wrong:
        raise ApiError(400, f"`kv_transfer_params.{key}` has the wrong type.", "kv_transfer_params")
    return value


def parse_params(doc: dict[str, Any]) -> Params | None:
    """The body's ``kv_transfer_params`` (None when absent or null); 400 when malformed."""
    raw = doc.get("kv_transfer_params")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError(400, "`kv_transfer_params` must be an object.", "kv_transfer_params")
    return Params(
        remote_decode=bool(_field(raw, "do_remote_decode", bool)),
        remote_prefill=bool(_field(raw, "do_remote_prefill", bool)),
        engine_id=_field(raw, "remote_engine_id", str),
        transfer_id=_field(raw, "remote_request_id", str),
        host=_field(raw, "remote_host", str),
        port=_field(raw, "remote_port", int),
    )


def answer_params(
    profile: Profile, engine_id: str, transfer_id: str, prompt_tokens: int, where: tuple[str, int]
) -> dict[str, object]:
    """The ``kv_transfer_params`` a prefill engine answers with (vLLM's NIXL connector's
    keys). Block ids are the emulator's own numbering: it tracks counts, not block ids."""
    blocks = -(-prompt_tokens // profile.kv_block_size)
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": list(range(blocks)),
        "remote_engine_id": engine_id,
        "remote_request_id": transfer_id,
        "remote_host": where[0],
        "remote_port": where[1],
        "tp_size": 1,
    }


async def pull(session: aiohttp.ClientSession, params: Params) -> int | None:
    """Ask the prefill engine ``params`` names for its held blocks; the prompt tokens they
    hold, or None when it has none (expired, unknown) or cannot be reached."""
    if params.host is None or params.port is None or params.transfer_id is None:
        return None
    host = f"[{params.host}]" if ":" in params.host else params.host
    body = {"remote_engine_id": params.engine_id, "remote_request_id": params.transfer_id}
    try:
        async with asyncio.timeout(_PULL_SECONDS):
            async with session.post(
                f"http://{host}:{params.port}{PULL_PATH}", data=orjson.dumps(body)
            ) as resp:
                raw = await resp.content.read(_PULL_MAX_BODY)
                if resp.status != 200:
                    return None
        tokens = orjson.loads(raw).get("prompt_tokens")
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, AttributeError):
        return None
    return tokens if isinstance(tokens, int) and tokens > 0 else None
