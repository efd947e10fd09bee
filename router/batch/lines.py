"""How a batch line enters the request path: in-process, as a client of its own.

A batch line is a client request like any other: it goes through the one request path
(router.proxy.handler: classify, admit, policy, failover, metrics, capture), called directly
by the executor of the process that took the line. :class:`LineRequest` is the line as that
path's :class:`router.server.answer.Client`: it holds the line's body and collects the answer,
so nothing listens for lines, nothing but the executor can send one, and lines use none of
the public site's connections. The tenant a line runs as (the batch's creator) is named by
its id and looked up among the configured keys as the line starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from policies.types import Endpoint
from router.config.model import LimitSettings
from router.proxy.handler import PATHS, RunAs, handle
from router.proxy.state import RouterState
from router.server.answer import Answer, FlowControl
from router.server.errors import RouterError, error_answer
from router.server.site import too_large

KEYLESS = "key-"
"""Marks the owner id of a caller of a router that knows no key (router.batch.api): its lines
run as anonymous traffic, as its requests do."""
_ENDPOINTS: dict[str, Endpoint] = {path: endpoint for endpoint, path in PATHS.items()}


@dataclass(frozen=True, slots=True)
class Reply:
    """The router's answer to one line."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class _Collected:
    """A streamed answer's body (router.server.answer.Chunks), kept up to ``limit`` bytes.

    A line never asks for a stream (router.batch.validate), but a backend may send one all
    the same: past the bound the rest is dropped, and the line is answered 502 as an
    oversized non-streamed answer is.
    """

    __slots__ = ("body", "limit", "over")

    def __init__(self, limit: int) -> None:
        self.body = bytearray()
        self.limit = limit
        self.over = False

    def write(self, data: bytes) -> None:
        if self.over or len(self.body) + len(data) > self.limit:
            self.over = True
            return
        self.body += data

    async def end(self) -> None:
        return None


class LineRequest:
    """One line as the request path's :class:`router.server.answer.Client`."""

    __slots__ = ("_body", "_limit", "_out", "flow", "headers", "path", "sent", "status")

    method = "POST"

    def __init__(self, path: str, headers: Mapping[str, str], body: bytes, limit: int) -> None:
        """``limit``: the most bytes of a streamed answer kept (the upstream body bound)."""
        self.path = path
        self.headers = CIMultiDictProxy(CIMultiDict(headers))
        self._body = body
        self._limit = limit
        self.flow = FlowControl()
        """Never paused: the answer is collected as it arrives."""
        self._out: _Collected | None = None
        self.status = 0
        self.sent: Mapping[str, str] = {}

    async def body(self, limit: int, limits: LimitSettings) -> bytes:
        if len(self._body) > limit:
            raise too_large(limit)
        return self._body

    async def start(self, status: int, headers: Mapping[str, str]) -> _Collected:
        self.status, self.sent = status, headers
        self._out = _Collected(self._limit)
        return self._out

    def reply(self, answer: Answer | None) -> Reply:
        """The line's answer: ``answer``, or the stream collected when it is None."""
        if answer is None:
            out = self._out
            assert out is not None  # the request path streamed, so it started the answer
            if not out.over:
                return Reply(self.status, self.sent, bytes(out.body))
            message = f"the backend's streamed answer exceeds {out.limit} bytes"
            fault = RouterError(502, message, code="upstream_body_too_large")
            answer = error_answer(fault, {"X-Request-Id": self.sent.get("X-Request-Id", "")})
        return Reply(answer.status, answer.headers, answer.body)


async def run_line(
    state: RouterState, owner: str, path: str, headers: Mapping[str, str], body: bytes
) -> Reply:
    """Send one line of ``owner``'s batch to ``path`` through the request path, as that
    tenant (401 when its key is no longer configured)."""
    keyed = owner and not owner.startswith(KEYLESS)
    tenant = state.gate.tenant(owner) if keyed else None
    if keyed and tenant is None:
        message = "the API key that created this batch is no longer configured"
        refused = error_answer(RouterError(401, message, code="invalid_api_key"), {})
        return Reply(refused.status, refused.headers, refused.body)
    request = LineRequest(path, headers, body, state.config.limits.max_upstream_body_bytes)
    # The path is the batch's endpoint, one of the request path's (router.batch.validate).
    return request.reply(await handle(request, state, _ENDPOINTS[path], RunAs(tenant)))
