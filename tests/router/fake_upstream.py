"""An in-process fake engine and an in-process router, for fast tests of the request path.

Both are real aiohttp servers on loopback sockets in the test's own event loop: the router
app is built by ``router.app.build_app`` exactly as ``turnout serve`` builds it, only not in
a separate process. The fake engine answers the routes the router's health monitor probes
and a scripted chat endpoint whose streams can be held open until a test releases them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from router.app import Served, build_app, listen_socket, serve
from router.config.parse import load_config
from tests.router.harness import write_config

MODEL = "fake-model"
CONTEXT = 32_768


@dataclass
class FakeEngine:
    """What the fake engine received, and a gate that holds every stream before its end."""

    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[CIMultiDict[str]] = field(default_factory=list)
    peers: list[object] = field(default_factory=list)
    """The address each chat request came from (a new port: a new connection)."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Streams send their first token, then wait for this before finishing."""
    streaming: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a stream has sent its first token."""
    usage: bool = True
    """Whether answers carry usage figures (an engine may omit them)."""
    healthy: bool = True
    """What its /health says (503 when False)."""
    error_status: int | None = None
    """Answer every chat request with this status (OpenAI error JSON) when set."""
    cut: bool = False
    """A /v1/responses stream ends after its deltas, without ``response.completed``."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """A chat stream's end of body (after ``[DONE]``) waits for this."""

    def __post_init__(self) -> None:
        self.release.set()
        self.ended.set()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok"}, status=200 if self.healthy else 503)

    async def _models(self, _: web.Request) -> web.Response:
        model = {"id": MODEL, "object": "model", "max_model_len": CONTEXT}
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(CIMultiDict(request.headers))
        self.peers.append(request.transport and request.transport.get_extra_info("peername"))
        if self.error_status is not None:
            error = {"message": "injected", "type": "server_error", "code": self.error_status}
            return web.json_response({"error": error}, status=self.error_status)
        if (body.get("max_tokens") or 0) > CONTEXT:  # as vLLM answers a budget past the context
            error = {"message": "max_tokens is too large", "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        n = body.get("n") or 1  # each choice says "hi there": two tokens
        usage = (
            {"prompt_tokens": 7, "completion_tokens": 2 * n, "total_tokens": 7 + 2 * n}
            if self.usage
            else None
        )
        if not body.get("stream"):
            message = {"role": "assistant", "content": "hi there"}
            return web.json_response(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)

        async def event(doc: object) -> None:
            await out.write(b"data: " + orjson.dumps(doc) + b"\n\n")

        def chunk(i: int, delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
            choice = {"index": i, "delta": delta, "finish_reason": finish}
            return {"id": "c1", "object": "chat.completion.chunk", "choices": [choice]}

        for i in range(n):
            await event(chunk(i, {"role": "assistant", "content": "hi"}))
        self.streaming.set()
        await self.release.wait()
        for i in range(n):
            await event(chunk(i, {"content": " there"}, "stop"))
        if usage is not None and (body.get("stream_options") or {}).get("include_usage"):
            await event(
                {"id": "c1", "object": "chat.completion.chunk", "choices": [], "usage": usage}
            )
        await out.write(b"data: [DONE]\n\n")
        await self.ended.wait()
        await out.write_eof()
        return out

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """A Responses API stream: three text deltas as typed events, then (unless ``cut``)
        ``response.completed`` with usage (unless ``usage`` is False)."""
        self.bodies.append(await request.json())
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)

        async def event(kind: str, **fields: object) -> None:
            doc = orjson.dumps({"type": kind, **fields})
            await out.write(b"event: %s\ndata: %s\n\n" % (kind.encode(), doc))

        item = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        await event("response.created", response={"id": "resp_1", "status": "in_progress"})
        for n, text in enumerate(("a", " b", " c")):
            await event("response.output_text.delta", delta=text, **item)
            if n == 0:
                self.streaming.set()
                await self.release.wait()
        await event("response.output_text.done", text="a b c", **item)
        if not self.cut:
            usage = {"input_tokens": 7, "output_tokens": 3} if self.usage else None
            done = {"id": "resp_1", "status": "completed", "usage": usage}
            await event("response.completed", response=done)
        await out.write_eof()
        return out


@dataclass
class InProcess:
    """A running in-process router in front of a fake engine."""

    app: web.Application
    url: str
    engine: FakeEngine
    config_path: Path
    served: Served


@contextlib.asynccontextmanager
async def in_process_router(
    tmp_path: Path,
    doc: dict[str, Any],
    engine: FakeEngine | None = None,
    others: Mapping[str, FakeEngine] | None = None,
) -> AsyncIterator[InProcess]:
    """Start the fake engines, write ``doc`` with their URLs and serve it.

    A backend whose ``url`` is ``"fake"`` is pointed at ``engine``; one whose ``url`` is
    ``"fake:NAME"`` at ``others[NAME]``.
    """
    engine = engine if engine is not None else FakeEngine()
    engines = {"fake": engine, **{f"fake:{n}": e for n, e in (others or {}).items()}}
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for name, fake in engines.items():
            upstream = TestServer(fake.app(), host="127.0.0.1")
            await upstream.start_server()
            stack.push_async_callback(upstream.close)
            urls[name] = str(upstream.make_url("")).rstrip("/")
        for backend in doc["backends"]:
            backend["url"] = urls.get(backend.get("url"), backend.get("url"))
        path = write_config(tmp_path, doc)
        app = build_app(load_config(path), config_path=path)
        # The router's own server (guarded site, handler cancellation), as `turnout serve` runs.
        served = await serve(app, listen_socket("127.0.0.1", 0))
        stack.push_async_callback(served.runner.cleanup)
        yield InProcess(app, served.url, engine, path, served)
