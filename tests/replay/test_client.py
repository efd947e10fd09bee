"""The replay client against a small real HTTP server on loopback: streams, errors, refusals."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from replay.client import TargetClient, encode_body
from tests.replay.served import served
from turnout.common.capture import CaptureRecord


def _event(doc: bytes) -> bytes:
    return b"data: " + doc + b"\n\n"


async def _stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    resp.headers["x-turnout-backend"] = "b1"
    resp.headers["x-turnout-class"] = "interactive"
    await resp.prepare(request)
    await resp.write(_event(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}'))
    for tok in (b"Hel", b"lo", b"!"):
        await asyncio.sleep(0.02)
        await resp.write(_event(b'{"choices":[{"delta":{"content":"' + tok + b'"}}]}'))
    await resp.write(_event(b'{"choices":[{"delta":{},"finish_reason":"stop"}]}'))
    await resp.write(_event(b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _broken(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_event(b'{"choices":[{"delta":{"content":"x"}}]}'))
    await resp.write(_event(b'{"error":{"message":"engine died","type":"server_error"}}'))
    return resp


async def _busy(request: web.Request) -> web.Response:
    body = b'{"error":{"message":"over capacity","type":"overloaded","param":null,"code":null}}'
    return web.Response(status=503, body=body, content_type="application/json")


async def _whole(request: web.Request) -> web.Response:
    body = (
        b'{"choices":[{"message":{"content":"done"},"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":4,"completion_tokens":7}}'
    )
    return web.Response(body=body, content_type="application/json")


@pytest.fixture
async def base() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _stream)
    app.router.add_post("/v1/broken", _broken)
    app.router.add_post("/v1/busy", _busy)
    app.router.add_post("/v1/completions", _whole)
    async with served(app) as url:
        yield url


def _rec(url: str, **body: object) -> CaptureRecord:
    return CaptureRecord("id-1", url, body, headers={"x-request-class": "batch"})


async def test_stream_is_measured(base: str) -> None:
    async with aiohttp.ClientSession() as s:
        r = await TargetClient(s, base, policy="p", clock=time.monotonic).send(
            _rec("/v1/chat/completions"), b"{}", 0.001, keep_text=True
        )
    assert r.ok and r.status == 200 and r.stream
    assert r.backend == "b1" and r.request_class == "interactive"  # the router's answer wins
    assert r.completion_tokens == 3 and r.finish_reason == "stop" and r.text == "Hello!"
    assert r.ttft is not None and r.e2e is not None and r.ttft < r.e2e
    assert len(r.itls) == 2 and all(gap >= 0.015 for gap in r.itls)
    assert r.tpot == pytest.approx((r.e2e - r.ttft) / 2)


async def test_error_event_mid_stream_is_a_failure(base: str) -> None:
    async with aiohttp.ClientSession() as s:
        r = await TargetClient(s, base, policy=None, clock=time.monotonic).send(
            _rec("/v1/broken"), b"{}", None
        )
    assert r.status == 200 and not r.ok
    assert r.error is not None and r.error["message"] == "engine died"


async def test_http_error_keeps_the_openai_error(base: str) -> None:
    async with aiohttp.ClientSession() as s:
        r = await TargetClient(s, base, policy=None, clock=time.monotonic).send(
            _rec("/v1/busy"), b"{}", None
        )
    assert r.status == 503 and not r.ok and r.ttft is None
    assert r.error is not None and r.error["type"] == "overloaded"
    assert r.request_class == "batch"  # recorded class when the target does not say


async def test_non_streamed_answer(base: str) -> None:
    async with aiohttp.ClientSession() as s:
        r = await TargetClient(s, base, policy=None, clock=time.monotonic).send(
            _rec("/v1/completions"), b"{}", None, keep_text=True
        )
    assert r.ok and not r.stream and r.ttft == r.e2e
    assert r.completion_tokens == 7 and r.finish_reason == "length" and r.text == "done"
    assert r.tpot is None


async def test_refused_connection_is_a_failure_not_an_exception() -> None:
    async with aiohttp.ClientSession() as s:
        r = await TargetClient(s, "http://127.0.0.1:9", policy=None, clock=time.monotonic).send(
            _rec("/v1/completions"), b"{}", None
        )
    assert r.status == 0 and not r.ok
    assert r.error is not None and r.error["type"] == "connection_error"


def test_streamed_bodies_ask_for_usage() -> None:
    assert b'"include_usage":true' in encode_body({"stream": True})
    kept = encode_body({"stream": True, "stream_options": {"include_usage": True, "x": 1}})
    assert kept == b'{"stream":true,"stream_options":{"include_usage":true,"x":1}}'
    assert encode_body({"stream": False}) == b'{"stream":false}'
    # The Responses API's stream always ends with usage, and takes no such option.
    assert encode_body({"stream": True}, "/v1/responses") == b'{"stream":true}'
