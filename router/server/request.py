"""One request taken by the lean server (router.server.wire): the handler's client."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING

from multidict import CIMultiDictProxy

from router.config.model import LimitSettings
from router.server.answer import Chunked, FlowControl
from router.server.site import check_media, too_large, too_slow

if TYPE_CHECKING:
    from router.server.wire import Wire


class Request:
    """One request taken by the lean server: :class:`router.server.answer.Client`."""

    __slots__ = ("_body", "_complete", "_length", "_waiter", "_wire", "headers", "method", "path")

    def __init__(self, wire: Wire, path: str, headers: CIMultiDictProxy[str], length: int) -> None:
        self._wire = wire
        self.method = "POST"
        self.path = path
        self.headers = headers
        self._length = length
        self._body = bytearray()
        self._complete = False
        self._waiter: asyncio.Future[None] | None = None

    @property
    def flow(self) -> FlowControl:
        return self._wire.flow

    async def body(self, limit: int, limits: LimitSettings) -> bytes:
        check_media(self.headers)
        if self._length > limit:
            raise too_large(limit)
        if not self._complete:  # the rest is on its way: wait, bounded
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(limits.body_seconds):
                    await self._waiter
            except TimeoutError:
                raise too_slow(limits) from None
        return bytes(self._body)

    async def start(self, status: int, headers: Mapping[str, str]) -> Chunked | None:
        return self._wire.start(status, headers)

    def received(self, piece: bytes) -> None:
        self._body += piece

    def completed(self) -> None:
        self._complete = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
