"""Failover and the breaker within their limits (issue 26), over real processes: a router in
front of emulators.

- A timeout that every backend tried shows for the same request is the request's (a
  generation longer than the deadline), and ejects none of them; a backend that times out
  where another serves the same request still counts.
- The breaker counts only its own half-open probe: a request sent before an ejection that
  ends after the cooldown neither closes nor re-opens it.
- Failover never takes a backend past its ``max_inflight``: a full one is passed over, and
  with every one left full the request behaves as admission does (429 without a queue, a
  wait in the class's queue with one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.procs import Process, start_emulator
from tests.router.harness import (
    Reply,
    base_config,
    client_for,
    get,
    post,
    start_router,
    write_config,
)

MODEL = "deepseek-v4.1-flash"
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Tell me a long story."}]
FAULT = "X-Emulator-Fault"
DEADLINE = 1.0
"""The routers' non_stream_total here (seconds)."""


def config(urls: list[tuple[str, str]], **health: Any) -> dict[str, Any]:
    """Backends that accept the emulator's fault header, under a short non-streamed deadline."""
    doc = base_config([(name, "vllm", url) for name, url in urls])
    for backend in doc["backends"]:
        backend["forward_headers"] = [FAULT]
    doc["health"] = {**doc["health"], "failures_to_eject": 2, "cooldown": 60, **health}
    doc["timeouts"] = {c: {"non_stream_total": DEADLINE} for c in ("interactive", "batch")}
    return doc


def breakers(router: Process) -> dict[str, str]:
    return {b["name"]: b["breaker"] for b in get(router.url + "/turnout/backends").json()}


def inflight(router: Process, name: str) -> int:
    states = {b["name"]: b["inflight"] for b in get(router.url + "/turnout/backends").json()}
    return int(states[name])


def chat(router: Process, headers: dict[str, str] | None = None, **body: Any) -> Reply:
    doc = {"model": MODEL, "messages": CHAT, "max_tokens": 2, **body}
    return post(router.url + "/v1/chat/completions", doc, headers)


def served_by(router: Process) -> str:
    raw = client_for(router.url).chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=2
    )
    return raw.headers["x-turnout-backend"]


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Process, Process]]:
    """Two emulated engines in real time: a long generation takes as long as it would."""
    with start_emulator("vllm") as a, start_emulator("vllm") as b:
        yield a, b


# -- a timeout on every backend is the request's ----------------------------------------------


def test_long_generations_timing_out_everywhere_eject_no_backend(
    engines: tuple[Process, Process], tmp_path: Path
) -> None:
    """The attack: valid requests whose generation outlasts the deadline, through failover on
    both backends, three times (over ``failures_to_eject``); no breaker opens."""
    a, b = engines
    with start_router(write_config(tmp_path, config([("a", a.url), ("b", b.url)]))) as router:
        long: dict[str, Any] = {"max_tokens": 4000, "ignore_eos": True}  # minutes at its pace
        replies: list[Reply] = []
        threads = [
            threading.Thread(target=lambda: replies.append(chat(router, **long))) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert [r.status for r in replies] == [504] * 3, [r.content for r in replies]
        assert {r.json()["error"]["code"] for r in replies} == {"upstream_timeout"}
        assert {r.headers["x-turnout-backend"] for r in replies} == {"b"}  # a, then b, tried
        assert breakers(router) == {"a": "closed", "b": "closed"}
        assert served_by(router) == "a"


def test_a_backend_timing_out_where_another_serves_is_ejected(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50, args=["--stall", "30"]) as slow,
        start_emulator("vllm", time_scale=50) as good,
    ):
        doc = config([("slow", slow.url), ("good", good.url)])
        with start_router(write_config(tmp_path, doc)) as router:
            assert [chat(router).status for _ in range(2)] == [200, 200]
            assert breakers(router) == {"slow": "open", "good": "closed"}
            assert served_by(router) == "good"


# -- only the probe moves the breaker out of half-open ----------------------------------------


