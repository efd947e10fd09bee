"""A shadow backend's answer is read only up to the served path's body bound."""

from __future__ import annotations

import asyncio
from unittest import mock

import aiohttp

from router.proxy.shadow import _bounded


def reader(*chunks: bytes) -> aiohttp.StreamReader:
    protocol = mock.Mock(_reading_paused=False)
    stream = aiohttp.StreamReader(protocol, 2**16, loop=asyncio.get_running_loop())
    for chunk in chunks:
        stream.feed_data(chunk)
    stream.feed_eof()
    return stream


async def test_a_body_within_the_bound_is_read_whole() -> None:
    assert await _bounded(reader(b"ab", b"cd"), 4) == b"abcd"


async def test_a_body_past_the_bound_is_not_held() -> None:
    assert await _bounded(reader(b"ab", b"cd", b"e"), 4) is None
