"""The capture record: one request per JSONL line, shared by the router and the replayer.

A line's first four keys (``custom_id``, ``method``, ``url``, ``body``) form an OpenAI Batch
input line, so a capture doubles as a Batch / ``vllm run-batch`` file. The rest says when the
request arrived (``t_offset_ms`` from a monotonic clock relative to the capture's start, ``ts``
wall clock), which headers it carried (allow-listed), how it was routed, what came back and how
long it took. Replay results use the same schema, joined to the capture by ``custom_id``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

SCHEMA_VERSION = 1


class CaptureFormatError(ValueError):
    """A line that is not a valid capture record."""


@dataclass(frozen=True, slots=True)
class Route:
    """How the router handled the request."""

    policy: str | None = None
    request_class: str | None = None
    backend: str | None = None
    failovers: int = 0
    tenant: str | None = None
    """The client's API key as a keyed hash (router captures with API keys only)."""
    prefill_backend: str | None = None
    """The prefill engine of a disaggregated (``pd``) request; ``backend`` decoded it."""


@dataclass(frozen=True, slots=True)
class Response:
    """What the client got back."""

    status: int | None = None
    stream: bool = False
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: Mapping[str, object] | None = None
    cached_tokens: int | None = None
    """Prompt tokens the engine found cached (``usage.prompt_tokens_details``), if told."""


