"""The private loopback listener that batch lines enter the router through.

A batch line is a client request like any other: it goes through the one request path
(router.proxy.handler: classify, admit, policy, failover, metrics, capture). This listener
serves that handler on a loopback port of its own, so a line is served by the process that
took it, whatever other workers share the public port, and uses none of the public site's
connection budget. Only the executor of this process can use it: every request must carry
the random token made at start (anything else gets 403 and the connection is closed); the
tenant the line runs as (the batch's creator) is named by its id in a header and looked up
among the configured keys. It keeps the public site's connection limits (``limits:`` idle,
header and body timeouts, sizes, the stalled-reader timeout and the connection cap).
"""

from __future__ import annotations

import hmac
import secrets
import socket

from aiohttp import web
from aiohttp.typedefs import Handler

from policies.types import Endpoint
from router.proxy.handler import PATHS, RunAs, handle
from router.proxy.state import RouterState
from router.server.errors import RouterError, error_response
from router.server.site import AiohttpClient, GuardedSite, handler_options

TOKEN_HEADER = "X-Turnout-Line-Token"
OWNER_HEADER = "X-Turnout-Batch-Owner"
KEYLESS = "key-"
"""Marks the owner id of a caller of a router that knows no key (router.batch.api): its lines
run as anonymous traffic, as its requests do."""
_RUN_AS = "turnout.run_as"


class LineSite:
    """The listener; :attr:`url` and :attr:`token` once :meth:`start` ran."""

    def __init__(self, state: RouterState) -> None:
        self._state = state
        self.token = secrets.token_urlsafe(32)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        state = self._state
        app = web.Application(
            client_max_size=state.config.listen.max_body_bytes, middlewares=[self._guard]
        )
        for endpoint, path in PATHS.items():
            app.router.add_post(path, self._proxied(endpoint))
        # handler_cancellation: a line given up (shutdown) closes its upstream request at once.
        options = {"access_log": None, **handler_options(state.config.limits)}
        self._runner = web.AppRunner(app, handler_cancellation=True, **options)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(256)
        sock.setblocking(False)
        await GuardedSite(self._runner, sock, state.config.limits, options, backlog=256).start()
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"

    @property
    def draining(self) -> bool:
        """The router is draining: take no new lines (a running one finishes or is cut, and
        given back, at the drain's deadline), so a batch does not hold the exit to it."""
        return self._state.drain.draining

    async def aclose(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _proxied(self, endpoint: Endpoint) -> Handler:
        async def proxied(request: web.Request) -> web.StreamResponse:
            run_as = request[_RUN_AS]
            return await AiohttpClient(request).answer(
                lambda client: handle(client, self._state, endpoint, run_as)
            )

        return proxied

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        token = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            refusal = error_response(RouterError(403, "not a batch line", code="forbidden"))
            refusal.force_close()  # nothing but this process's executor has business here
            return refusal
        owner = request.headers.get(OWNER_HEADER, "")
        keyed = owner and not owner.startswith(KEYLESS)
        tenant = self._state.gate.tenant(owner) if keyed else None
        if keyed and tenant is None:
            message = "the API key that created this batch is no longer configured"
            return error_response(RouterError(401, message, code="invalid_api_key"))
        request[_RUN_AS] = RunAs(tenant)
        return await handler(request)
