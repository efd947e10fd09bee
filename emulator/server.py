"""The emulator's HTTP surface, shaped like vLLM's OpenAI-compatible server.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(emulator/responses.py), ``POST /v1/embeddings``,
``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``, and the prefill side of a KV pull, ``POST /kv_transfer/pull``
(emulator/kvhttp.py). Generation requests are validated, given a fault plan, turned into a
:class:`~emulator.model.Sequence` and handed to the :class:`~emulator.driver.Driver`; the
handler then writes one SSE event per chunk the engine emits (emulator/answer.py). Every
error is OpenAI's error JSON with vLLM's status.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from emulator.answer import Job, stream, whole
from emulator.api import (
    Api,
    ApiError,
    check_context,
    parse_generation,
    parse_json,
)
from emulator.driver import Driver
from emulator.faults import HEADER, injected_error, plan_for
from emulator.kvhttp import PULL_PATH, answer_params, parse_params, pull
from emulator.metrics import EngineMetrics
from emulator.model import Engine, Sequence
from emulator.profiles import Profile
from emulator.prompt import output_ids, prompt_ids
from emulator.surface import detokenize_body, embeddings_body, models_body, tokenize_body
from emulator.text import natural_length, output_pieces, request_rng


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """How one emulator process is configured."""

    profile: Profile
    model: str
    time_scale: float = 1.0
    seed: int = 0


@dataclass(slots=True)
class _State:
    options: ServerOptions
    driver: Driver
    metrics: EngineMetrics
    fault_rng: random.Random
    created: int
    http: aiohttp.ClientSession  # pulls KV blocks from prefill engines
    engine_id: str


STATE = web.AppKey("emulator_state", _State)
OPTIONS = web.AppKey("emulator_options", ServerOptions)


def _error_response(err: ApiError) -> web.Response:
    return web.Response(status=err.status, body=err.body(), content_type="application/json")


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Turn validation errors and unknown routes into OpenAI error JSON."""
    try:
        return await handler(request)
    except ApiError as err:
        return _error_response(err)
    except web.HTTPNotFound:
        return _error_response(ApiError(404, f"Not found: {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        message = f"Method {request.method} not allowed on {request.path}"
        return _error_response(ApiError(405, message))
    except web.HTTPException as exc:  # e.g. 413 for a body over client_max_size
        return _error_response(ApiError(exc.status, exc.reason))


def _generator(api: Api) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _generate(request, api)

    return handler


def request_identity(doc: dict[str, object]) -> bytes:
    """The bytes that seed a request's output: its JSON, keys sorted, without
    ``stream_options`` (asking for usage must not change the text, as on a real engine)."""
    return orjson.dumps(
        {k: v for k, v in doc.items() if k != "stream_options"}, option=orjson.OPT_SORT_KEYS
    )


_ID_PREFIX: dict[Api, str] = {"chat": "chatcmpl-", "completions": "cmpl-", "responses": "resp_"}


async def _generate(request: web.Request, api: Api) -> web.StreamResponse:
    state = request.app[STATE]
    opts = state.options
    started = time.perf_counter()
    doc = parse_json(await request.read())
    gen = parse_generation(doc, api=api, served=opts.model)
    plan = plan_for(request.headers.get(HEADER), opts.profile.faults, state.fault_rng)
    if plan.stall:
        await asyncio.sleep(plan.stall)
    if plan.status is not None:
        raise injected_error(plan.status)
    cap = check_context(gen.prompt_tokens, gen.max_tokens, opts.profile.max_model_len)
    engine = state.driver.engine
    limit = opts.profile.faults.max_waiting
    if limit is not None and engine.num_waiting >= limit:
        raise ApiError(503, f"Engine overloaded: {engine.num_waiting} requests already waiting.")
    rng = request_rng(opts.seed, request_identity(doc))
    length = cap if gen.ignore_eos else natural_length(rng, opts.profile.natural_output_tokens)
    length = max(min(length, cap), gen.min_tokens, 1)
    finish = "length" if length >= cap else "stop"
    if gen.prompt_tokens + length > engine.capacity_tokens():
        raise ApiError(
            400,
            f"The request needs {gen.prompt_tokens + length} tokens of KV cache but one engine "
            f"rank holds {engine.capacity_tokens()}.",
            "max_tokens",
        )
    pieces = output_pieces(rng, length)
    seq = Sequence(
        prompt_tokens=gen.prompt_tokens,
        output_tokens=length,
        priority=gen.priority,
        rng=random.Random(rng.getrandbits(64)),
        tokens=(*prompt_ids(doc, api), *output_ids(pieces)),
    )
    await _transfer(request, state, doc, seq)
    plan.mark(seq, opts.profile.faults)
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    job = Job(
        doc=doc,
        gen=gen,
        seq=seq,
        pieces=pieces,
        plan=plan,
        request_id=request_id,
        rid=_ID_PREFIX[api] + request_id,
        finish=finish,
        started=started,
        created=int(time.time()),
    )
    state.metrics.prompt_tokens.inc(gen.prompt_tokens)
    wake = state.driver.submit(seq, started)
    try:
        if gen.stream:
            return await stream(request, state.metrics, job, wake)
        return await whole(request, state.metrics, job, wake, _held_params)
    finally:
        state.driver.release(seq)


async def _transfer(
    request: web.Request, state: _State, doc: dict[str, object], seq: Sequence
) -> None:
    """Honour the body's ``kv_transfer_params`` as the engine's role allows: hold the KV for
    a decode engine, or pull it from a prefill engine (prefilling here when that fails)."""
    params = parse_params(doc)
    role = state.options.profile.role
    if params is None:
        return
    if params.remote_decode and role != "decode":
        seq.hold_kv = True
    if params.remote_prefill and role != "prefill":
        tokens = await pull(state.http, params) if params.engine_id else None
        if tokens is None:
            state.driver.engine.link.failed += 1
        else:  # the last prompt token is computed here, as vLLM's decode engine does
            seq.remote_tokens = min(tokens, seq.prompt_tokens - 1)


async def _kv_pull(request: web.Request) -> web.Response:
    """A decode engine takes the blocks held under ``remote_request_id`` (404: none)."""
    state = request.app[STATE]
    doc = parse_json(await request.read())
    tid, engine = doc.get("remote_request_id"), doc.get("remote_engine_id")
    tokens = None
    if isinstance(tid, str) and engine == state.engine_id:
        tokens = state.driver.hand_over(tid)
    if tokens is None:
        raise ApiError(404, "No KV blocks are held under that id (expired or never held).")
    body = orjson.dumps({"prompt_tokens": tokens})
    return web.Response(body=body, content_type="application/json")


def _held_params(request: web.Request, seq: Sequence) -> dict[str, object] | None:
    """The ``kv_transfer_params`` of a prefill whose blocks are held (else None)."""
    if not seq.transfer_id:
        return None
    state = request.app[STATE]
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    where = (str(sock[0]), int(sock[1])) if sock else ("127.0.0.1", 0)
    profile = state.options.profile
    return answer_params(profile, state.engine_id, seq.transfer_id, seq.prompt_tokens, where)


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = models_body(state.options.model, state.options.profile.max_model_len, state.created)
    return web.Response(body=body, content_type="application/json")


async def _tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    doc = parse_json(await request.read())
    body = tokenize_body(doc, state.options.model, state.options.profile.max_model_len)
    return web.Response(body=body, content_type="application/json")


async def _detokenize(request: web.Request) -> web.Response:
    doc = parse_json(await request.read())
    body = detokenize_body(doc, request.app[STATE].options.model)
    return web.Response(body=body, content_type="application/json")


async def _embeddings(request: web.Request) -> web.Response:
    state = request.app[STATE]
    doc = parse_json(await request.read())
    opts = state.options
    body = embeddings_body(doc, opts.model, opts.seed, opts.profile.embedding_dim)
    return web.Response(body=body, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


async def _lifespan(app: web.Application) -> AsyncIterator[None]:
    opts = app[OPTIONS]
    engine = Engine(opts.profile, seed=opts.seed)
    metrics = EngineMetrics(engine, opts.model, opts.time_scale)
    driver = Driver(engine, opts.time_scale, metrics.pulled)
    http = aiohttp.ClientSession()
    app[STATE] = _State(
        opts, driver, metrics, random.Random(opts.seed), int(time.time()), http, uuid.uuid4().hex
    )
    driver.start()
    yield
    await driver.stop()
    await http.close()


def build_app(options: ServerOptions) -> web.Application:
    """The aiohttp application for one emulated engine."""
    app = web.Application(middlewares=[_errors], client_max_size=8 * 1024 * 1024)
    app[OPTIONS] = options
    app.cleanup_ctx.append(_lifespan)
    app.router.add_post("/v1/chat/completions", _generator("chat"))
    app.router.add_post("/v1/completions", _generator("completions"))
    app.router.add_post("/v1/responses", _generator("responses"))
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_post("/tokenize", _tokenize)
    app.router.add_post("/detokenize", _detokenize)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post(PULL_PATH, _kv_pull)
    return app
