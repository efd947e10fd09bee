"""The router's HTTP routes besides the lean server's own: the request path handed over to
aiohttp, the model list, health and readiness, metrics, the ``/turnout/*`` views, and the
middleware that keeps every answer (an unknown route's too) in OpenAI's error shape."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

import orjson
from aiohttp import web

from policies.types import RequestClass, Slo, group_of
from router.control.auth import POLICIES_PATH
from router.proxy.handler import PATHS, handle
from router.proxy.state import RouterState
from router.proxy.utility import UTILITY_PATHS, forward
from router.server.answer import Serve
from router.server.errors import SERVER, RouterError, error_response
from router.server.site import AiohttpClient

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def proxied_routes(state: RouterState) -> dict[str, Serve]:
    """The routes of the request path (and the tokenizer's), by path: served by the lean
    server (router.server.wire) and, for what it hands over, by aiohttp."""
    routes: dict[str, Serve] = {
        path: partial(handle, state=state, endpoint=endpoint) for endpoint, path in PATHS.items()
    }
    for endpoint, path in UTILITY_PATHS.items():
        routes[path] = partial(forward, state=state, endpoint=endpoint)
    return routes


def _on_aiohttp(serve: Serve) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await AiohttpClient(request).answer(serve)

    return handler


def add_routes(app: web.Application, state: RouterState) -> None:

    async def models(request: web.Request) -> web.Response:
        try:
            state.gate.identify(request.headers)  # 401 for an unknown caller when keys are required
        except RouterError as exc:
            return error_response(exc)
        return _json({"object": "list", "data": [_card(m) for m in state.pool.model_ids()]})

    async def model(request: web.Request) -> web.Response:
        try:
            state.gate.identify(request.headers)
        except RouterError as exc:
            return error_response(exc)
        name = request.match_info["model"]
        if name not in state.pool.model_ids():
            message = f"model '{name}' does not exist"
            return error_response(RouterError(404, message, "model", "model_not_found"))
        return _json(_card(name))

    async def health(_: web.Request) -> web.Response:
        return _json({"status": "ok", "pid": os.getpid()})

    async def ready(_: web.Request) -> web.Response:
        # Active probes only: breakers opened by passive ejection must not make every replica
        # unready at once (traffic still flows to them in panic mode).
        healthy = [b.name for b in state.pool.backends if b.probe_ok]
        if not healthy:
            return error_response(RouterError(503, "no healthy backend", code="not_ready"))
        return _json({"status": "ready", "healthy": healthy})

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=state.metrics.render(), headers={"Content-Type": state.metrics.content_type}
        )

    async def backends(_: web.Request) -> web.Response:
        # a discovered replica costs what its config entry says (replay's cost figures)
        prices = state.config.pricing
        return _json(
            [
                {**b.describe(), "usd_per_hour": prices.get(group_of(b.spec.name))}
                for b in state.pool.backends
            ]
        )

    async def policies(request: web.Request) -> web.Response:
        try:
            state.gate.identify(request.headers)  # as the request path: 401 for an unknown key
        except RouterError as exc:
            return error_response(exc)
        default = state.config.default_policy
        return _json(
            [
                {
                    "name": p.name,
                    "type": p.type,
                    "default": p.name == default,
                    "slo": _slo(state.slo.get(p.name)),
                }
                for p in state.config.policies
            ]
        )

    r = app.router
    for path, serve in proxied_routes(state).items():
        r.add_post(path, _on_aiohttp(serve))
    r.add_get("/v1/models", models)
    r.add_get("/v1/models/{model:.+}", model)  # ids may hold a slash (org/name)
    r.add_get("/health", health)
    r.add_get("/ready", ready)
    r.add_get("/metrics", metrics)
    r.add_get("/turnout/backends", backends)
    r.add_get(POLICIES_PATH, policies)


async def batch_off(_: web.Request) -> web.Response:
    """The Batch API's routes in a config without ``batch``: say how to turn it on."""
    message = (
        "the Batch API (/v1/files, /v1/batches) is off in this router's config: add a "
        "'batch:' section to turn it on (docs/router.md#batch-api)"
    )
    return error_response(RouterError(404, message, code="batch_api_off"))


def _slo(targets: Mapping[RequestClass, Slo] | None) -> dict[str, dict[str, float]] | None:
    """The class targets a policy's requests are judged against (goodput), or None."""
    if targets is None:
        return None
    return {c: {"ttft_s": t.ttft_s, "tpot_s": t.tpot_s} for c, t in sorted(targets.items())}


def _card(model: str) -> dict[str, object]:
    """One model as ``/v1/models`` lists it."""
    return {"id": model, "object": "model", "created": 0, "owned_by": "turnout"}


def _json(doc: object) -> web.Response:
    return web.Response(body=orjson.dumps(doc), content_type="application/json")


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown routes and wrong methods answer in OpenAI's error shape too."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return error_response(RouterError(404, f"no route {request.path}", code="not_found"))
    except web.HTTPMethodNotAllowed:
        message = f"method {request.method} not allowed on {request.path}"
        return error_response(RouterError(405, message, code="method_not_allowed"))


async def server_header(_: web.Request, response: web.StreamResponse) -> None:
    """Every answer says ``Server: turnout`` (aiohttp's default names its and Python's
    versions); an engine's own is never passed on (router.proxy.upstream)."""
    response.headers["Server"] = SERVER
