"""Quotas through the request path (in-process router, fake engine): charges that hold.

Each test here is an attack that worked before: a hostile ``max_tokens`` that locked a key
out, answers without usage that were never charged, a batch key claiming interactive, a
reload that reset every bucket, and a model list served to callers without a key.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from router.app import STATE
from router.control.quota import QuotaTable
from tests.router.fake_upstream import MODEL, FakeEngine, InProcess, in_process_router
from tests.router.harness import base_config

KEY = "sk-quota-test"
CHAT = [{"role": "user", "content": "hello"}]


def keyed_config(**key: Any) -> dict[str, Any]:
    doc = base_config([("fake", "vllm", "fake")])
    doc["health"]["scrape_metrics"] = False
    doc["api_keys"] = [{"name": "app", "sha256": hashlib.sha256(KEY.encode()).hexdigest(), **key}]
    return doc


async def post(
    s: aiohttp.ClientSession, ip: InProcess, headers: dict[str, str] | None = None, **body: Any
) -> aiohttp.ClientResponse:
    doc = {"model": MODEL, "messages": CHAT, **body}
    auth = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    resp = await s.post(f"{ip.url}/v1/chat/completions", data=orjson.dumps(doc), headers=auth)
    await resp.read()
    return resp


async def test_a_hostile_max_tokens_does_not_lock_the_key_out(tmp_path: Path) -> None:
    doc = keyed_config(tokens_per_minute=2000)
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as s:
        hostile = await post(s, ip, max_tokens=9223372036854775807)
        assert hostile.status == 400  # the engine's answer, passed on
        ordinary = await post(s, ip, max_tokens=50)
        assert ordinary.status == 200, await ordinary.text()


async def test_an_answer_without_usage_is_charged_what_was_relayed(tmp_path: Path) -> None:
    """Charged 910 (prompt plus max_tokens) up front; without usage it settles at the prompt
    plus a token per event relayed: neither the whole budget nor nothing."""
    engine = FakeEngine(usage=False)
    doc = keyed_config(tokens_per_minute=1000)
    async with in_process_router(tmp_path, doc, engine) as ip, aiohttp.ClientSession() as s:
        for stream in (True, False):
            gate = ip.app[STATE].gate
            tenant = gate.identify({"Authorization": f"Bearer {KEY}"})
            assert tenant is not None and isinstance(gate.store, QuotaTable)
            before = gate.store.usage(tenant.capture_id, tenant.limits)[1]
            resp = await post(s, ip, max_tokens=900, stream=stream)
            assert resp.status == 200
            after = gate.store.usage(tenant.capture_id, tenant.limits)[1]
            spent = before - after  # refills during the request only shrink it
            assert 1 < spent < 50, (stream, spent)


async def test_a_keys_class_and_policy_win_over_headers(tmp_path: Path) -> None:
    doc = keyed_config(**{"class": "batch", "policy": "class-split"})
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as s:
        claims = {"X-Request-Class": "interactive", "X-Turnout-Policy": "round-robin"}
        resp = await post(s, ip, claims, max_tokens=4)
        assert resp.status == 200
        assert resp.headers["X-Turnout-Class"] == "batch"
        assert resp.headers["X-Turnout-Policy"] == "class-split"


async def test_a_key_that_allows_overrides_follows_the_headers(tmp_path: Path) -> None:
    doc = keyed_config(**{"class": "batch", "allow_overrides": True})
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as s:
        claims = {"X-Request-Class": "interactive", "X-Turnout-Policy": "round-robin"}
        resp = await post(s, ip, claims, max_tokens=4)
        assert resp.headers["X-Turnout-Class"] == "interactive"
        assert resp.headers["X-Turnout-Policy"] == "round-robin"


async def test_a_reload_resets_no_bucket(tmp_path: Path) -> None:
    doc = keyed_config(requests_per_minute=1)
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as s:
        assert (await post(s, ip, max_tokens=4)).status == 200
        reload = await s.post(f"{ip.url}/turnout/reload")  # loopback: allowed without keys
        assert reload.status == 200, await reload.text()
        assert (await post(s, ip, max_tokens=4)).status == 429


async def test_the_model_list_needs_a_key_when_keys_are_required(tmp_path: Path) -> None:
    doc = keyed_config()
    doc["require_api_key"] = True
    async with in_process_router(tmp_path, doc) as ip, aiohttp.ClientSession() as s:
        anonymous = await s.get(f"{ip.url}/v1/models")
        assert anonymous.status == 401
        assert (await anonymous.json())["error"]["code"] == "invalid_api_key"
        keyed = await s.get(f"{ip.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
        assert keyed.status == 200 and (await keyed.json())["data"][0]["id"] == MODEL
