"""``limits.upstream_idle_seconds``: how long the router keeps an unused upstream connection
for the next request to that backend (router.proxy.keepalive)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from tests.router.fake_upstream import MODEL, in_process_router
from tests.router.harness import base_config

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.mark.parametrize(("idle", "connections"), [(0.05, 2), (30.0, 1)])
async def test_a_connection_idle_longer_than_the_limit_is_not_reused(
    tmp_path: Path, idle: float, connections: int
) -> None:
    doc = base_config([("fake", "vllm", "fake")], limits={"upstream_idle_seconds": idle})
    doc["health"]["scrape_metrics"] = False
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as session:
        for _ in range(2):
            async with session.post(f"{ip.url}/v1/chat/completions", json=CHAT) as reply:
                assert reply.status == 200
                await reply.read()
            await asyncio.sleep(0.3)  # idle: longer than the short limit, well under the long
        assert len(ip.engine.peers) == 2
        assert len(set(ip.engine.peers)) == connections
