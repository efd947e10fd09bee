"""The lean server's site (router.server.wire) and the open connections it keeps: counted
for the connection cap beside aiohttp's, closed by the drain, with the ``Date`` their answers
carry."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Mapping
from typing import Any

from router.server.answer import Serve
from router.server.site import GuardedSite, OpenConnections
from router.server.wire import Wire


class _Date:
    """The ``Date`` header's value, formatted once a second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self._value = email.utils.formatdate(second, usegmt=True).encode()
        return self._value


class Connections(OpenConnections):
    """The open connections of one site (aiohttp's are counted too: the cap counts them all);
    the lean ones are held, for the drain to close, with the ``Date`` their answers carry."""

    def __init__(self) -> None:
        super().__init__()
        self._all: set[Wire] = set()
        self.closing = False
        self.date = _Date()

    @property
    def lean(self) -> int:
        """How many of the open connections the lean server serves."""
        return len(self._all)

    def add(self, wire: Wire) -> None:
        self._all.add(wire)

    def discard(self, wire: Wire) -> None:
        self._all.discard(wire)

    def stop(self) -> None:
        """Close idle connections now; the others once their answer is out."""
        self.closing = True
        for wire in list(self._all):
            wire.close_if_idle()

    async def close(self, grace: float) -> None:
        """Close every connection: a request still open gets ``grace`` seconds to finish its
        record after its client is cut off (its task is cancelled)."""
        tasks = [task for wire in list(self._all) if (task := wire.abort()) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=grace)


class LeanSite(GuardedSite):
    """A :class:`GuardedSite` whose connections start on the lean server (:class:`Wire`)
    and are handed to aiohttp's guarded handler for what the lean server does not take."""

    __slots__ = ("_max_body", "_routes", "connections")

    def __init__(
        self,
        *args: Any,
        routes: Mapping[str, Serve],
        max_body: int,
        connections: Connections,
        **kwargs: Any,
    ) -> None:
        """``args``/``kwargs``: :class:`GuardedSite`'s; ``routes``: the lean server's, by
        path; ``max_body``: the body limit (a larger declared body goes to aiohttp)."""
        super().__init__(*args, opened=connections, **kwargs)
        self._routes = {path.encode(): serve for path, serve in routes.items()}
        self._max_body = max_body
        self.connections = connections

    def connection(self) -> asyncio.Protocol:
        return Wire(self._routes, self._limits, self._max_body, self.connections, self.guarded)

    async def stop(self) -> None:
        """Stop accepting; idle lean connections close now, the others after their answer
        (the rest go when the app shuts down: :meth:`Connections.close`)."""
        await super().stop()
        self.connections.stop()