@dataclass(frozen=True, slots=True)
class Observed:
    """Latencies in milliseconds; ``send_lag_ms`` only in replay results."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    send_lag_ms: float | None = None
    itl_ms: tuple[float, ...] | None = None
    """Gaps between content chunks (replay results only, as vLLM's detailed results)."""


@dataclass(frozen=True, slots=True)
class CaptureRecord:
    """One captured (or replayed) request."""

    custom_id: str
    url: str
    body: Mapping[str, Any]
    method: str = "POST"
    t_offset_ms: float | None = None
    ts: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    route: Route | None = None
    resp: Response | None = None
    obs: Observed | None = None


def iso_utc(wall: float) -> str:
    """``time.time()`` as the capture's ``ts`` string (UTC, microseconds, ``Z``)."""
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def record_to_dict(rec: CaptureRecord) -> dict[str, Any]:
    """The record as the JSON object of one capture line (keys in schema order)."""
    doc: dict[str, Any] = {
        "custom_id": rec.custom_id,
        "method": rec.method,
        "url": rec.url,
        "body": rec.body,
        "v": SCHEMA_VERSION,
        "t_offset_ms": _round(rec.t_offset_ms),
        "ts": rec.ts,
        "headers": dict(rec.headers),
    }
    if rec.route is not None:
        r = rec.route
        doc["route"] = {
            "policy": r.policy,
            "class": r.request_class,
            "backend": r.backend,
            "failovers": r.failovers,
        }
        if r.tenant is not None:
            doc["route"]["tenant"] = r.tenant
        if r.prefill_backend is not None:
            doc["route"]["prefill_backend"] = r.prefill_backend
    if rec.resp is not None:
        s = rec.resp
        usage: dict[str, Any] = {
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
        }
        if s.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": s.cached_tokens}
        doc["resp"] = {
            "status": s.status,
            "stream": s.stream,
            "finish_reason": s.finish_reason,
            "usage": usage,
            "error": None if s.error is None else dict(s.error),
        }
    if rec.obs is not None:
        o = rec.obs
        obs: dict[str, Any] = {
            "ttft_ms": _round(o.ttft_ms),
            "tpot_ms": _round(o.tpot_ms),
            "e2e_ms": _round(o.e2e_ms),
        }
        if o.send_lag_ms is not None:
            obs["send_lag_ms"] = _round(o.send_lag_ms)
        if o.itl_ms is not None:
            obs["itl_ms"] = [round(x, 3) for x in o.itl_ms]
        doc["obs"] = obs
    return doc


def dump_line(rec: CaptureRecord) -> bytes:
    """One capture line, newline included."""
    return orjson.dumps(record_to_dict(rec), option=orjson.OPT_APPEND_NEWLINE)


def _opt(doc: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    """``doc[key]`` if absent/null or of ``kind`` (a JSON bool is never a number)."""
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, kind):
        raise CaptureFormatError(f"{key}: unexpected {type(v).__name__} {v!r}")
    return v


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    v = doc.get(key)
    if v is None:
        return None
    if not isinstance(v, dict):
        raise CaptureFormatError(f"{key}: expected an object")
    return v


def _itls(obs: Mapping[str, Any]) -> tuple[float, ...] | None:
    v = _opt(obs, "itl_ms", list)
    if v is None:
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise CaptureFormatError("obs.itl_ms: expected a list of numbers")
    return tuple(float(x) for x in v)


def record_from_dict(doc: Mapping[str, Any]) -> CaptureRecord:
    """Parse one capture line's object; raises :class:`CaptureFormatError`.

    A line without ``v`` is a plain OpenAI Batch input line and reads as version 1; a newer
    version is refused rather than half-read (its fields may mean something else).
    """
    version = doc.get("v", SCHEMA_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CaptureFormatError("v: expected a positive integer schema version")
    if version > SCHEMA_VERSION:
        raise CaptureFormatError(
            f"v: capture schema version {version} is newer than this build reads "
            f"({SCHEMA_VERSION}); upgrade turnout to read it"
        )
    custom_id = doc.get("custom_id")
    url = doc.get("url")
    body = doc.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        raise CaptureFormatError("custom_id: expected a non-empty string")
    if not isinstance(url, str) or not url.startswith("/"):
        raise CaptureFormatError("url: expected a path such as /v1/chat/completions")
    if not isinstance(body, dict):
        raise CaptureFormatError("body: expected an object")
    headers = _opt(doc, "headers", dict) or {}
    route = resp = obs = None
    if (r := _section(doc, "route")) is not None:
        route = Route(
            policy=_opt(r, "policy", str),
            request_class=_opt(r, "class", str),
            backend=_opt(r, "backend", str),
            failovers=_opt(r, "failovers", int) or 0,
            tenant=_opt(r, "tenant", str),
            prefill_backend=_opt(r, "prefill_backend", str),
        )
    if (s := _section(doc, "resp")) is not None:
        usage = _section(s, "usage") or {}
        details = _section(usage, "prompt_tokens_details") or {}
        resp = Response(
            status=_opt(s, "status", int),
            stream=bool(s.get("stream")),
            finish_reason=_opt(s, "finish_reason", str),
            prompt_tokens=_opt(usage, "prompt_tokens", int),
            completion_tokens=_opt(usage, "completion_tokens", int),
            error=_section(s, "error"),
            cached_tokens=_opt(details, "cached_tokens", int),
        )
    if (o := _section(doc, "obs")) is not None:
        num = (int, float)
        obs = Observed(
            ttft_ms=_opt(o, "ttft_ms", num),
            tpot_ms=_opt(o, "tpot_ms", num),
            e2e_ms=_opt(o, "e2e_ms", num),
            send_lag_ms=_opt(o, "send_lag_ms", num),
            itl_ms=_itls(o),
        )
    return CaptureRecord(
        custom_id=custom_id,
        url=url,
        body=body,
        method=_opt(doc, "method", str) or "POST",
        t_offset_ms=_opt(doc, "t_offset_ms", (int, float)),
        ts=_opt(doc, "ts", str),
        headers={str(k).lower(): str(v) for k, v in headers.items()},
        route=route,
        resp=resp,
        obs=obs,
    )


def parse_line(line: bytes | str) -> CaptureRecord:
    """Parse one capture line; raises :class:`CaptureFormatError`."""
    try:
        doc = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise CaptureFormatError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise CaptureFormatError("expected a JSON object")
    return record_from_dict(doc)
