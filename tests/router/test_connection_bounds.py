"""What a backend's body may cost the router's HTTP client: bounded by the read limit however
it is chunked, and refused whole past it when the reader does not truncate."""

from __future__ import annotations

from contextlib import closing

import pytest

from router.config.model import LimitSettings
from router.proxy.connection import BodyTooLarge
from router.proxy.keepalive import ConnectionPool
from tests.router.rawserver import Backend, answer_once, chunk, start

IDLE = LimitSettings().upstream_idle_seconds  # the default `limits` keeps an upstream idle

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def _tiny_chunks(body: bytes) -> bytes:
    return HEAD + b"".join(chunk(body[i : i + 1]) for i in range(len(body))) + b"0\r\n\r\n"


@pytest.mark.parametrize(("limit", "reused"), [(None, True), (2999, False), (7, False)])
async def test_one_byte_chunks_read_to_the_limit(limit: int | None, reused: bool) -> None:
    body = (bytes(range(256)) * 12)[:3000]  # 3000 chunks of one byte

    async with Backend(answer_once(_tiny_chunks(body))) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            assert await conn.read(limit) == body[:limit]
            assert conn.reusable is reused
            pool.release(conn)


async def test_garbage_after_a_whole_response_keeps_its_body() -> None:
    async with Backend(answer_once(_tiny_chunks(b"whole") + b"garbage\r\n")) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            assert await conn.read() == b"whole"
            assert not conn.reusable
            pool.release(conn)


@pytest.mark.parametrize("limit", [2999, 3000])
async def test_read_without_truncating_refuses_a_longer_body(limit: int) -> None:
    body = b"y" * 3000

    async with Backend(answer_once(_tiny_chunks(body))) as backend:
        with closing(ConnectionPool(IDLE)) as pool:
            conn = await start(pool, backend.origin)
            await conn.head()
            if limit < len(body):
                with pytest.raises(BodyTooLarge):
                    await conn.read(limit, truncate=False)
                assert not conn.reusable
            else:
                assert await conn.read(limit, truncate=False) == body
            pool.release(conn)
