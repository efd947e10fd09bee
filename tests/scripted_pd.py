"""A scripted fake vLLM engine of a prefill/decode pair, for the wire-compatibility tests.

``python -m tests.scripted_pd --role prefill|decode [--port 0] [--status N]`` prints
``scripted listening on http://127.0.0.1:PORT`` once it serves. It keeps every generation
request body it gets (``GET /bodies`` lists them, in order) and answers as vLLM does with its
NIXL connector: a prefill answer carries :data:`PARAMS` as ``kv_transfer_params``; a decode
answer is an ordinary completion, streamed or not as asked, with usage when asked. With
``--status N`` every generation request gets vLLM's own error body with that status
(``{"object": "error", "message", "type", "param", "code"}``). The router's probes
(``/health``, ``/v1/models``, ``/metrics``) are answered properly.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import orjson
from aiohttp import web

MODEL = "scripted-model"
PARAMS: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [4, 5, 6],
    "remote_engine_id": "engine-p0",
    "remote_request_id": "cmpl-scripted-0",
    "remote_host": "10.1.2.3",
    "remote_port": 5600,
    "tp_size": 1,
}
"""What the scripted prefill engine answers with (the keys of vLLM's NIXL connector)."""
ERROR_MESSAGE = "scripted failure"
USAGE = {"prompt_tokens": 5, "total_tokens": 7, "completion_tokens": 2}
BODIES = web.AppKey("bodies", list)


def _answer(api: str, doc: dict[str, Any], prefill: bool) -> bytes:
    text = "x" if prefill else "hello there"
    if api == "responses":
        out: dict[str, Any] = {
            "id": "resp_1", "object": "response", "status": "completed", "model": MODEL,
            "output": [{"type": "message", "role": "assistant", "id": "msg_1", "status":
                        "completed", "content": [{"type": "output_text", "text": text,
                                                  "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7},
        }  # fmt: skip
    elif api == "chat":
        message = {"role": "assistant", "content": text}
        out = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "message": message, "finish_reason": "length"}],
               "usage": USAGE}  # fmt: skip
    else:
        out = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
               "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
               "usage": USAGE}  # fmt: skip
    if prefill:
        out["kv_transfer_params"] = PARAMS
    return orjson.dumps(out)


def _events(api: str, doc: dict[str, Any]) -> list[bytes]:
    chat = api == "chat"
    obj = "chat.completion.chunk" if chat else "text_completion"
    out: list[dict[str, object]] = []
    for i, word in enumerate(("hello", " there")):
        finish = "length" if i else None
        choice: dict[str, object] = {"index": 0, "finish_reason": finish}
        choice.update({"delta": {"content": word}} if chat else {"text": word})
        out.append({"id": "c-1", "object": obj, "created": 1, "model": MODEL, "choices": [choice]})
    if (doc.get("stream_options") or {}).get("include_usage"):
        out.append({"id": "c-1", "object": obj, "created": 1, "model": MODEL, "choices": [],
                    "usage": USAGE})  # fmt: skip
    return [b"data: " + orjson.dumps(e) + b"\n\n" for e in out] + [b"data: [DONE]\n\n"]


def _generation(api: str, role: str, status: int | None) -> Any:
    async def handler(request: web.Request) -> web.StreamResponse:
        doc = orjson.loads(await request.read())
        request.app[BODIES].append(doc)
        if status is not None:
            err = {"object": "error", "message": ERROR_MESSAGE, "type": "BadRequestError",
                   "param": None, "code": status}  # fmt: skip
            return web.Response(
                status=status, body=orjson.dumps(err), content_type="application/json"
            )
        if role == "decode" and doc.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for event in _events(api, doc):
                await resp.write(event)
            await resp.write_eof()
            return resp
        body = _answer(api, doc, role == "prefill")
        return web.Response(body=body, content_type="application/json")

    return handler


async def _bodies(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(request.app[BODIES]), content_type="application/json")


async def _models(request: web.Request) -> web.Response:
    data = [{"id": MODEL, "object": "model", "max_model_len": 32768}]
    return web.Response(body=orjson.dumps({"object": "list", "data": data}))


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="")


async def _main(host: str, port: int, role: str, status: int | None) -> None:
    app = web.Application()
    app[BODIES] = []
    for path, api in (("/v1/chat/completions", "chat"), ("/v1/completions", "completions"),
                      ("/v1/responses", "responses")):  # fmt: skip
        app.router.add_post(path, _generation(api, role, status))
    app.router.add_get("/bodies", _bodies)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _ok)
    app.router.add_get("/metrics", _ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    print(f"scripted listening on http://{host}:{runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.scripted_pd")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--role", choices=("prefill", "decode"), required=True)
    parser.add_argument("--status", type=int)
    args = parser.parse_args()
    asyncio.run(_main(args.host, args.port, args.role, args.status))


if __name__ == "__main__":
    main()
