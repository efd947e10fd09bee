"""A generation's answer: one SSE event per chunk the engine emits, or one JSON body once
the whole output is done (emulator.server hands each request's :class:`Job` here)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiohttp import web

from emulator.api import Generation
from emulator.faults import FaultPlan
from emulator.metrics import EngineMetrics
from emulator.model import Sequence
from emulator.responses import ResponseFraming

_DONE = b"data: [DONE]\n\n"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(slots=True)
class Job:
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


def _usage(prompt: int, completion: int, cached: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _abort(request: web.Request) -> None:
    """Drop the connection without a proper end (the drop_after fault)."""
    if request.transport is not None:
        request.transport.abort()
    raise asyncio.CancelledError


async def stream(
    request: web.Request, metrics: EngineMetrics, job: Job, wake: asyncio.Event
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
    job: Job,
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


async def whole(
    request: web.Request,
    metrics: EngineMetrics,
    job: Job,
    wake: asyncio.Event,
    held: Callable[[web.Request, Sequence], dict[str, object] | None],
) -> web.StreamResponse:
    """Wait for the whole output, then answer with one JSON body (with the
    ``kv_transfer_params`` that ``held`` gives once the output is done, for a prefill whose
    blocks are held)."""
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
    kv = held(request, seq)
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
