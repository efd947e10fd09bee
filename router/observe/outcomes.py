"""The outcomes a request can end in, defined once: the ``reason`` of
``turnout_requests_total``, the access log, a trace's ending and the batch pacing's verdict.

:data:`Reason` is the one list (a ``Literal``, so the type checker holds every other module
to it); the sets and tables below are views of it. A fixed set, so the metric label's
cardinality is bounded.
"""

from __future__ import annotations

from typing import Literal, get_args

Reason = Literal[
    "ok",
    "client_closed",
    "auth",
    "quota",
    "overloaded",
    "too_large",
    "invalid",
    "client_timeout",
    "unknown_model",
    "no_backend",
    "internal",
    "upstream_rejected",
    "upstream_error",
    "upstream_unreachable",
    "upstream_timeout",
    "upstream_broken",
    "shutting_down",
]
"""``ok`` (a backend's 2xx answer served whole, the only outcome the latency histograms
observe), the router's own rejections, and what went wrong upstream."""

REQUEST_REASONS: tuple[Reason, ...] = get_args(Reason)

FAILURES: frozenset[Reason] = frozenset(
    {
        "overloaded",
        "no_backend",
        "internal",
        "upstream_error",
        "upstream_unreachable",
        "upstream_timeout",
        "upstream_broken",
    }
)
"""The reasons the service failed a request (the dashboard's error ratio, the availability
alerts, an error span); the others are the client's doing, or a drain."""

ANSWERED: frozenset[Reason] = frozenset({"ok", "client_closed", "upstream_broken"})
"""A backend's 2xx answer had begun: its TTFT is an answer's first token."""

REJECTED: dict[int, Reason] = {
    400: "invalid",
    401: "auth",
    403: "auth",
    404: "unknown_model",
    408: "client_timeout",
    413: "too_large",
    415: "invalid",
    429: "quota",
    503: "no_backend",
}
"""The reason of a rejection the router itself answered, by its status (others: internal)."""

EARLY_REJECTIONS: tuple[tuple[Reason, int], ...] = (
    ("auth", 401), ("invalid", 400), ("invalid", 415), ("client_timeout", 408),
    ("too_large", 413), ("client_closed", 499),
)  # fmt: skip
"""The router's rejections before classification (class ``unknown``), with their statuses."""

LATE_REJECTIONS: tuple[tuple[Reason, int], ...] = (
    ("auth", 403), ("quota", 429), ("overloaded", 429), ("unknown_model", 404),
    ("no_backend", 503), ("internal", 500), ("client_closed", 499),
)  # fmt: skip
"""Those after it (under each class)."""


def answer_reason(status: int) -> Reason:
    """The outcome of an engine's error answer: its own failure (5xx, or 429: busy), or the
    request's fault it saw (any other 4xx)."""
    return "upstream_error" if status >= 500 or status == 429 else "upstream_rejected"
