"""Errors the router itself returns, in OpenAI's JSON shape.

Every rejection (bad input, unknown model, auth, size, upstream trouble) goes out as
``{"error": {"message", "type", "param", "code"}}`` so that OpenAI clients raise their usual
exception classes (``BadRequestError``, ``NotFoundError``, ``APIStatusError`` ...).
"""

from __future__ import annotations

import orjson
from aiohttp import web

from router.server.answer import Answer

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


SERVER = "turnout"
"""The router's ``Server`` header: no versions (aiohttp's default names its and Python's)."""


class RouterError(Exception):
    """A request the router refuses or cannot serve; rendered by :func:`error_response`.

    A plain exception, not a frozen dataclass: the runtime sets attributes on exceptions
    (``__notes__``, ``__traceback__``) as they travel.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}
        """Sent with the error (e.g. ``Retry-After`` on a 429)."""


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> bytes:
    """The OpenAI error document for ``status`` as bytes."""
    err = {
        "message": message,
        "type": _TYPES.get(status, "server_error"),
        "param": param,
        "code": code,
    }
    return orjson.dumps({"error": err})


def error_answer(exc: RouterError, headers: dict[str, str] | None = None) -> Answer:
    """``exc`` as OpenAI error JSON (with its own headers, after ``headers``)."""
    return Answer(
        exc.status,
        {**(headers or {}), **exc.headers, "Content-Type": "application/json"},
        error_body(exc.status, exc.message, exc.param, exc.code),
    )


def error_response(exc: RouterError, headers: dict[str, str] | None = None) -> web.Response:
    """:func:`error_answer` as an aiohttp response."""
    return error_answer(exc, headers).response()


def sse_error_event(message: str, code: str = "upstream_error", status: int = 502) -> bytes:
    """The SSE event that ends a stream broken after bytes reached the client (by the
    upstream, or by the drain's deadline: ``status`` 503), then ``data: [DONE]``."""
    kind = _TYPES.get(status, "server_error")
    doc = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"data: " + orjson.dumps(doc) + b"\n\ndata: [DONE]\n\n"
