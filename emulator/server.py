"""The emulator's HTTP surface, shaped like vLLM's OpenAI-compatible server.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``
(emulator/responses.py), ``POST /v1/embeddings``,
``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models``, ``GET /health``,
``GET /metrics``, and the prefill side of a KV pull, ``POST /kv_transfer/pull``
(emulator/kvhttp.py). Generation requests are validated, given a fault plan, turned into a
:class:`~emulator.model.Sequence` and handed to the :class:`~emulator.driver.Driver`; the
handler then writes one SSE event per chunk the engine emits. Every error is OpenAI's
error JSON with vLLM's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson
from aiohttp import web

from emulator.api import (
    Api,
    ApiError,
    Generation,
    check_context,
    parse_generation,
    parse_json,
)
from emulator.driver import Driver
from emulator.faults import HEADER, FaultPlan, injected_error, plan_for
from emulator.kvhttp import PULL_PATH, answer_params, parse_params, pull
from emulator.metrics import EngineMetrics
from emulator.model import Engine, Sequence
from emulator.profiles import Profile
from emulator.prompt import output_ids, prompt_ids
from emulator.responses import ResponseFraming
from emulator.surface import detokenize_body, embeddings_body, models_body, tokenize_body
from emulator.text import natural_length, output_pieces, request_rng

_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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


@dataclass(slots=True)
class _Job:
    """One generation request on its way through the engine."""

    doc: dict[str, object]
    gen: Generation
    seq: Sequence
    pieces: list[str]
    plan: FaultPlan
    request_id: str  # X-Request-Id as given, or generated
    rid: str  # response id: chatcmpl-, cmpl- or resp_ and the request id
    finish: str
    started: float
    created: int


STATE = web.AppKey("emulator_state", _State)
OPTIONS = web.AppKey("emulator_options", ServerOptions)


class _Chunks:
    """Pre-encoded SSE event framing for one chat or completions stream: only the text
    changes per chunk."""

    __slots__ = ("_chat", "_final", "_gen", "_head", "_meta", "_tail")

    def __init__(self, gen: Generation, rid: str, created: int, finish: str) -> None:
        self._gen = gen
        self._chat = chat = gen.api == "chat"
        obj = "chat.completion.chunk" if chat else "text_completion"
        self._meta = {"id": rid, "object": obj, "created": created, "model": gen.model}
        meta = orjson.dumps(self._meta)
        field = b'"delta":{"content":' if chat else b'"text":'
        close = b"}" if chat else b""
        self._head = b"data: " + meta[:-1] + b',"choices":[{"index":0,' + field
        self._tail = close + b',"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n'
        self._final = close + b',"logprobs":null,"finish_reason":"%s","stop_reason":null}]}\n\n' % (
            finish.encode()
        )

    def opening(self) -> bytes:
        """A chat stream's role chunk (nothing for completions)."""
        if not self._chat:
            return b""
        head = self._head.replace(b'"delta":{"content":', b'"delta":{"role":"assistant","content":')
        return head + b'""' + self._tail

    def chunk(self, text: str, last: bool) -> bytes:
        return self._head + orjson.dumps(text) + (self._final if last else self._tail)

    def closing(self, text: str, prompt: int, output: int, cached: int) -> bytes:
        """The usage chunk if asked for, then ``[DONE]``."""
        if not self._gen.include_usage:
            return _DONE
        doc = {**self._meta, "choices": [], "usage": _usage(prompt, output, cached)}
        return b"data: " + orjson.dumps(doc) + b"\n\n" + _DONE


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


