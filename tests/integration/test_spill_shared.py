"""``adaptive``'s spill limit is the router's: a router of two workers in front of two
emulated engines never has more batch requests spilled onto the low-TTFT replica than
``spill.max_inflight``, however the kernel spreads a burst over its workers.

``bulk`` (the high-throughput pool) decodes at about 8 ms a token, ``quick`` (low TTFT) at
2 ms, so once ``bulk`` holds a request and both paces are measured, a batch
request finishes sooner on ``quick`` and is spilled there while the limit allows (two).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.procs import start_emulator
from tests.router.harness import base_config, client_for, start_router, write_config

MODEL = "deepseek-v4.1-flash"
LIMIT = 2
ADAPTIVE = {
    "type": "adaptive",
    "params": {
        "low_ttft": ["vllm"],
        "high_throughput": ["deepinfer"],
        "slo": {"interactive": {"ttft_s": 10.0, "tpot_s": 1.0}},  # always headroom to spill
        "learning_rate": 1.0,  # each measured figure as it comes: one request measures it
        "spill": {"max_inflight": LIMIT, "initial_inflight": LIMIT},
    },
}


def ask(url: str, request_class: str, tokens: int) -> tuple[str, str, float, float]:
    """One stream over a fresh connection: the backend, the worker (the process part of the
    router-made request id), and when its headers and its last line came."""
    body: dict[str, Any] = {"min_tokens": tokens, "ignore_eos": True}
    with (
        client_for(url) as client,
        client.chat.completions.with_streaming_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a story."}],
            max_tokens=tokens,
            stream=True,
            extra_body=body,
            extra_headers={"X-Request-Class": request_class},
        ) as stream,
    ):
        began = time.monotonic()
        for _ in stream.iter_lines():
            pass
        worker = stream.headers["x-request-id"].rsplit("-", 1)[0]
        return stream.headers["x-turnout-backend"], worker, began, time.monotonic()


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of ``spans`` open at one moment."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    open_now = most = 0
    for _, step in edges:
        open_now += step
        most = max(most, open_now)
    return most


def test_the_spill_limit_holds_for_the_router_not_each_worker(tmp_path: Path) -> None:
    with (
        start_emulator("vllm", args=["--set", "step_base_ms=2"]) as quick,
        start_emulator("deepinfer", args=["--set", "step_base_ms=10"]) as bulk,
    ):
        doc = base_config([("quick", "vllm", quick.url), ("bulk", "deepinfer", bulk.url)])
        doc["policies"]["learn"] = ADAPTIVE
        doc["default_policy"] = "learn"
        doc["health"]["scrape_metrics"] = False
        doc["access_log"] = {"enabled": False}
        with (
            start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router,
            ThreadPoolExecutor(12) as pool,
        ):
            # What the rule needs measured, learned by both workers (lessons are shared):
            # bulk's batch pace, and quick's time per token from an interactive stream.
            assert ask(router.url, "batch", 20)[0] == "bulk"
            assert ask(router.url, "interactive", 20)[0] == "quick"
            time.sleep(0.3)
            burst = [pool.submit(ask, router.url, "batch", 600) for _ in range(12)]
            served = [f.result() for f in burst]
    spilled = [(began, ended) for backend, _, began, ended in served if backend == "quick"]
    assert len({worker for _, worker, _, _ in served}) == 2  # both workers took part
    # Each worker alone would let two through; the router holds two at once, and did.
    assert most_at_once(spilled) == LIMIT, served
