"""Before the first request: the target answers, takes the API key and knows the policies.

A replay that cannot succeed stops here with the reason, instead of sending every request
and reporting that none succeeded:

- ``GET /v1/models``, which every OpenAI-compatible target serves, must be answered: a
  connection error stops the replay, and so does a 401 or 403 (a missing or refused key;
  any other status is the target's business). Its list names the model imported traces ask
  for.
- With ``--policy``, ``GET /turnout/policies`` (the router's ``[{name, type, default}]``)
  must list every policy named. A target without that list is not a Turnout router: a plain
  engine has no policies, so ``--policy`` cannot mean anything there. A shadow target may be
  one; it is checked only when it does list policies.

Both are GETs outside the request path: nothing is routed, metered or captured. So are the
reads of :func:`target_terms`: the SLOs goodput is judged by, and what each backend costs.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=10)
_MAX_BODY = 4 << 20
"""Bytes read of an answer: a listing is far smaller, and the target may be hostile."""
_MAX_MESSAGE = 200


class TargetError(Exception):
    """Why a replay cannot start against a target."""


def shown(url: str) -> str:
    """``url`` without user and password, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return parts._replace(netloc=netloc).geturl()


def unknown_policies(asked: Sequence[str], known: Sequence[str]) -> str | None:
    """The message for the names in ``asked`` that ``known`` lacks, or None."""
    unknown = [name for name in asked if name not in known]
    if not unknown:
        return None
    parts = []
    for name in unknown:
        near = difflib.get_close_matches(name, known, n=1)
        parts.append(f"'{name}'" + (f" (did you mean '{near[0]}'?)" if near else ""))
    noun = "policy" if len(unknown) == 1 else "policies"
    return f"unknown {noun} {', '.join(parts)}; known: {', '.join(known) or 'none'}"


async def check_target(
    session: aiohttp.ClientSession,
    target: str,
    policies: Sequence[str],
    *,
    keyed: bool,
    router: bool = True,
) -> tuple[str, ...]:
    """Raise :class:`TargetError` unless ``target`` can take the replay; return its model ids.

    ``policies`` must all be on the target's policy list; with ``router`` false (a shadow
    target) a target without a policy list passes. ``keyed`` says whether an API key is sent.
    """
    base = target.rstrip("/")
    status, doc = await _get(session, base, "/v1/models", keyed)
    models = _models(doc) if status == 200 else ()
    if not policies:
        return models
    status, doc = await _get(session, base, "/turnout/policies", keyed)
    known = _policy_names(doc) if status == 200 else None
    if known is None:
        if not router:
            return models
        raise TargetError(
            f"{shown(target)} lists no policies (GET /turnout/policies answered {status}): it "
            "is not a Turnout router, so --policy has nothing to choose from; replay without "
            "--policy to measure the target as it is"
        )
    why = unknown_policies(policies, known)
    if why is not None:
        raise TargetError(f"{shown(target)}: {why}")
    return models


async def _get(
    session: aiohttp.ClientSession, base: str, path: str, keyed: bool
) -> tuple[int, Any]:
    """Status and JSON document (None if not JSON) of ``GET base+path``; a target that does
    not answer, or refuses the key, is a :class:`TargetError`."""
    try:
        async with session.get(base + path, timeout=PROBE_TIMEOUT) as r:
            status = r.status
            body = await _read(r)
    except TimeoutError:
        timeout = PROBE_TIMEOUT.total
        raise TargetError(
            f"cannot reach {shown(base)}: no answer to GET {path} within {timeout:g} s"
        ) from None
    except (aiohttp.ClientError, OSError) as e:
        raise TargetError(f"cannot reach {shown(base)}: {e or type(e).__name__}") from None
    try:
        doc = None if body is None else orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if status in (401, 403):
        said = _message(doc)
        detail = f"{status}{': ' + said if said else ''}"
        if keyed:
            raise TargetError(f"{shown(base)} refused the API key ({detail})")
        raise TargetError(f"{shown(base)} wants an API key ({detail}): give --api-key KEY")
    return status, doc


async def _read(r: aiohttp.ClientResponse) -> bytes | None:
    """The body, or None past :data:`_MAX_BODY` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in r.content.iter_chunked(65536):
        size += len(chunk)
        if size > _MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _models(doc: Any) -> tuple[str, ...]:
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        return ()
    return tuple(m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str))


def _policy_names(doc: Any) -> tuple[str, ...] | None:
    if not isinstance(doc, list):
        return None
    names = [p.get("name") for p in doc if isinstance(p, dict)]
    return tuple(n for n in names if isinstance(n, str)) if names else None


def _message(doc: Any) -> str:
    """An OpenAI error document's message, shortened; empty if there is none."""
    err = doc.get("error") if isinstance(doc, dict) else None
    said = err.get("message") if isinstance(err, dict) else None
    return said[:_MAX_MESSAGE] if isinstance(said, str) else ""


@dataclass(frozen=True, slots=True)
class Terms:
    """What a Turnout router says its requests are judged by and what its backends cost."""

    slo: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Class -> (TTFT s, TPOT s): the default policy's, the yardstick of every policy."""
    pricing: dict[str, float] = field(default_factory=dict)
    """Backend -> USD an hour (the config's ``pricing``)."""
    note: str | None = None
    """Why the prices could not be read, when they could not."""


async def target_terms(session: aiohttp.ClientSession, target: str, *, keyed: bool) -> Terms:
    """The SLOs of ``/turnout/policies`` and the prices of ``/turnout/backends`` (an admin
    endpoint: without an admin key the prices are not read, and :attr:`Terms.note` says
    so); nothing from a target that is not a Turnout router."""
    base = target.rstrip("/")
    status, doc = await _get(session, base, "/turnout/policies", keyed)
    slo = _slo(doc) if status == 200 else {}
    try:
        status, doc = await _get(session, base, "/turnout/backends", keyed)
    except TargetError as e:  # refused: not an admin
        return Terms(slo, {}, f"no prices from the target ({e}): give --price BACKEND=USD")
    pricing = {}
    for b in doc if status == 200 and isinstance(doc, list) else ():
        name, usd = (b.get("name"), b.get("usd_per_hour")) if isinstance(b, dict) else (0, 0)
        if isinstance(name, str) and isinstance(usd, int | float) and not isinstance(usd, bool):
            pricing[name] = float(usd)
    return Terms(slo, pricing)


def _slo(doc: Any) -> dict[str, tuple[float, float]]:
    """The default policy's SLO table (else the first policy's that has one)."""
    entries = [p for p in doc if isinstance(p, dict)] if isinstance(doc, list) else []
    entries.sort(key=lambda p: p.get("default") is not True)
    for p in entries:
        table = p.get("slo")
        if isinstance(table, dict) and table:
            out = {}
            for cls, t in table.items():
                if isinstance(t, dict) and all(_number(t.get(k)) for k in ("ttft_s", "tpot_s")):
                    out[str(cls)] = (float(t["ttft_s"]), float(t["tpot_s"]))
            return out
    return {}


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == v
