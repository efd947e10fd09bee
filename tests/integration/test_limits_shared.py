"""One set of limits for a key however many router processes serve it: the workers of one
router through their shared memory, two routers of two workers each through a real
redis-server. Every request goes over a fresh connection, so the kernel spreads them over
a router's workers (SO_REUSEPORT) as it would a fleet of clients."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Emulator, Process, metric, start_emulator, wait_for
from tests.redis_server import RedisServer, start_redis
from tests.router.harness import Reply, base_config, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
KEY = "sk-shared-limits"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with start_emulator("vllm", time_scale=4) as emu:
        yield emu


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with start_redis() as server:
        yield server


def config(emulator: Emulator, redis_url: str | None = None, **limits: int) -> dict[str, Any]:
    doc = base_config([("vllm", "vllm", emulator.url)])
    doc["require_api_key"] = True
    doc["api_keys"] = [{"name": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), **limits}]
    doc["access_log"] = {"enabled": False}
    if redis_url is not None:
        doc["limits"] = {"store": {"redis": {"url": redis_url}}}
    return doc


def chat(url: str, max_tokens: int = 2) -> Reply:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
    }
    return post(url + "/v1/chat/completions", body, AUTH)


def hammer(urls: list[str], count: int, max_tokens: int = 2) -> list[Reply]:
    """``count`` requests at once, spread round the routers' ``urls``."""
    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(lambda i: chat(urls[i % len(urls)], max_tokens), range(count)))


def worker(reply: Reply) -> str:
    """The worker process that answered (request ids start with its own prefix)."""
    return reply.headers["x-request-id"].rsplit("-", 1)[0]


def admitted(replies: list[Reply]) -> list[Reply]:
    for r in replies:
        assert r.status in (200, 429), r.text
        if r.status == 429:
            assert 1 <= int(r.headers["retry-after"]) <= 60
    return [r for r in replies if r.status == 200]


def test_the_workers_of_one_router_share_a_keys_requests_per_minute(
    emulator: Emulator, tmp_path: Path
) -> None:
    path = write_config(tmp_path, config(emulator, requests_per_minute=10))
    with start_router(path, ["--workers", "2"]) as router:
        start = time.monotonic()
        replies = hammer([router.url], 40)
        refill = (time.monotonic() - start) * 10 / 60
    served = admitted(replies)
    # One bucket of 10 for both workers (each alone would have let 10 through).
    assert 10 <= len(served) <= 10 + int(refill) + 1
    assert len({worker(r) for r in replies}) == 2  # both workers took part


def test_two_routers_of_two_workers_share_one_set_of_limits_in_redis(
    emulator: Emulator, redis: RedisServer, tmp_path: Path
) -> None:
    doc = config(emulator, redis.url, requests_per_minute=20, tokens_per_minute=100_000)
    a_path = write_config(tmp_path, doc, "a.yaml")
    b_path = write_config(tmp_path, doc, "b.yaml")
    with (
        start_router(a_path, ["--workers", "2"]) as a,
        start_router(b_path, ["--workers", "2"]) as b,
    ):
        start = time.monotonic()
        replies = hammer([a.url, b.url], 80)
        refill = (time.monotonic() - start) * 20 / 60
    served = admitted(replies)
    assert 20 <= len(served) <= 20 + int(refill) + 1
    assert len({worker(r) for r in replies}) == 4  # all four processes took part


def test_a_keys_concurrency_cap_holds_across_routers(
    emulator: Emulator, redis: RedisServer, tmp_path: Path
) -> None:
    doc = config(emulator, redis.url, max_concurrency=3)
    routers: list[Process] = []
    with (
        start_router(write_config(tmp_path, doc, "a.yaml"), ["--workers", "2"]) as a,
        start_router(write_config(tmp_path, doc, "b.yaml"), ["--workers", "2"]) as b,
    ):
        routers = [a, b]
        # 12 at once, each streaming 400 tokens for about a second: only 3 are open at once.
        replies = hammer([r.url for r in routers], 12, max_tokens=400)
        refused = [r for r in replies if r.status == 429]
        assert len(admitted(replies)) == 3
        assert all("requests open" in r.json()["error"]["message"] for r in refused)
        # Their slots were given back: the key is served again.
        assert all(chat(r.url).status == 200 for r in routers)


