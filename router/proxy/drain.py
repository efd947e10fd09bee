"""SIGTERM's drain: stop accepting, let open requests run until the deadline, then cut them.

The router drains with its own clock instead of aiohttp's ``shutdown_timeout``: aiohttp waits
that long for handlers, then cancels them and waits that long again, so a drain took twice
its setting and a cut stream ended without a word. Here every open request holds a
:class:`Ticket`; at the deadline each is cut once, in the way its client can read:

- a request whose upstream answered (a stream, or a body being read) has that upstream
  aborted with :class:`ShuttingDown`, so the relay ends a stream with an SSE error event and
  ``data: [DONE]``, and a body not yet sent becomes a 503;
- a request still before that (reading its body, queued for a slot, connecting) has its
  handler task cancelled, and the handler answers 503 (see router.proxy.handler).

The handler then finishes the record as for any other request, so metrics and the capture
line are written before the capture is flushed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from router.proxy.connection import Connection, UpstreamError
from router.server.errors import RouterError

CODE = "shutting_down"
MESSAGE = "the router is shutting down"
CUT_GRACE = 0.25
"""How long cut requests get to write their last bytes (an error event, a 503) before the
server closes their connections: enough for a write to a socket, not for a stalled client."""
CLOSE_SECONDS = 0.1
"""aiohttp's ``shutdown_timeout`` (router.app.serve), which applies once every handler is done:
to answers still being written (aiohttp waits this long, cancels, and waits this long again)."""


class ShuttingDown(UpstreamError):
    """The upstream of a request that was still open at the drain's deadline (aborted)."""


def shutting_down() -> RouterError:
    """The 503 a request gets when the drain cuts it (or it arrives after the cut)."""
    return RouterError(503, MESSAGE, code=CODE, headers={"Retry-After": "1"})


class Ticket:
    """One open request, as the drain sees it; the handler sets :attr:`conn` once its
    upstream has answered."""

    __slots__ = ("_task", "conn", "cut")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self._task = task
        self.conn: Connection | None = None
        self.cut = False
        """True once the drain cut this request (its cancellation is not the client's)."""

    def sever(self) -> None:
        """End the request now (once; the drain calls it at the deadline)."""
        self.cut = True
        if self.conn is not None:
            self.conn.abort(ShuttingDown(MESSAGE))
        elif self._task is not None:
            self._task.cancel()


class Drain:
    """The requests open in one router process (one set add and discard per request)."""

    __slots__ = ("_idle", "_loop", "_open", "cutting", "draining")

    def __init__(self) -> None:
        self._open: set[Ticket] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The app's event loop, once a request came: Python 3.11 makes a system call
        (getpid) each time it is asked for the running loop."""
        self._idle: asyncio.Event | None = None
        self.draining = False
        """SIGTERM came: work the router starts itself (batch lines) is no longer started."""
        self.cutting = False
        """Past the deadline: a request that still arrives is refused at once."""

    def enter(self) -> Ticket:
        """A ticket for the calling handler's request; raises the 503 once cutting."""
        if self.cutting:
            raise shutting_down()
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        ticket = Ticket(asyncio.current_task(loop))
        self._open.add(ticket)
        return ticket

    def leave(self, ticket: Ticket) -> None:
        self._open.discard(ticket)
        if not self._open and self._idle is not None:
            self._idle.set()

    @property
    def open(self) -> int:
        return len(self._open)

    async def run(self, runner: web.BaseRunner, seconds: float) -> int:
        """Stop ``runner`` accepting, wait up to ``seconds`` for open requests, cut the rest
        and close the server; returns how many were cut. Takes ``seconds`` plus at most
        :data:`CUT_GRACE` and twice :data:`CLOSE_SECONDS`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        self.draining = True
        for site in runner.sites:
            await site.stop()  # closes the listening socket: new connections are refused
        if runner.server is not None:
            runner.server.pre_shutdown()  # idle keep-alive connections close now
        await self._quiet(deadline - loop.time())
        cut = list(self._open)
        self.cutting = True
        for ticket in cut:
            ticket.sever()
        if cut:
            await self._quiet(CUT_GRACE)
        await runner.cleanup()
        return len(cut)

    async def _quiet(self, timeout: float) -> None:
        """Wait until no request is open, at most ``timeout`` seconds."""
        if not self._open or timeout <= 0:
            return
        self._idle = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        self._idle = None
