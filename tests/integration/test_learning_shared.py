"""One set of learned estimates: what ``adaptive`` learns from one worker's requests changes
every other worker's and router's decisions (real routers of two workers, a real
redis-server, two emulated engines).

``quick`` is the low-TTFT pool by config and by its prior, but its front end holds every
request for about 200 ms, four times the interactive TTFT target; ``bulk`` answers at once.
A process that has learned this sends interactive requests to ``bulk``; one that has learned
nothing sends them to ``quick``, as the first request of the test shows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from tests.procs import Emulator, metric, start_emulator, wait_for
from tests.redis_server import start_redis
from tests.router.harness import base_config, client_for, start_router, write_config

MODEL = "deepseek-v4.1-flash"
ADAPTIVE = {
    "type": "adaptive",
    "params": {
        "low_ttft": ["vllm"],
        "high_throughput": ["deepinfer"],
        "slo": {"interactive": {"ttft_s": 0.05, "tpot_s": 1.0}},
        "prefill_rate_prior": {"vllm": 1_000_000, "deepinfer": 10_000},
        "learning_rate": 0.3,
    },
}


@contextmanager
def engines() -> Iterator[tuple[Emulator, Emulator]]:
    with (
        start_emulator("vllm", args=["--set", "frontend_ms=200"]) as quick,
        start_emulator("deepinfer", time_scale=20) as bulk,
    ):
        yield quick, bulk


def config(tmp: Path, name: str, quick: Emulator, bulk: Emulator, redis: str | None) -> Path:
    doc: dict[str, Any] = base_config(
        [("quick", "vllm", quick.url), ("bulk", "deepinfer", bulk.url)]
    )
    doc["policies"]["learn"] = ADAPTIVE
    doc["default_policy"] = "learn"
    if redis is not None:
        doc["limits"] = {"store": {"redis": {"url": redis}}}
    return write_config(tmp, doc, name)


def ask(client: openai.OpenAI) -> tuple[str, str]:
    """One interactive stream: the backend that served it, and the worker (the process part
    of the router-made request id)."""
    with client.chat.completions.with_streaming_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=4,
        stream=True,
        extra_headers={"X-Request-Class": "interactive"},
    ) as stream:
        for _ in stream.iter_lines():
            pass
        worker = stream.headers["x-request-id"].rsplit("-", 1)[0]
        return stream.headers["x-turnout-backend"], worker


def train(url: str) -> tuple[str, int]:
    """Interactive requests on one keep-alive connection (one worker) until that worker has
    learned to avoid ``quick``; returns the worker and how many it sent to ``quick``."""
    client = client_for(url)
    backend, worker = ask(client)
    assert backend == "quick"  # nothing learned yet: the low-TTFT pool by its prior
    for n in range(2, 40):
        backend, again = ask(client)
        assert again == worker  # the connection stayed on its worker
        if backend == "bulk":
            return worker, n - 1
    raise AssertionError("the serving worker never learned that quick is slow")


def probe(url: str, besides: str | None = None) -> str:
    """Where a worker other than ``besides`` sends an interactive request (fresh
    connections until one reaches such a worker)."""
    for _ in range(60):
        backend, worker = ask(client_for(url))
        if worker != besides:
            return backend
    raise AssertionError("no other worker answered")


def test_one_workers_lessons_change_the_other_workers_decisions(tmp_path: Path) -> None:
    with engines() as (quick, bulk):
        path = config(tmp_path, "router.yaml", quick, bulk, None)
        with start_router(path, ["--workers", "2"]) as router:
            worker, _ = train(router.url)
            time.sleep(0.2)  # the lessons travel off the request path (every 20 ms)
            assert probe(router.url, besides=worker) == "bulk"


def test_lessons_cross_replicas_and_stop_while_redis_is_out(tmp_path: Path) -> None:
    with start_redis() as redis, engines() as (quick, bulk):
        a_path = config(tmp_path, "a.yaml", quick, bulk, redis.url)
        b_path = config(tmp_path, "b.yaml", quick, bulk, redis.url)
        with (
            start_router(a_path, ["--workers", "2"]) as a,
            start_router(b_path, ["--workers", "2"]) as b,
            start_router(
                config(tmp_path, "c.yaml", quick, bulk, redis.url), ["--workers", "2"]
            ) as c,
        ):
            shared = "turnout_placement_shared"
            assert wait_for(lambda: metric(b.url, shared, required=True) == 1.0)
            # Redis out: b and c keep their own estimates and say so; a's lessons reach only
            # a's other worker.
            redis.stop()
            assert wait_for(lambda: metric(c.url, shared, required=True) == 0.0)
            worker, _ = train(a.url)
            time.sleep(0.3)
            assert probe(a.url, besides=worker) == "bulk"
            assert probe(c.url) == "quick"
            # Redis back: what a router learns from here on reaches every replica.
            redis.start()
            assert wait_for(lambda: metric(b.url, shared, required=True) == 1.0, 15)
            assert wait_for(lambda: metric(a.url, shared, required=True) == 1.0, 15)
            assert wait_for(lambda: metric(c.url, shared, required=True) == 1.0, 15)
            assert probe(b.url) == "quick"  # b learned nothing while Redis was out...
            _, taught = train(c.url)
            time.sleep(0.5)
            # ...and now learns from c's requests. b may be a lesson behind c (c's own during
            # the outage was lost), so it gets three asks: its own could not teach it alone.
            assert taught > 6
            assert "bulk" in [probe(b.url) for _ in range(3)]
