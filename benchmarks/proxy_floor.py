"""The floor of Switchyard's architecture: a proxy with its server and upstream side and
nothing else, for benchmarks/proxy_versus.py's side-by-side.

    python -m benchmarks.proxy_floor UPSTREAM_URL

aiohttp's server (as the router's) in front of router.proxy.connection's upstream client (the
router's own), one uvloop worker: read the body, send it upstream, pass the answer back (SSE
chunk by chunk, straight to the transport, as router.proxy.relay does). No classification,
policy, admission, metrics, logging or checks: whatever the router costs above this row is
its own request handling; this row is what remains without it.
"""

from __future__ import annotations

import socket
import sys

import uvloop
from aiohttp import web

from router.proxy.connection import ConnectionPool, request_head, split_url

READY = "floor listening on "
_PASSED = ("X-Bench-Gap-Ms", "X-Bench-Chunks")  # the bench upstream's pacing knobs


def app(upstream: str) -> web.Application:
    pool = ConnectionPool()
    origin, path = split_url(upstream + "/v1/chat/completions")

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        headers.update((k, v) for k in _PASSED if (v := request.headers.get(k)) is not None)
        conn, head = await pool.request(
            origin, request_head(origin, path, headers, len(body)), body,
            connect_timeout=None, deadline=60.0,
        )  # fmt: skip
        try:
            kind = head.headers.get("Content-Type", "")
            if not kind.startswith("text/event-stream"):
                return web.Response(body=await conn.read(), status=head.status, content_type=kind)
            out = web.StreamResponse(status=head.status, headers={"Content-Type": kind})
            out.enable_chunked_encoding()
            await out.prepare(request)
            transport = request.transport
            assert transport is not None
            conn.stream(lambda data: transport.write(b"%x\r\n%b\r\n" % (len(data), data)))
            await conn.finished()
            await out.write_eof()
            return out
        finally:
            pool.release(conn)

    application = web.Application()
    application.router.add_post("/v1/chat/completions", forward)
    return application


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"{READY}http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    web.run_app(app(sys.argv[1]), sock=sock, print=None, access_log=None,
                loop=uvloop.new_event_loop())  # fmt: skip


if __name__ == "__main__":
    main()
