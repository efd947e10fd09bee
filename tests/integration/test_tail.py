"""First-token deadlines and hedged requests over loopback, with real router and emulators.

Backend ``a`` stalls every request's first content token (its headers and role chunk come at
once); ``b`` answers at once. The interactive class ranks ``a`` first.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Process, metric, start_emulator
from tests.router.harness import base_config, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
STALL = 3.0  # seconds a's first content token waits (time scale 1)


def _stalling(stall: float = STALL) -> list[str]:
    """Emulator flags: every request's first content token ``stall`` seconds late."""
    rate, late = "faults.first_token_stall_rate=1", f"faults.first_token_stall={stall}"
    return ["--set", rate, "--set", late]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Process, Process]]:
    with start_emulator("vllm", args=_stalling()) as a, start_emulator("vllm") as b:
        yield a, b


def _config(a: Process, b: Process, tail: dict[str, Any], **more: Any) -> dict[str, Any]:
    doc = base_config([("a", "vllm", a.url), ("b", "vllm", b.url)], **more)
    doc["tail"] = {"interactive": tail}
    return doc


@pytest.fixture
def router_with(tmp_path: Path, engines: tuple[Process, Process]) -> Iterator[Any]:
    routers: list[Any] = []

    def start(tail: dict[str, Any], **more: Any) -> Process:
        cm = start_router(write_config(tmp_path, _config(*engines, tail, **more)))
        routers.append(cm)
        return cm.__enter__()

    yield start
    for cm in reversed(routers):
        cm.__exit__(None, None, None)


def _body(max_tokens: int = 12) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about stragglers."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _running(emu: Process) -> float:
    return metric(emu.url, "vllm:num_requests_running")


def _same_bytes(via_router: bytes, direct: bytes) -> None:
    """Byte for byte, but for the second in ``created``."""
    strip = re.compile(rb'"created":\d+')
    assert strip.sub(b"", via_router) == strip.sub(b"", direct)


def _direct(emu: Process, rid: str, max_tokens: int = 12) -> bytes:
    reply = post(emu.url + "/v1/chat/completions", _body(max_tokens), {"X-Request-Id": rid})
    assert reply.status == 200
    return reply.content


def test_a_stall_after_the_headers_fails_over_with_nothing_sent_twice(
    router_with: Any, engines: tuple[Process, Process]
) -> None:
    a, b = engines
    router = router_with({"first_token_timeout": 0.5})
    start = time.monotonic()
    reply = post(router.url + "/v1/chat/completions", _body(), {"X-Request-Id": "ftd-1"})
    took = time.monotonic() - start
    assert reply.status == 200 and reply.headers["x-turnout-backend"] == "b"
    assert reply.headers["x-turnout-attempts"] == "2"
    assert took < STALL  # it did not wait out a's stall
    assert reply.content.count(b'"role":"assistant"') == 1
    assert reply.content.count(b"data: [DONE]") == 1
    _same_bytes(reply.content, _direct(b, "ftd-1"))
    assert _running(a) == 0  # a's attempt was cut: its slot is free well before its stall ends
    missed = "turnout_first_token_deadlines_missed_total"
    assert metric(router.url, missed, {"backend": "a", "class": "interactive"}) == 1


def test_the_last_attempt_is_not_cut(router_with: Any, engines: tuple[Process, Process]) -> None:
    router = router_with({"first_token_timeout": 0.4, "last_attempt_grace": 2.0})
    start = time.monotonic()
    reply = post(
        router.url + "/v1/chat/completions",
        _body(),
        {"X-Turnout-Policy": "a-only", "X-Request-Id": "ftd-last"},
    )
    assert reply.status == 200 and reply.headers["x-turnout-backend"] == "a"
    assert time.monotonic() - start >= STALL  # slow but valid, and served whole
    assert reply.content.endswith(b"data: [DONE]\n\n")
    assert b'"completion_tokens":12' in reply.content


