"""A batch line through the request path in-process (router.batch.lines), against a fake
engine over loopback: the answer it collects, the bound on a stream a backend sends it
anyway, and the creator whose key is gone. Whole batches run in tests/integration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from router.app import STATE
from router.batch.lines import run_line
from tests.router.fake_upstream import MODEL, in_process_router
from tests.router.harness import base_config

HEADERS = {"Content-Type": "application/json", "X-Request-Class": "batch", "X-Request-Id": "l-1"}
PATH = "/v1/chat/completions"


def config() -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")], limits={"max_upstream_body_bytes": 1024})
    doc["health"]["scrape_metrics"] = False
    return doc


def line(**body: Any) -> bytes:
    return orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body})


async def test_a_line_is_answered_through_the_request_path(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        state = ip.app[STATE]
        reply = await run_line(state, "key-anyone", PATH, HEADERS, line())
        assert reply.status == 200 and reply.headers["X-Request-Id"] == "l-1"
        assert reply.headers["X-Turnout-Class"] == "batch"
        assert orjson.loads(reply.body)["choices"][0]["message"]["content"] == "hi there"
        assert ip.engine.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]
        metrics = state.metrics.render().decode()
        assert 'turnout_requests_total{backend="fake",class="batch"' in metrics


async def test_a_stream_sent_to_a_line_is_collected_within_the_bound(tmp_path: Path) -> None:
    """Lines never ask for a stream, but a backend may answer with one: a small one is kept
    whole; one past ``limits.max_upstream_body_bytes`` gets the line a 502, not the bytes."""
    async with in_process_router(tmp_path, config()) as ip:
        state = ip.app[STATE]
        small = await run_line(state, "key-anyone", PATH, HEADERS, line(stream=True))
        assert small.status == 200 and small.body.endswith(b"data: [DONE]\n\n")
        big = await run_line(state, "key-anyone", PATH, HEADERS, line(stream=True, n=20))
        assert big.status == 502 and big.headers["X-Request-Id"] == "l-1"
        assert orjson.loads(big.body)["error"]["code"] == "upstream_body_too_large"


async def test_a_line_whose_creators_key_is_gone_is_refused(tmp_path: Path) -> None:
    async with in_process_router(tmp_path, config()) as ip:
        reply = await run_line(ip.app[STATE], "0123456789abcdef", PATH, HEADERS, line())
        assert reply.status == 401
        assert orjson.loads(reply.body)["error"]["code"] == "invalid_api_key"
        assert ip.engine.bodies == []
