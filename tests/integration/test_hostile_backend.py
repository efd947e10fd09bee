"""A hostile backend (tests/misbehaving.py) in front of a real router process: what it sends
is bounded, checked and cleaned before a client sees it, and what it gets wrong is counted
(issue 12, "a bad backend can hurt the router")."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.misbehaving import INTERNAL_HOST, PAUSE, SECRET
from tests.procs import Process, rss_kb, start_misbehaving
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

TOTAL = 2.0
"""The routers' non_stream_total here (seconds)."""
BODY_LIMIT = 8 << 20
MiB = 1 << 20


@pytest.fixture(scope="module")
def backend() -> Iterator[Process]:
    with start_misbehaving() as proc:
        yield proc


def _config(url: str, names: tuple[str, ...], **overrides: Any) -> dict[str, Any]:
    doc = base_config([(n, "vllm", url) for n in names], **overrides)
    doc["limits"] = {"max_upstream_body_bytes": BODY_LIMIT}
    doc["timeouts"] = {c: {"non_stream_total": TOTAL} for c in ("interactive", "batch")}
    return doc


@pytest.fixture(scope="module")
def router(backend: Process, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    doc = _config(backend.url, ("bad",))
    doc["health"]["failures_to_eject"] = 1000  # these tests look at answers, not ejection
    with start_router(write_config(tmp_path_factory.mktemp("hostile"), doc)) as proc:
        yield proc


def _chat(model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}


def _protocol_errors(router: Process, kind: str) -> float:
    text = get(router.url + "/metrics").text
    pattern = rf'turnout_upstream_protocol_errors_total\{{backend="bad",kind="{kind}"\}} (\S+)'
    found = re.search(pattern, text)
    return float(found[1]) if found else 0.0


def _flooded(backend: Process) -> int:
    """Bytes the misbehaving backend's endless lines got out so far."""
    return int(get(backend.url + "/stats").json()["sent"].get("endless-line", 0))


class _HealthPoller:
    """Asks /health every 20 ms in a thread while a test runs; every answer must be 200."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.statuses: list[int] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.statuses.append(get(self._url + "/health").status)

    def __enter__(self) -> _HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


# -- an SSE event without end ------------------------------------------------------------------


def test_endless_line_ends_the_stream_with_an_error_event(router: Process) -> None:
    before = _protocol_errors(router, "event_too_large")
    client = client_for(router.url)
    stream = client.chat.completions.create(
        model="endless-line",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
    )
    texts = []
    with pytest.raises(openai.APIError, match="SSE event over"):
        for chunk in stream:
            texts.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert texts == ["hi"]  # the whole event before the endless one, and nothing of that one
    assert _protocol_errors(router, "event_too_large") == before + 1


def test_endless_lines_keep_memory_bounded_and_health_answering(
    router: Process, backend: Process
) -> None:
    """50 streams, each trying to send 100 MB without a separator: the router keeps at most
    an event's limit (1 MiB) of each, cuts the backend off, and serves /health meanwhile."""
    sent_before = _flooded(backend)
    rss_before = rss_kb(router.proc.pid)
    peak = rss_before
    with _HealthPoller(router.url) as health, ThreadPoolExecutor(10) as pool:
        replies = pool.map(lambda _: post(router.url + "/v1/chat/completions",
                                          _chat("endless-line", True)), range(50))  # fmt: skip
        for reply in replies:
            peak = max(peak, rss_kb(router.proc.pid))
            assert reply.status == 200
            body = reply.content
            # The first event whole, then the error event and [DONE]; no part of the long one.
            assert body.count(b"data: ") == 3, body[:300]
            assert b'"code":"upstream_protocol_error"' in body
            assert body.endswith(b"data: [DONE]\n\n")
            assert b"xxxx" not in body
    assert health.statuses and set(health.statuses) == {200}
    flooded_mb = (_flooded(backend) - sent_before) / MiB
    assert flooded_mb >= 50, flooded_mb  # what the backend got out before each cut
    growth_mb = (max(peak, rss_kb(router.proc.pid)) - rss_before) / 1024
    assert growth_mb < 30, f"router RSS grew {growth_mb:.0f} MB"


def test_a_stream_cut_mid_event_ends_with_an_error_event_not_the_part(router: Process) -> None:
    reply = post(router.url + "/v1/chat/completions", _chat("cut-mid-event", True))
    assert reply.status == 200
    assert reply.content.count(b"data: ") == 3
    assert b"partial" not in reply.content
    assert b'"code":"upstream_error"' in reply.content


# -- a non-streamed body without end ---------------------------------------------------------


def test_huge_body_gets_a_clean_502(router: Process) -> None:
    before = _protocol_errors(router, "body_too_large")
    rss_before = rss_kb(router.proc.pid)
    reply = post(router.url + "/v1/chat/completions", _chat("huge-body", False))
    assert reply.status == 502
    assert reply.headers["content-type"].startswith("application/json")
    error = reply.json()["error"]
    assert error["code"] == "upstream_body_too_large" and str(BODY_LIMIT) in error["message"]
    assert _protocol_errors(router, "body_too_large") == before + 1
    assert get(router.url + "/health").status == 200
    assert (rss_kb(router.proc.pid) - rss_before) / 1024 < 4 * BODY_LIMIT / MiB


# -- malformed usage and finish fields -------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("mode", ["string-usage", "negative-usage"])
def test_malformed_usage_is_ignored_and_counted(router: Process, mode: str, stream: bool) -> None:
    before = _protocol_errors(router, "bad_usage")
    reply = post(router.url + "/v1/chat/completions", _chat(mode, stream))
    assert reply.status == 200
    if stream:
        assert reply.content.endswith(b"data: [DONE]\n\n")
        assert b'"usage"' not in reply.content  # the router asked for it, and strips it
        assert b"error" not in reply.content
    else:
        assert reply.json()["choices"][0]["message"]["content"] == "hi there"
    assert _protocol_errors(router, "bad_usage") == before + 1
    ok = r'turnout_requests_total\{[^}]*backend="bad"[^}]*code="200"'
    assert re.search(ok, get(router.url + "/metrics").text)


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_without_usage_is_served(router: Process, stream: bool) -> None:
    reply = post(router.url + "/v1/chat/completions", _chat("no-usage", stream))
    assert reply.status == 200
    if stream:
        assert reply.content.endswith(b"data: [DONE]\n\n") and b'"error"' not in reply.content
    else:
        assert reply.json()["usage"] is None


def test_a_finish_reason_that_is_not_utf8_is_ignored_and_counted(router: Process) -> None:
    before = (_protocol_errors(router, "bad_utf8"), _protocol_errors(router, "bad_finish_reason"))
    reply = post(router.url + "/v1/chat/completions", _chat("bad-finish", True))
    assert reply.status == 200
    assert reply.content.endswith(b"data: [DONE]\n\n") and b'"error"' not in reply.content
    after = (_protocol_errors(router, "bad_utf8"), _protocol_errors(router, "bad_finish_reason"))
    assert after == (before[0] + 1, before[1] + 1)


# -- SSE framing -----------------------------------------------------------------------------


def test_mixed_line_endings_are_passed_on_as_they_arrive(router: Process) -> None:
    client = client_for(router.url)
    t0 = time.monotonic()
    stream = client.chat.completions.create(
        model="mixed-endings", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    first: float | None = None
    text = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first if first is not None else time.monotonic() - t0
            text += chunk.choices[0].delta.content
    assert text == "Hello world"
    # The first event (CRLF endings) is not held until the LF-ended rest arrives.
    assert first is not None and first < PAUSE


# -- error bodies ----------------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "status"), [("html-502", 502), ("html-404", 404)])
def test_html_error_pages_become_openai_errors(router: Process, mode: str, status: int) -> None:
    """502: every attempt failed (the handler answers); 404: relayed (not a failover case)."""
    before = _protocol_errors(router, "bad_error_body")
    reply = post(router.url + "/v1/chat/completions", _chat(mode, False))
    assert reply.status == status
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.json()["error"]["message"] == f"backend bad answered {status}"
    for leak in (SECRET, INTERNAL_HOST, "nginx", "<html"):
        assert leak not in reply.text and leak not in str(reply.headers)
    assert _protocol_errors(router, "bad_error_body") == before + 1


# -- headers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_infrastructure_headers_are_not_passed_on(router: Process, stream: bool) -> None:
    reply = post(router.url + "/v1/chat/completions", _chat("leaky-headers", stream))
    assert reply.status == 200
    for name in ("set-cookie", "via", "x-upstream-addr", "x-powered-by", "alt-svc"):
        assert name not in reply.headers
    assert reply.headers["server"] == "turnout"
    assert reply.headers["x-engine-note"] == "kept"  # end-to-end headers still pass
    assert SECRET not in str(reply.headers) and INTERNAL_HOST not in str(reply.headers)


def test_the_server_header_names_no_version(router: Process) -> None:
    replies = [
        get(router.url + "/health"),
        get(router.url + "/no/such/route"),
        post(router.url + "/v1/chat/completions", b"{not json"),
        post(router.url + "/v1/chat/completions", _chat("ok", False)),
        post(router.url + "/v1/chat/completions", _chat("ok", True)),
    ]
    assert [r.status for r in replies] == [200, 404, 400, 200, 200]
    assert {r.headers["server"] for r in replies} == {"turnout"}


# -- a hung backend --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["hang", "hang-after-head"])
def test_a_hung_backend_gets_504_after_the_total(router: Process, mode: str) -> None:
    t0 = time.monotonic()
    reply = post(router.url + "/v1/chat/completions", _chat(mode, False))
    took = time.monotonic() - t0
    assert reply.status == 504
    assert reply.json()["error"]["code"] == "upstream_timeout"
    assert TOTAL * 0.9 < took < TOTAL + 10  # the configured total ended it, nothing else


# -- whose fault -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "stream", "breaker"),
    [
        ("endless-line", True, "open"),
        ("huge-body", False, "open"),
        ("hang-after-head", False, "open"),
        ("html-404", False, "closed"),  # a 4xx is not the backend's failure
    ],
)
def test_what_counts_against_the_backend(
    backend: Process, tmp_path: Path, mode: str, stream: bool, breaker: str
) -> None:
    # Two backends, so that ejecting one stays within the ejection cap; one failure ejects.
    doc = _config(backend.url, ("bad", "spare"), default_policy="bad-only")
    doc["health"].update(failures_to_eject=1, cooldown=60, cooldown_max=60)
    with start_router(write_config(tmp_path, doc)) as proc:
        post(proc.url + "/v1/chat/completions", _chat(mode, stream))
        states = {b["name"]: b["breaker"] for b in get(proc.url + "/turnout/backends").json()}
    assert states == {"bad": breaker, "spare": "closed"}
