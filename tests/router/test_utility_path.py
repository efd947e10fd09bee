"""/tokenize through the in-process router against a fake engine that does not serve it: the
engine's plain-text 404 never reaches the client, an OpenAI error in its place does."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from router.app import STATE
from tests.router.fake_upstream import MODEL, FakeEngine, in_process_router
from tests.router.test_handler import config


async def test_an_engine_answer_that_is_not_openai_json_is_replaced(tmp_path: Path) -> None:
    engine = FakeEngine()
    async with (
        in_process_router(tmp_path, config(), engine) as ip,
        aiohttp.ClientSession() as session,
        session.post(f"{ip.url}/tokenize", json={"model": MODEL, "prompt": "hi"}) as resp,
    ):
        body = await resp.json()
        assert resp.status == 404 and resp.headers["X-Turnout-Backend"] == "fake"
    assert body["error"]["code"] == "upstream_error" and "fake" in body["error"]["message"]
    assert ip.app[STATE].pool.by_name["fake"].inflight == 0  # the lease was given back
