"""ConnectionPool.request: one more try when a pooled connection was closing as it was used.

A backend times out an idle keep-alive connection by closing it; if the router's request goes
out just then, the backend never answers it. Such a request is sent again on a new connection.
A first request on a fresh connection, or one the backend had begun to answer, is not.
"""

from __future__ import annotations

from contextlib import closing

import pytest

from router.config.model import LimitSettings
from router.proxy.connection import UpstreamError
from router.proxy.keepalive import ConnectionPool
from router.proxy.origin import Origin, request_head
from tests.router.rawserver import BODY, OK, Backend, Peer, Script

IDLE = LimitSettings().upstream_idle_seconds  # the default `limits` keeps an upstream idle

PARTIAL = b"HTTP/1.1 200 OK\r\nContent-Le"


def _head(origin: Origin) -> bytes:
    return request_head(origin, "/v1/completions", {}, len(BODY))


def _second_request_dropped(partial: bytes) -> Script:
    """Connection 1 answers one request, then takes the next and closes after ``partial``."""

    async def script(peer: Peer) -> None:
        if peer.n == 1:
            await peer.request()
            await peer.send(OK)
            await peer.request()
            if partial:
                await peer.send(partial)
            return  # Backend aborts the connection
        while True:
            await peer.request()
            await peer.send(OK)

    return script


async def test_a_pooled_connection_closed_without_answer_is_retried_once() -> None:
    async with Backend(_second_request_dropped(b"")) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            head = _head(backend.origin)
            first, _ = await pool.request(
                backend.origin, head, BODY, connect_timeout=1.0, deadline=5.0
            )
            assert await first.read() == b"ok"
            pool.release(first)
            conn, answer = await pool.request(
                backend.origin, head, BODY, connect_timeout=1.0, deadline=5.0
            )
            assert answer.status == 200 and await conn.read() == b"ok"
            assert conn is not first and conn.exchanges == 1
            conn.abort()
    # the dropped request reached connection 1, its second try came on connection 2
    assert backend.accepted == 2 and len(backend.requests) == 3


async def test_a_partly_answered_request_is_not_sent_again() -> None:
    async with Backend(_second_request_dropped(PARTIAL)) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            head = _head(backend.origin)
            first, _ = await pool.request(
                backend.origin, head, BODY, connect_timeout=1.0, deadline=5.0
            )
            await first.read()
            pool.release(first)
            with pytest.raises(UpstreamError):
                await pool.request(backend.origin, head, BODY, connect_timeout=1.0, deadline=5.0)
    assert backend.accepted == 1 and len(backend.requests) == 2


async def test_a_fresh_connection_closed_without_answer_is_not_retried() -> None:
    async def script(peer: Peer) -> None:
        await peer.request()  # and close without a word

    async with Backend(script) as backend:
        with closing(ConnectionPool(IDLE)) as pool, pytest.raises(UpstreamError):
            await pool.request(
                backend.origin, _head(backend.origin), BODY, connect_timeout=1.0, deadline=5.0
            )
    assert backend.accepted == 1 and len(backend.requests) == 1