def _usage(prompt: int, completion: int, cached: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


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
    job = _Job(
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
            return await _stream(request, state.metrics, job, wake)
        return await _whole(request, state.metrics, job, wake)
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


def _abort(request: web.Request) -> None:
    """Drop the connection without a proper end (the drop_after fault)."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError


async def _stream(
    request: web.Request, metrics: EngineMetrics, job: _Job, wake: asyncio.Event
) -> web.StreamResponse:
    """Write one SSE event per engine chunk, as the chunks arrive.

    A client that goes away mid-stream is an expected end: a reset often reaches the
    transport before aiohttp cancels this handler, so a write meets a closing transport.
    The stream then just stops (aiohttp's finish of the response sees the closed connection
    and logs nothing), rather than each cut stream logging a traceback."""
    resp = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-Id": job.request_id})
    with contextlib.suppress(ConnectionResetError):
        await _events(request, resp, metrics, job, wake)
    return resp


async def _events(
    request: web.Request,
    resp: web.StreamResponse,
    metrics: EngineMetrics,
    job: _Job,
    wake: asyncio.Event,
) -> None:
    gen, seq, pieces = job.gen, job.seq, job.pieces
    await resp.prepare(request)
    framing: _Chunks | ResponseFraming
    if gen.api == "responses":
        framing = ResponseFraming(job.doc, gen, job.rid, job.created, job.finish)
    else:
        framing = _Chunks(gen, job.rid, job.created, job.finish)
    opening = framing.opening()
    if opening:
        await resp.write(opening)
    drop = job.plan.drop_after
    if drop == 0:
        _abort(request)
    observe_itl = metrics.itl.observe
    length = seq.output_tokens
    sent = 0
    last = 0.0
    while sent < length:
        await wake.wait()
        wake.clear()
        chunks, seq.chunks = seq.chunks, []
        for n in chunks:
            text = "".join(pieces[sent : sent + n])
            sent += n
            await resp.write(framing.chunk(text, sent >= length))
            now = time.perf_counter()
            if last:
                observe_itl(now - last)
            else:
                metrics.ttft.observe(now - job.started)
            last = now
            if drop is not None and sent >= drop:
                _abort(request)
    metrics.generation_tokens.inc(sent)
    metrics.e2e.observe(time.perf_counter() - job.started)
    # the last events and the stream's end in one write
    closing = framing.closing("".join(pieces), gen.prompt_tokens, sent, seq.cached_tokens)
    await resp.write_eof(closing)


async def _whole(
    request: web.Request, metrics: EngineMetrics, job: _Job, wake: asyncio.Event
) -> web.StreamResponse:
    """Wait for the whole output, then answer with one JSON body."""
    gen, seq, drop = job.gen, job.seq, job.plan.drop_after
    while not seq.done:
        await wake.wait()
        wake.clear()
        seq.chunks.clear()
        if drop is not None and seq.generated >= drop:
            _abort(request)
    n = seq.output_tokens
    metrics.generation_tokens.inc(n)
    metrics.e2e.observe(time.perf_counter() - job.started)
    text = "".join(job.pieces)
    headers = {"X-Request-Id": job.request_id}
    kv = _held_params(request, seq)
    if gen.api == "responses":
        framing = ResponseFraming(job.doc, gen, job.rid, job.created, job.finish)
        response = framing.response(text, gen.prompt_tokens, n, seq.cached_tokens)
        body = orjson.dumps(response if kv is None else {**response, "kv_transfer_params": kv})
        return web.Response(body=body, content_type="application/json", headers=headers)
    if gen.api == "chat":
        message: dict[str, object] = {
            "role": "assistant",
            "content": text,
            "reasoning_content": None,
            "tool_calls": [],
        }
        choice: dict[str, object] = {"index": 0, "message": message}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "prompt_logprobs": None}
        obj = "text_completion"
    choice.update(logprobs=None, finish_reason=job.finish, stop_reason=None)
    usage = _usage(gen.prompt_tokens, n, seq.cached_tokens)
    doc = {"id": job.rid, "object": obj, "created": job.created, "model": gen.model,
           "choices": [choice], "usage": usage}  # fmt: skip
    if kv is not None:
        doc["kv_transfer_params"] = kv
    return web.Response(body=orjson.dumps(doc), content_type="application/json", headers=headers)


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
