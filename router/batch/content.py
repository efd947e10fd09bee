"""A stored file's content, written and read a chunk at a time (never whole in memory).

:class:`FileWriter` gathers what it is given into chunks of
:data:`~router.batch.db.CHUNK_BYTES` and writes each to the store as it fills, waiting for the
store before taking more (so a fast uploader waits for the disk, not for memory);
:func:`read` yields a file's chunks one store call each.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from router.batch.db import CHUNK_BYTES
from router.batch.store import BatchStore, new_id


class FileGone(Exception):
    """The file's content ended before its size: it was deleted while read."""


class FileWriter:
    """A new file's content, written to the store in chunks; :attr:`file_id` has no row
    until the caller adds one (router.batch.store.BatchStore.put_file)."""

    def __init__(self, store: BatchStore) -> None:
        self._store = store
        self.file_id = new_id("file-")
        self.size = 0
        """Bytes written so far."""
        self._pending = bytearray()
        self._next = 0

    async def write(self, data: bytes) -> None:
        self._pending += data
        self.size += len(data)
        while len(self._pending) >= CHUNK_BYTES:
            await self._flush(CHUNK_BYTES)

    async def close(self) -> None:
        """Write what is left (the last, shorter chunk)."""
        if self._pending:
            await self._flush(len(self._pending))

    async def discard(self) -> None:
        """Give the file up: delete what was written of it, even if the caller is being
        cancelled (a client that went away)."""
        self._pending.clear()
        await asyncio.shield(self._store.drop_chunks(self.file_id))

    async def _flush(self, n: int) -> None:
        piece = bytes(self._pending[:n])
        del self._pending[:n]
        await self._store.put_chunk(self.file_id, self._next, piece)
        self._next += 1


async def read(store: BatchStore, file_id: str, size: int) -> AsyncIterator[bytes]:
    """The ``size`` bytes of the file's content, a chunk at a time; :class:`FileGone` when
    they end early."""
    got, n = 0, 0
    while got < size:
        piece = await store.chunk(file_id, n)
        if piece is None:
            raise FileGone(file_id)
        got += len(piece)
        n += 1
        yield piece
