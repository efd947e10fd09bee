"""What a backend may make the router pass on or hold: response headers, error bodies, the
limits' and the non-streamed total's config (the real-process attacks are in
tests/integration/test_hostile_backend.py)."""

from __future__ import annotations

import logging

import orjson
import pytest
from multidict import CIMultiDict

from router.config.model import ClassTimeouts, ConfigError, LimitSettings
from router.config.parse import parse_config
from router.proxy.headers import downstream_headers
from router.proxy.upstream import replacement_error

SECRET = "hunter2"


def test_infrastructure_headers_are_dropped() -> None:
    upstream = CIMultiDict(
        [
            ("Content-Type", "application/json"),
            ("Set-Cookie", f"a={SECRET}"),
            ("Set-Cookie", "b=2"),
            ("Server", "nginx/1.25.3"),
            ("Via", "1.1 proxy.internal"),
            ("X-Powered-By", "Express"),
            ("Alt-Svc", 'h3=":443"'),
            ("WWW-Authenticate", "Bearer"),
            ("X-Upstream-Addr", "10.0.0.7:8000"),
            ("x-envoy-upstream-service-time", "12"),
            ("X-Forwarded-For", "10.0.0.1"),
            ("Connection", "X-Hop"),
            ("X-Hop", "1"),
            ("Retry-After", "3"),
            ("OpenAI-Processing-Ms", "40"),
        ]
    )
    out = downstream_headers(upstream, {"X-Request-Id": "rid"})
    assert dict(out) == {
        "Content-Type": "application/json",
        "Retry-After": "3",
        "OpenAI-Processing-Ms": "40",
        "X-Request-Id": "rid",
    }


def test_an_openai_error_body_is_passed_on() -> None:
    body = orjson.dumps({"error": {"message": "bad max_tokens", "type": "x", "code": 400}})
    assert replacement_error(400, body, "b") is None


@pytest.mark.parametrize(
    "doc",
    [
        {"object": "error", "message": "too long", "type": "BadRequestError", "code": 400},
        {"error": "too long", "error_type": "validation"},
    ],
)
def test_engine_json_errors_of_other_shapes_keep_their_message(doc: object) -> None:
    fault = replacement_error(400, orjson.dumps(doc), "b")
    assert fault is not None
    assert (fault.status, fault.message, fault.kind, fault.failed) == (400, "too long", None, False)


def test_an_html_error_page_is_replaced_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    page = f"<html><body>db.internal:5432 password={SECRET}</body></html>".encode()
    with caplog.at_level(logging.WARNING, logger="router"):
        fault = replacement_error(502, page + b"x" * 10_000, "engine-3")
    assert fault is not None
    assert (fault.status, fault.code, fault.kind) == (502, "upstream_error", "bad_error_body")
    assert fault.message == "backend engine-3 answered 502"
    assert SECRET not in fault.message
    (record,) = caplog.records
    assert (
        "engine-3" in record.getMessage() and f"{len(page) + 10_000} bytes" in record.getMessage()
    )
    assert SECRET not in record.getMessage() and "db.internal" not in record.getMessage()


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b'{"message": "not an engine error"}'])
def test_anything_else_gets_the_generic_error(body: bytes) -> None:
    fault = replacement_error(503, body, "b")
    assert fault is not None and fault.message == "backend b answered 503"
    assert fault.kind == (None if not body else "bad_error_body")


@pytest.mark.parametrize(
    ("timeouts", "stream", "deadline"),
    [
        (ClassTimeouts(), True, None),
        (ClassTimeouts(), False, 600.0),
        (ClassTimeouts(total=30.0), False, 30.0),
        (ClassTimeouts(total=900.0), False, 600.0),
        (ClassTimeouts(total=900.0), True, 900.0),
        (ClassTimeouts(non_stream_total=None), False, None),
    ],
)
def test_non_streamed_requests_have_a_total_by_default(
    timeouts: ClassTimeouts, stream: bool, deadline: float | None
) -> None:
    assert timeouts.deadline(stream) == deadline


def _doc(**sections: object) -> dict[str, object]:
    return {
        "backends": [{"name": "b", "engine": "vllm", "url": "http://127.0.0.1:9"}],
        "policies": {"p": {"type": "round-robin"}},
        "default_policy": "p",
        **sections,
    }


def test_upstream_limits_and_total_are_configurable() -> None:
    config = parse_config(
        _doc(
            limits={"max_upstream_event_bytes": 4096, "max_upstream_body_bytes": 1 << 30},
            timeouts={"batch": {"non_stream_total": None}, "interactive": {"non_stream_total": 5}},
        )
    )
    assert (config.limits.max_upstream_event_bytes, config.limits.max_upstream_body_bytes) == (
        4096,
        1 << 30,
    )
    assert config.timeouts_for("batch").deadline(False) is None
    assert config.timeouts_for("interactive").deadline(False) == 5.0
    defaults = parse_config(_doc()).limits
    assert defaults == LimitSettings()
    assert (defaults.max_upstream_event_bytes, defaults.max_upstream_body_bytes) == (
        1 << 20,
        64 << 20,
    )


def test_upstream_limits_are_checked() -> None:
    bad = _doc(
        limits={"max_upstream_event_bytes": 10, "max_upstream_body_bytes": "big"},
        timeouts={"interactive": {"non_stream_total": -1}},
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(bad)
    paths = {path for path, _ in caught.value.errors}
    assert paths == {
        "limits.max_upstream_event_bytes",
        "limits.max_upstream_body_bytes",
        "timeouts.interactive.non_stream_total",
    }
