"""Send one request with aiohttp and measure it with the shared SSE meter.

Definitions follow vLLM's serving benchmark (see :mod:`turnout.common.sse`): TTFT from the send to
the first content chunk, ITL between content chunks, E2E to the last byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from replay.sources import RESPONSES_URL
from turnout.common.capture import CaptureRecord
from turnout.common.figures import per_token
from turnout.common.sse import StreamMeter

DEFAULT_CLASS = "default"


@dataclass(slots=True)
class Result:
    """What one replayed request saw. Times in seconds."""

    custom_id: str
    request_class: str
    status: int
    stream: bool
    lag: float | None
    backend: str | None = None
    policy: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    itls: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: Mapping[str, object] | None = None
    text: str | None = None
    choices: int = 1
    """The request's ``n``: the output tokens cover every choice."""
    attempts: int | None = None
    """Backends the router tried (``X-Turnout-Attempts``); None from other targets."""
    cached_tokens: int | None = None
    """Prompt tokens the engine found in its prefix cache, as its usage reports them."""

    @property
    def ok(self) -> bool:
        """Successful as vLLM's benchmark counts it: HTTP 200, no error event, some output."""
        return self.status == 200 and self.error is None and self.ttft is not None

    @property
    def output_tokens(self) -> int:
        """Output tokens from the usage report, else the number of content chunks."""
        return self.completion_tokens if self.completion_tokens is not None else len(self.itls) + 1

    @property
    def tpot(self) -> float | None:
        """``(e2e - ttft) / (output tokens a choice - 1)``; None with fewer than two tokens.

        Also None for a non-streamed answer: its first byte is its last, so the formula
        would give 0 and drag every TPOT mean down.
        """
        if not self.stream:
            return None
        return per_token(self.ttft, self.e2e, self.output_tokens, self.choices)


def request_class(rec: CaptureRecord) -> str:
    """The class a request was recorded with (header, then route), else ``default``."""
    cls = rec.headers.get("x-request-class")
    if cls:
        return cls
    if rec.route is not None and rec.route.request_class:
        return rec.route.request_class
    return DEFAULT_CLASS


def encode_body(body: Mapping[str, Any], url: str = "") -> bytes:
    """The JSON to send; streamed requests ask for usage so output tokens are counted (the
    Responses API's streams always end with it, and take no such option)."""
    if body.get("stream") is True and url != RESPONSES_URL:
        opts = body.get("stream_options")
        if not (isinstance(opts, dict) and opts.get("include_usage")):
            body = {**body, "stream_options": {**(opts or {}), "include_usage": True}}
    return orjson.dumps(body)


def _stream_text(raw: bytes) -> str:
    """The generated text of a whole SSE stream (for agreement checks only, not the hot path)."""
    out: list[str] = []
    for event in raw.split(b"\n\n"):
        i = event.find(b"data:")
        payload = event[i + 5 :].strip() if i >= 0 else b""
        if not payload.startswith(b"{"):
            continue
        try:
            doc = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        out.append(_choice_text(doc))
    return "".join(out)


def _choice_text(doc: Any) -> str:
    """The generated text of a chat or completions chunk or answer, of a Responses API text
    delta, or of a whole response."""
    if isinstance(doc, dict) and doc.get("type") == "response.output_text.delta":
        delta = doc.get("delta")
        return delta if isinstance(delta, str) else ""
    if isinstance(doc, dict) and doc.get("object") == "response":
        return "".join(
            p.get("text") or ""
            for item in doc.get("output") or ()
            if isinstance(item, dict) and item.get("type") == "message"
            for p in item.get("content") or ()
            if isinstance(p, dict) and p.get("type") == "output_text"
        )
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict)):
        return ""
    c = choices[0]
    for holder in (c.get("delta"), c.get("message"), c):
        if isinstance(holder, dict):
            for key in ("content", "text"):
                v = holder.get(key)
                if isinstance(v, str):
                    return v
    return ""


class TargetClient:
    """Sends requests to one target; ``policy`` goes out as ``X-Turnout-Policy``."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: str,
        *,
        policy: str | None,
        clock: Callable[[], float],
    ) -> None:
        self._session = session
        self._base = target.rstrip("/")
        self._policy = policy
        self._clock = clock

    async def send(
        self, rec: CaptureRecord, body: bytes, lag: float | None, *, keep_text: bool = False
    ) -> Result:
        """Send ``body`` as ``rec``'s request; never raises for HTTP or network trouble."""
        headers = {"content-type": "application/json", "x-request-id": rec.custom_id}
        cls = rec.headers.get("x-request-class")
        if cls:
            headers["x-request-class"] = cls
        policy = self._policy or rec.headers.get("x-turnout-policy")
        if policy:  # --policy wins; otherwise the policy the client itself asked for
            headers["x-turnout-policy"] = policy
        res = Result(rec.custom_id, request_class(rec), 0, False, lag, policy=self._policy)
        n = rec.body.get("n")
        res.choices = n if type(n) is int and n > 1 else 1
        start = self._clock()
        meter = StreamMeter(start, keep_itl=True, choices=res.choices)
        raw: list[bytes] | None = [] if keep_text else None
        try:
            async with self._session.post(self._base + rec.url, data=body, headers=headers) as r:
                res.status = r.status
                res.backend = r.headers.get("x-turnout-backend")
                res.request_class = r.headers.get("x-turnout-class") or res.request_class
                res.policy = r.headers.get("x-turnout-policy") or self._policy
                res.attempts = _count(r.headers.get("x-turnout-attempts"))
                res.stream = r.content_type == "text/event-stream"
                if res.stream:
                    async for chunk in r.content.iter_any():
                        meter.feed(chunk, self._clock())
                        if raw is not None:
                            raw.append(chunk)
                else:
                    data = await r.read()
                    meter.feed_body(data, self._clock())
                    if raw is not None:
                        raw.append(data)
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            res.error = {"message": str(e) or type(e).__name__, "type": "connection_error"}
        fig = meter.figures()
        if res.status == 200:
            res.ttft = fig.ttft
        elif res.error is None:
            res.error = fig.error or {"message": f"HTTP {res.status}", "type": "http_error"}
        res.e2e = fig.e2e if fig.e2e is not None else self._clock() - start
        res.itls = fig.itls or []
        res.prompt_tokens = fig.prompt_tokens
        res.completion_tokens = fig.completion_tokens
        res.cached_tokens = fig.cached_tokens
        res.finish_reason = fig.finish_reason
        if res.error is None and fig.error is not None:
            res.error = fig.error
        if raw is not None:
            joined = b"".join(raw)
            res.text = _stream_text(joined) if res.stream else _choice_text(_loads(joined))
        return res


def _count(text: str | None) -> int | None:
    """A header's small whole number, or None (absent, or not one)."""
    ok = text is not None and text.isascii() and text.isdigit() and len(text) < 6
    return int(text) if ok and text is not None else None


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
