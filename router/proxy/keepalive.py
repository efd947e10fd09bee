"""Idle keep-alive connections to backends, per origin (router.proxy.connection carries one
exchange each)."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque

from router.config.backends import ClientTls
from router.proxy.connection import (
    Connection,
    ConnectTimeout,
    ResponseHead,
    UpstreamError,
    UpstreamTimeout,
    reason_of,
)
from router.proxy.origin import Origin, split_url


class ConnectionPool:
    """Idle keep-alive connections per backend origin; one exchange per connection."""

    def __init__(self, idle_seconds: float) -> None:
        """``idle_seconds``: how long an unused connection is kept
        (``limits.upstream_idle_seconds``)."""
        # Keyed by TLS settings too: a backend must never get a connection another backend
        # on the same address opened with other certificates.
        self._idle: dict[tuple[Origin, ClientTls | None], deque[Connection]] = {}
        self._idle_seconds = idle_seconds
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def acquire(
        self, origin: Origin, connect_timeout: float | None, tls: ClientTls | None = None
    ) -> Connection:
        """An idle connection to ``origin``, else a new one (raises :class:`UpstreamError`).

        ``tls``: the backend's TLS client side (an ``https`` origin without it verifies
        against the system's trust store)."""
        idle = self._idle.get((origin, tls))
        if idle:
            oldest_ok = time.monotonic() - self._idle_seconds
            while idle:
                conn = idle.pop()  # the most recently used: the least likely to be closing
                if conn.reusable and conn.idle_since >= oldest_ok:
                    return conn
                conn.abort()
        return await self._connect(origin, connect_timeout, tls)

    async def request(
        self,
        origin: Origin,
        head: bytes,
        body: bytes,
        *,
        connect_timeout: float | None,
        deadline: float | None,
        tls: ClientTls | None = None,
    ) -> tuple[Connection, ResponseHead]:
        """Send one request and wait for the response's head; the caller then owns ``conn``.

        A pooled connection that the backend closes without a byte of answer was closing
        as the request went out (its idle keep-alive ran out): the request is sent once
        more on a new connection rather than counted against the backend. On any failure
        (or cancellation) the connection is dropped.
        """
        conn = await self.acquire(origin, connect_timeout, tls)
        try:
            conn.send(head, body, deadline=deadline)
            try:
                return conn, await conn.head()
            except UpstreamError as exc:
                if isinstance(exc, UpstreamTimeout) or conn.exchanges == 1 or conn.answered:
                    raise
            conn.abort()
            conn = await self._connect(origin, connect_timeout, tls)
            conn.send(head, body, deadline=deadline)
            return conn, await conn.head()
        except BaseException:
            conn.abort()
            raise

    def release(self, conn: Connection) -> None:
        """Keep ``conn`` for the next request if it is reusable, else close it."""
        if self._closed or not conn.reusable:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault((conn.origin, conn.tls), deque()).append(conn)

    def forget(self, url: str, tls: ClientTls | None) -> None:
        """Close the idle connections to a backend that left (``url``: its base URL).

        Its streams still open hand their connections back later; those, and any other
        origin's that nobody asked for in ``idle_seconds``, go at the next call, so
        backends that come and go leave nothing behind for long.
        """
        for conn in self._idle.pop((split_url(url)[0], tls), ()):
            conn.abort()
        oldest_ok = time.monotonic() - self._idle_seconds
        for key, idle in list(self._idle.items()):
            while idle and idle[0].idle_since < oldest_ok:  # oldest first: released in order
                idle.popleft().abort()
            if not idle:
                del self._idle[key]

    def close(self) -> None:
        """Close every idle connection (connections in use close on release)."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()

    async def _connect(
        self, origin: Origin, timeout: float | None, tls: ClientTls | None
    ) -> Connection:
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            if tls is None and self._tls is None:
                self._tls = ssl.create_default_context()
            context = tls.context if tls is not None else self._tls
        server_name = tls.server_name if tls is not None and tls.server_name else None
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(origin, tls),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=server_name if context is not None else None,
                )
        except TimeoutError:  # ours, or the kernel's own (ETIMEDOUT) when timeout is None
            after = f" after {timeout:g} s" if timeout is not None else ""
            raise ConnectTimeout(f"connect timed out{after}") from None
        except OSError as exc:
            raise UpstreamError(f"connect failed ({reason_of(exc)})") from None
        return conn
