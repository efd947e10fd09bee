"""Priority bands and shedding through the router: keys of three bands on one full backend,
served in band order, the lowest band shed for a higher one, the band in the engine's
``priority`` field."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from router.app import STATE
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.harness import base_config

BANDS = {"bulk": -1, "app": 0, "vip": 1}


def config() -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")])
    doc["health"]["scrape_metrics"] = False
    doc["backends"][0].update(max_inflight=1, priority_capable=True)
    doc["admission"] = {"batch": {"queue_size": 2, "max_wait": 10}}
    doc["api_keys"] = [
        {"name": n, "sha256": hashlib.sha256(n.encode()).hexdigest(), "class": "batch",
         "priority": band}
        for n, band in BANDS.items()
    ]  # fmt: skip
    return doc


async def chat(
    s: aiohttp.ClientSession, ip: InProcess, key: str, **body: Any
) -> aiohttp.ClientResponse:
    doc = {"model": MODEL, "messages": [{"role": "user", "content": key}], **body}
    resp = await s.post(
        f"{ip.url}/v1/chat/completions",
        data=orjson.dumps(doc),
        headers={"Authorization": f"Bearer {key}"},
    )
    await resp.read()
    return resp


async def until(check: Any) -> None:
    for _ in range(500):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_bands_go_in_order_and_the_lowest_is_shed_for_a_higher_one(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.release.clear()
    async with in_process_router(tmp_path, config(), engine) as ip, aiohttp.ClientSession() as s:
        admission = ip.app[STATE].admission
        holder = asyncio.create_task(chat(s, ip, "vip", stream=True))
        await until(engine.streaming.is_set)
        bulk = [asyncio.create_task(chat(s, ip, "bulk")) for _ in range(2)]
        await until(lambda: admission.waiting("batch") == 2)  # the queue is full
        app = asyncio.create_task(chat(s, ip, "app"))
        shed = await next(asyncio.as_completed(bulk))  # a bulk waiter gives app its place
        assert shed.status == 429 and shed.headers["X-Turnout-Refused"] == "shed"
        more = await chat(s, ip, "bulk")  # the lowest band sheds nobody: refused itself
        assert more.status == 429 and more.headers["X-Turnout-Refused"] == "queue_full"
        engine.release.set()
        assert (await holder).status == 200
        assert (await app).status == 200
        assert sorted(r.status for r in [await b for b in bulk]) == [200, 429]
    order = [b["messages"][0]["content"] for b in engine.bodies]
    assert order == ["vip", "app", "bulk"]  # app waited after bulk, and went first
    priority = {b["messages"][0]["content"]: b.get("priority") for b in engine.bodies}
    assert priority == {"vip": -1, "app": None, "bulk": 1}  # vLLM: lower first
