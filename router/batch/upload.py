"""``POST /v1/files``: the multipart form read as it arrives, its file streamed to the store.

The form must come uncompressed: a compressed one would let a few hundred KiB on the wire
become the whole file-size limit on disk (and the official client never compresses), so a
``Content-Encoding`` other than ``identity`` is refused with 415 before a byte is read. The
file is at most ``batch.max_file_bytes`` (413 as soon as it passes), the whole form must
arrive within ``limits.body_seconds`` (408), and it is written a chunk at a time
(router.batch.content): what was written of a form refused or abandoned is deleted.
"""

from __future__ import annotations

import asyncio
import time

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from router.batch.content import FileWriter
from router.batch.store import BatchStore, FileRow
from router.config.model import LimitSettings
from router.server.errors import RouterError
from router.server.site import too_slow

FORM_SLACK = 64 * 1024
"""What a form may hold besides its file: boundaries, part headers, ``purpose``."""
_PIECE = 1 << 16


async def receive(
    request: web.Request, store: BatchStore, owner: str, limit: int, limits: LimitSettings
) -> FileRow:
    """The uploaded file, stored as ``owner``'s."""
    if not request.content_type.startswith("multipart/"):
        raise RouterError(415, "upload a file as multipart/form-data", code="invalid_request")
    encodings = [e.strip().lower() for e in request.headers.getall("Content-Encoding", ())]
    if any(e not in ("", "identity") for e in encodings):
        message = "upload the form uncompressed (Content-Encoding: identity)"
        raise RouterError(415, message, "Content-Encoding", "unsupported_media_type")
    if request.content_length is not None and request.content_length > limit + FORM_SLACK:
        raise _too_large(limit)
    writer = FileWriter(store)
    try:
        try:
            async with asyncio.timeout(limits.body_seconds):
                purpose, filename = await _read_form(request, writer, limit)
        except TimeoutError:
            raise too_slow(limits) from None
        if purpose != "batch":
            raise RouterError(
                400, "purpose must be 'batch' (the only one this router keeps)", "purpose"
            )
        await writer.close()
    except BaseException:
        await writer.discard()
        raise
    # From here the content is whole: its row goes in or (cancelled before it could) its
    # chunks are left to the sweep.
    row = FileRow(writer.file_id, owner, "batch", filename[:255], writer.size, int(time.time()))
    await store.put_file(row)
    return row


async def _read_form(
    request: web.Request, writer: FileWriter, limit: int
) -> tuple[str | None, str]:
    """The form's purpose and file name, its file written to ``writer``."""
    purpose: str | None = None
    filename: str | None = None
    try:
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):
                continue  # a nested form: read past by the reader
            if part.name == "purpose":
                purpose = (await _small_part(part, 64)).decode("utf-8", "replace")
            elif part.name == "file":
                if filename is not None:
                    raise RouterError(400, "the form has more than one file field", "file")
                filename = part.filename or "upload.jsonl"
                while chunk := await part.read_chunk(_PIECE):
                    if writer.size + len(chunk) > limit:
                        raise _too_large(limit)
                    await writer.write(chunk)
    except (ValueError, AssertionError, HttpProcessingError):  # aiohttp's parse errors
        message = "malformed multipart/form-data body"
        raise RouterError(400, message, code="invalid_request") from None
    if filename is None:
        raise RouterError(400, "the form has no file field", "file")
    return purpose, filename


async def _small_part(part: BodyPartReader, limit: int) -> bytes:
    """A form field of at most ``limit`` bytes (413 past it)."""
    data = b""
    while chunk := await part.read_chunk(_PIECE):
        data += chunk
        if len(data) > limit:
            message = f"{part.name} is limited to {limit} bytes"
            raise RouterError(413, message, part.name, "too_large")
    return data


def _too_large(limit: int) -> RouterError:
    return RouterError(413, f"file is limited to {limit} bytes", "file", "too_large")