def test_a_backends_max_inflight_caps_the_fleet_not_each_router(
    emulator: Emulator, redis: RedisServer, tmp_path: Path
) -> None:
    doc = config(emulator, redis.url)
    doc["backends"][0]["max_inflight"] = 2
    # Idle, the two routers share the cap as headroom: router a's second request waits for
    # its grant to grow as b's shrinks (b idle wants none), where without a queue it would be
    # refused at once.
    queued = {**doc, "admission": {"interactive": {"queue_size": 4, "max_wait": 10}}}
    with (
        start_router(write_config(tmp_path, queued, "a.yaml"), ["--workers", "2"]) as a,
        start_router(write_config(tmp_path, doc, "b.yaml")) as b,
        ThreadPoolExecutor(2) as pool,
    ):
        # Two long answers fill the backend through router a...
        long = [pool.submit(chat, a.url, 3000) for _ in range(2)]
        time.sleep(1.0)  # ...which router b hears of within the exchange's period
        assert not any(f.done() for f in long)
        refused = [chat(b.url) for _ in range(3)]
        assert [r.status for r in refused] == [429] * 3
        assert all("in-flight limit" in r.json()["error"]["message"] for r in refused)
        assert [f.result().status for f in long] == [200, 200]
        time.sleep(1.0)
        assert chat(b.url).status == 200  # the slots came back to the fleet


def test_a_class_queue_is_bounded_across_the_workers_of_a_router(
    emulator: Emulator, tmp_path: Path
) -> None:
    doc = config(emulator)
    doc["backends"][0]["max_inflight"] = 1
    doc["admission"] = {"interactive": {"queue_size": 2, "max_wait": 10}}
    with (
        start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router,
        ThreadPoolExecutor(8) as pool,
    ):
        long = pool.submit(chat, router.url, 3000)
        # The long answer holds the backend's one slot before the others come (else a short
        # one could take it, finish, and let a seventh request in).
        assert wait_for(lambda: metric(emulator.url, "vllm:num_requests_running") == 1)
        waiting = [pool.submit(chat, router.url) for _ in range(6)]
        replies = [f.result() for f in waiting]
        assert long.result().status == 200
    full = [r for r in replies if r.status == 429]
    assert len(full) == 4  # two waited, in whichever worker: the queue is the router's
    assert {r.headers["x-turnout-refused"] for r in full} == {"queue_full"}
    assert len({worker(r) for r in replies}) == 2


OUTAGE_LINES = [
    "limits store unreachable (",
    "limits store reachable again:",
    "placement channel unreachable (",
    "placement channel reachable again:",
    "fleet load unreachable (",
    "fleet load reachable again:",
]


def test_an_outage_is_logged_once_per_router_and_so_is_the_recovery(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Redis stopped and started under traffic: each of the three clients of the store says
    it lost it and has it back once, for both workers of the router. (Each connection the
    pool kept through the outage used to fail one call after the restart, and each such
    failure reported a new outage.)"""
    log = tmp_path / "router.log"
    with start_redis() as own:
        doc = config(emulator, own.url, requests_per_minute=100_000)
        doc["backends"][0]["max_inflight"] = 64  # so the fleet load is exchanged
        doc["default_policy"] = "cache-aware"  # so placements are published
        doc["policies"]["cache-aware"] = {"type": "cache-aware"}
        with (
            start_router(write_config(tmp_path, doc), ["--workers", "2"], stderr=log) as r,
            ThreadPoolExecutor(4) as pool,
        ):
            stop = threading.Event()

            def traffic() -> list[int]:
                statuses: list[int] = []
                while not stop.is_set():
                    statuses.append(chat(r.url).status)
                return statuses

            clients = [pool.submit(traffic) for _ in range(4)]
            time.sleep(1.0)
            own.stop()
            time.sleep(2.0)  # longer than each client's probe: all three notice
            own.start()
            again = [line for line in OUTAGE_LINES if "again" in line]
            assert wait_for(lambda: all(line in log.read_text() for line in again), 15)
            time.sleep(2.0)  # traffic on the pools' connections from before the outage
            stop.set()
            statuses = [s for c in clients for s in c.result()]
    assert set(statuses) == {200}  # the local buckets served meanwhile
    text = log.read_text()
    counts = {line: text.count(line) for line in OUTAGE_LINES}
    assert counts == dict.fromkeys(OUTAGE_LINES, 1), text
    assert own.url not in text