@pytest.mark.parametrize(("late", "status"), [("", 200), ("status=503", 503)])
def test_a_request_sent_before_the_ejection_does_not_decide_after_it(
    engines: tuple[Process, Process], tmp_path: Path, late: str, status: int
) -> None:
    """A slow request is in flight on ``a`` when another one ejects it; it ends (fine, or
    with a 503) after the cooldown. Neither closes the breaker nor opens it again: it is
    half-open until a probe is sent, and that probe closes it."""
    a, b = engines
    doc = config([("a", a.url), ("b", b.url)], failures_to_eject=1, cooldown=0.5)
    doc["timeouts"] = {}  # the slow request must not time out
    with start_router(write_config(tmp_path, doc)) as router:
        pinned = {"X-Turnout-Policy": "a-only"}
        slow: list[Reply] = []
        fault = f"stall=3; {late}" if late else "stall=3"
        thread = threading.Thread(
            target=lambda: slow.append(chat(router, {**pinned, FAULT: fault}))
        )
        thread.start()
        try:
            for _ in range(100):
                if inflight(router, "a") == 1:
                    break
                threading.Event().wait(0.02)
            assert inflight(router, "a") == 1
            ejecting = chat(router, {**pinned, FAULT: "status=503"})
            assert ejecting.status == 503
            assert breakers(router)["a"] == "open"
        finally:
            thread.join(30)
        assert [r.status for r in slow] == [status]
        # Old behaviour: the late success closed the breaker ("closed"), the late 503 opened
        # it again for twice the cooldown ("open").
        assert breakers(router)["a"] == "half-open"
        assert chat(router, pinned).status == 200  # the probe
        assert breakers(router)["a"] == "closed"


# -- failover within max_inflight -------------------------------------------------------------


class Peak:
    """Polls the router's in-flight count of one backend in a thread; ``peak`` is the most seen."""

    def __init__(self, router: Process, name: str) -> None:
        self.peak = 0
        self._router, self._name = router, name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, inflight(self._router, self._name))

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def at_once(count: int, send: Callable[[], Reply]) -> list[Reply]:
    replies: list[Reply] = []
    threads = [threading.Thread(target=lambda: replies.append(send())) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return replies


@pytest.fixture(scope="module")
def failing_and_capped() -> Iterator[tuple[Process, Process]]:
    """``first`` answers every request 503 after 1.5 s, so that requests sent together are
    all planned (with ``capped`` below its limit) before any fails over; ``capped`` answers
    after 0.5 s."""
    failing = ["--stall", "1.5", "--error-rate", "1", "--error-status", "503"]
    with (
        start_emulator("vllm", time_scale=50, args=failing) as first,
        start_emulator("vllm", time_scale=50, args=["--stall", "0.5"]) as capped,
    ):
        yield first, capped


def capped_config(first: Process, capped: Process, **overrides: Any) -> dict[str, Any]:
    doc = config([("first", first.url), ("capped", capped.url)], failures_to_eject=1000)
    doc["backends"][1]["max_inflight"] = 1
    doc["timeouts"] = {}
    doc.update(overrides)
    return doc


def test_failover_without_a_queue_answers_429_rather_than_pass_max_inflight(
    failing_and_capped: tuple[Process, Process], tmp_path: Path
) -> None:
    """The attack: eight requests fail on the first backend together; the second, capped at
    1, used to take all eight."""
    doc = capped_config(*failing_and_capped)
    with start_router(write_config(tmp_path, doc)) as router, Peak(router, "capped") as seen:
        replies = at_once(8, lambda: chat(router))
    assert sorted(r.status for r in replies) == [200] + [429] * 7, [r.content for r in replies]
    refused = [r for r in replies if r.status == 429]
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limit_exceeded"}
    assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
    assert seen.peak == 1


def test_failover_waits_in_the_admission_queue_for_a_full_backend(
    failing_and_capped: tuple[Process, Process], tmp_path: Path
) -> None:
    admission = {"interactive": {"queue_size": 16, "max_wait": 30}}
    doc = capped_config(*failing_and_capped, admission=admission)
    with start_router(write_config(tmp_path, doc)) as router, Peak(router, "capped") as seen:
        replies = at_once(8, lambda: chat(router))
    assert [r.status for r in replies] == [200] * 8, [r.content for r in replies]
    assert {r.headers["x-turnout-backend"] for r in replies} == {"capped"}
    assert seen.peak == 1
