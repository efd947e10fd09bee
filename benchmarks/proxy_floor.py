"""The floor of Turnout's architecture: a proxy with its server and upstream side and
nothing else, for benchmarks/proxy_versus.py's side-by-side.

    python -m benchmarks.proxy_floor UPSTREAM_URL [--lean]

The router's server (aiohttp's, or with ``--lean`` the lean HTTP/1.1 server of
router/server/wire.py that serves the router's proxied routes) in front of
router.proxy.connection's upstream client (the router's own), one uvloop worker: read the
body, send it upstream, pass the answer back (SSE chunk by chunk, straight to the transport,
as router.proxy.relay does). No classification, policy, admission, metrics, logging or checks:
whatever the router costs above this row is its own request handling; this row is what
remains without it.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvloop
from aiohttp import web

from router.config.model import LimitSettings
from router.proxy.keepalive import ConnectionPool
from router.proxy.origin import request_head, split_url
from router.server.answer import Answer, Client, Serve
from router.server.lean import Connections, LeanSite
from router.server.site import AiohttpClient

IDLE = LimitSettings().upstream_idle_seconds  # the default `limits` keeps an upstream idle

READY = "floor listening on "
PATH = "/v1/chat/completions"
_PASSED = ("X-Bench-Gap-Ms", "X-Bench-Chunks")  # the bench upstream's pacing knobs
_LIMITS = LimitSettings()
_MAX_BODY = 1 << 20


def forward_to(upstream: str) -> Serve:
    """The floor's one route: the request upstream, its answer back."""
    pool = ConnectionPool(IDLE)
    origin, path = split_url(upstream + PATH)

    async def forward(client: Client) -> Answer | None:
        body = await client.body(_MAX_BODY, _LIMITS)
        headers = {"Content-Type": "application/json"}
        headers.update((k, v) for k in _PASSED if (v := client.headers.get(k)) is not None)
        conn, head = await pool.request(
            origin, request_head(origin, path, headers, len(body)), body,
            connect_timeout=None, deadline=60.0,
        )  # fmt: skip
        try:
            kind = {"Content-Type": head.headers.get("Content-Type", "")}
            if not kind["Content-Type"].startswith("text/event-stream"):
                return Answer(head.status, kind, await conn.read())
            out = await client.start(head.status, kind)
            assert out is not None
            conn.stream(out.write)
            await conn.finished()
            await out.end()
            return None
        finally:
            pool.release(conn)

    return forward


async def _serve(upstream: str, lean: bool) -> None:
    forward = forward_to(upstream)

    async def on_aiohttp(request: web.Request) -> web.StreamResponse:
        return await AiohttpClient(request).answer(forward)

    app = web.Application()
    app.router.add_post(PATH, on_aiohttp)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    site: web.BaseSite
    if lean:
        site = LeanSite(runner, sock, _LIMITS, {}, backlog=2048, routes={PATH: forward},
                        max_body=_MAX_BODY, connections=Connections())  # fmt: skip
    else:
        site = web.SockSite(runner, sock, backlog=2048)
    await site.start()
    print(f"{READY}http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    uvloop.run(_serve(sys.argv[1], "--lean" in sys.argv[2:]))


if __name__ == "__main__":
    main()