def test_a_hedge_wins_and_its_loser_is_cancelled_upstream(
    router_with: Any, engines: tuple[Process, Process]
) -> None:
    a, b = engines
    router = router_with({"hedge": {"after": 0.3, "max_fraction": 1.0}})
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.append(
            post(router.url + "/v1/chat/completions", _body(), {"X-Request-Id": "hedge-1"})
        )
    )
    thread.start()
    seen_running = False
    deadline = time.monotonic() + 2
    while not got and time.monotonic() < deadline and not seen_running:
        seen_running = _running(a) == 1  # a holds the stalled request's slot meanwhile
    thread.join(10)
    reply = got[0]
    assert seen_running
    assert reply.status == 200 and reply.headers["x-turnout-backend"] == "b"
    assert _running(a) == 0  # the loser was cancelled upstream, long before its stall ended
    _same_bytes(reply.content, _direct(b, "hedge-1"))
    interactive = {"class": "interactive"}
    assert metric(router.url, "turnout_hedges_total", {"backend": "b", **interactive}) == 1
    assert metric(router.url, "turnout_hedges_won_total", {"backend": "b", **interactive}) == 1
    assert (
        metric(router.url, "turnout_hedges_cancelled_total", {"backend": "a", **interactive}) == 1
    )
    assert metric(router.url, "turnout_hedge_wasted_tokens_total", {"backend": "a"}) > 0
    # Counted once: one request in the router's own books, served by b.
    assert metric(router.url, "turnout_requests_total", {"backend": "b", **interactive}) == 1
    assert metric(router.url, "turnout_requests_total", {"backend": "a", **interactive}) == 0


def test_a_hedged_request_is_charged_once(
    router_with: Any, engines: tuple[Process, Process], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAIL_TEST_KEY", "sk-tail-test")
    key = {"name": "k", "env": "TAIL_TEST_KEY", "tokens_per_minute": 300}
    router = router_with({"hedge": {"after": 0.2, "max_fraction": 1.0}}, api_keys=[key])
    auth = {"Authorization": "Bearer sk-tail-test"}
    first = post(router.url + "/v1/chat/completions", _body(60), auth)
    assert first.status == 200 and first.headers["x-turnout-backend"] == "b"
    assert metric(router.url, "turnout_hedges_total") == 1
    # About 75 tokens charged once leave room for this one (about 185); charged twice would not.
    body = {k: v for k, v in _body(170).items() if k not in ("stream", "stream_options")}
    second = post(router.url + "/v1/chat/completions", body, auth)
    assert second.status == 200, second.text


def test_the_budget_holds(tmp_path: Path) -> None:
    with start_emulator("vllm", args=_stalling(0.5)) as a, start_emulator("vllm") as b:
        doc = _config(a, b, {"hedge": {"after": 0.1, "max_fraction": 0.25}})
        with start_router(write_config(tmp_path, doc)) as router:
            for i in range(8):
                headers = {"X-Request-Id": f"bud-{i}"}
                reply = post(router.url + "/v1/chat/completions", _body(4), headers)
                assert reply.status == 200
            # A quarter of eight requests: two hedges, on the fourth and the eighth.
            assert metric(router.url, "turnout_hedges_total") == 2


def test_no_hedging_under_saturation(tmp_path: Path) -> None:
    busy = ["--set", "ranks=1", "--set", "max_num_seqs=1"]
    with (
        start_emulator("vllm", args=_stalling(1.0)) as a,
        start_emulator("vllm", args=busy) as b,
    ):
        hog = {"model": MODEL, "prompt": "x", "max_tokens": 4000, "ignore_eos": True}

        def occupy() -> None:
            with contextlib.suppress(OSError):  # cut when b stops, at the test's end
                post(b.url + "/v1/completions", hog)

        hogs = [threading.Thread(target=occupy, daemon=True) for _ in range(2)]
        for t in hogs:
            t.start()
        deadline = time.monotonic() + 5
        while metric(b.url, "vllm:num_requests_waiting") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        doc = _config(a, b, {"hedge": {"after": 0.1, "max_fraction": 1.0}})
        doc["health"] = {**doc["health"], "scrape_interval": 0.1}
        with start_router(write_config(tmp_path, doc)) as router:
            time.sleep(0.5)  # a scrape has seen b's queue
            for _ in range(3):
                reply = post(router.url + "/v1/chat/completions", _body(4))
                assert reply.status == 200 and reply.headers["x-turnout-backend"] == "a"
            assert metric(router.url, "turnout_hedges_total") == 0
