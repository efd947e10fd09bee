"""A backend's ``max_inflight`` caps the fleet: two routers of two workers each share one
real redis-server, in front of an upstream that counts the requests it holds at once
(benchmarks/counting_upstream.py). Hammered through all four processes, the upstream never
holds more than the cap; a killed router's slots come back to the other; Redis stopped and
started again (its data lost) changes neither, and an outage longer than a grant lasts lets
each router cap alone (``on_error: allow``) until Redis is back."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks.counting_upstream import READY
from tests.procs import Process, metric, start_process, wait_for
from tests.redis_server import RedisServer, start_redis
from tests.router.harness import Reply, get, post, start_router, write_config

CAP = 4
BODY = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Process]:
    argv = [sys.executable, "-m", "benchmarks.counting_upstream", "--hold", "0.1"]
    with start_process(argv, READY) as proc:
        yield proc


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    with start_redis() as server:
        yield server


def config(upstream: Process, redis: RedisServer) -> dict[str, Any]:
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": "capped", "engine": "vllm", "url": upstream.url,
                      "models": ["bench"], "max_inflight": CAP}],
        "default_policy": "pinned",
        "policies": {"pinned": {"type": "pinned", "params": {"backend": "capped"}}},
        "health": {"interval": 1.0, "scrape_metrics": False},
        "admission": {"interactive": {"queue_size": 64, "max_wait": 10}},
        "access_log": {"enabled": False},
        "limits": {"store": {"redis": {"url": redis.url}}},
    }  # fmt: skip


def peak(upstream: Process, reset: bool = False) -> int:
    reply = post(upstream.url + "/peak", b"") if reset else get(upstream.url + "/peak")
    return int(reply.json()["peak"])


class Hammer:
    """``clients`` threads per router, each sending one request after another over fresh
    connections (so the kernel spreads them over the router's workers)."""

    def __init__(self, urls: list[str], clients: int) -> None:
        self.replies: Counter[tuple[str, int]] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._client, args=(url,), daemon=True)
            for url in urls
            for _ in range(clients)
        ]

    def _client(self, url: str) -> None:
        while not self._stop.is_set():
            try:
                reply: Reply | None = post(url + "/v1/chat/completions", BODY)
            except OSError:  # a router killed under it
                reply = None
                time.sleep(0.05)
            with self._lock:
                self.replies[url, reply.status if reply else 0] += 1
            if reply is not None and reply.status != 200:
                time.sleep(0.02)

    def served(self, url: str) -> int:
        with self._lock:
            return self.replies[url, 200]

    @contextmanager
    def running(self) -> Iterator[Hammer]:
        for t in self._threads:
            t.start()
        try:
            yield self
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(30)


@contextmanager
def two_routers(
    upstream: Process, redis: RedisServer, tmp: Path, logs: list[Path] | None = None
) -> Iterator[tuple[Process, Process]]:
    """Routers a and b of two workers each, sharing ``redis`` (their logs to ``logs``)."""
    doc = config(upstream, redis)
    paths = [write_config(tmp, doc, f"{name}.yaml") for name in "ab"]
    errs: list[Path | None] = [*logs] if logs else [None, None]
    with (
        start_router(paths[0], ["--workers", "2"], stderr=errs[0]) as a,
        start_router(paths[1], ["--workers", "2"], stderr=errs[1]) as b,
    ):
        yield a, b


def grant(router: Process) -> float:
    return metric(router.url, "turnout_backend_grant", {"backend": "capped"}, required=True)


def kill_router(router: Process) -> None:
    """SIGKILL a router and its workers at once: a replica that died."""
    pid = router.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    for p in [pid, *map(int, children)]:
        os.kill(p, signal.SIGKILL)
    router.proc.wait(10)


def test_two_routers_of_two_workers_never_pass_the_backends_cap(
    upstream: Process, redis: RedisServer, tmp_path: Path
) -> None:
    with two_routers(upstream, redis, tmp_path) as (a, b):
        peak(upstream, reset=True)
        hammer = Hammer([a.url, b.url], 8)
        with hammer.running():
            time.sleep(4)
        # Both routers were served, with the backend full: the grants added up to the cap.
        assert hammer.served(a.url) > 10 and hammer.served(b.url) > 10, hammer.replies
        assert peak(upstream) == CAP, hammer.replies


def test_a_router_without_a_queue_beside_a_busy_one_is_not_starved(
    upstream: Process, redis: RedisServer, tmp_path: Path
) -> None:
    doc = config(upstream, redis)
    quiet = {key: value for key, value in doc.items() if key != "admission"}
    with (
        start_router(write_config(tmp_path, doc, "a.yaml"), ["--workers", "2"]) as a,
        start_router(write_config(tmp_path, quiet, "b.yaml"), ["--workers", "2"]) as b,
        Hammer([a.url], 8).running(),
    ):
        time.sleep(1.5)  # a holds the whole cap; b, idle, wants none of it
        peak(upstream, reset=True)
        statuses = []
        for _ in range(30):  # one at a time: each refusal is what b asks for next
            statuses.append(post(b.url + "/v1/chat/completions", BODY).status)
            time.sleep(0.05)
        assert peak(upstream) <= CAP
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) >= 10, statuses


def test_a_killed_routers_slots_come_back_to_the_others(
    upstream: Process, redis: RedisServer, tmp_path: Path
) -> None:
    with two_routers(upstream, redis, tmp_path) as (a, b):
        hammer = Hammer([a.url, b.url], 6)
        with hammer.running():
            time.sleep(2)
            assert hammer.served(b.url) > 0
            kill_router(b)
            peak(upstream, reset=True)
            time.sleep(1)
            assert peak(upstream) <= CAP
            # b's grant lapses 2 s after its last ask, and a's grows into it.
            assert wait_for(lambda: grant(a) == CAP, 15)
            peak(upstream, reset=True)
            time.sleep(1.5)
            assert peak(upstream) == CAP  # router a alone fills the backend again
        assert get(a.url + "/turnout/backends").json()[0]["grant"] == CAP


def test_redis_stopped_and_started_again(
    upstream: Process, redis: RedisServer, tmp_path: Path
) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    with two_routers(upstream, redis, tmp_path, logs) as (a, b):
        hammer = Hammer([a.url, b.url], 6)
        with hammer.running():
            time.sleep(1.5)
            peak(upstream, reset=True)
            # Down for less than a grant lasts, and back with nothing: the grants hold, and
            # the first ask finds the store warming, so none grows before all are known.
            redis.stop()
            time.sleep(0.5)
            redis.start()
            time.sleep(2.5)
            assert peak(upstream) <= CAP, hammer.replies
            before = hammer.served(a.url), hammer.served(b.url)
            # Down for longer: each router caps alone, and is still served.
            redis.stop()
            time.sleep(3.5)
            during = hammer.served(a.url), hammer.served(b.url)
            assert during[0] > before[0] and during[1] > before[1]
            assert grant(b) == -1  # capping alone
            redis.start()
            time.sleep(2)  # what each took alone shrinks back to its share
            peak(upstream, reset=True)
            time.sleep(2)
            assert peak(upstream) <= CAP, hammer.replies
            after = hammer.served(a.url), hammer.served(b.url)
            assert after[0] > during[0] and after[1] > during[1]
    for log in logs:
        text = log.read_text()
        # Once a router an outage (worker 0 speaks for it), not once a period.
        assert 1 <= text.count("fleet load unreachable") <= 2, text
        assert 1 <= text.count("fleet load reachable again") <= 2, text
