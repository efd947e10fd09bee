"""``/v1/files`` and ``/v1/batches`` in OpenAI's shapes, for the official client.

Files and batches belong to the caller that created them (its API key's tenant id, or the
anonymous caller when keys are optional): another caller gets 404 for them, as for ids that
do not exist. Only ``purpose="batch"`` files can be uploaded; output and error files are the
router's (``batch_output``). A batch is validated when created: it comes back
``in_progress``, or ``failed`` with its ``errors`` (router.batch.validate).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from router.batch.executor import new_id
from router.batch.store import BatchRow, BatchStore, FileRow
from router.batch.validate import parse_input
from router.config.model import BatchSettings
from router.control.auth import Gate
from router.proxy.handler import PATHS
from router.server.errors import RouterError, error_response

WINDOW = re.compile(r"^([1-9][0-9]{0,5})([hms])$")
_UNIT = {"h": 3600, "m": 60, "s": 1}
MAX_METADATA = 16
log = logging.getLogger("router")


def _json(doc: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json")


def file_object(row: FileRow) -> dict[str, object]:
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": row.created_at,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def batch_object(row: BatchRow) -> dict[str, object]:
    errors = None if row.errors is None else {"object": "list", "data": orjson.loads(row.errors)}
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "errors": errors,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": row.created_at,
        "in_progress_at": row.in_progress_at,
        "expires_at": row.expires_at,
        "finalizing_at": row.finalizing_at,
        "completed_at": row.completed_at,
        "failed_at": row.failed_at,
        "expired_at": row.expired_at,
        "cancelling_at": row.cancelling_at,
        "cancelled_at": row.cancelled_at,
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "usage": {
            "input_tokens": row.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": row.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": row.prompt_tokens + row.completion_tokens,
        },
        "metadata": None if row.metadata is None else orjson.loads(row.metadata),
    }


def _page(data: list[dict[str, Any]], limit: int) -> web.Response:
    more = len(data) > limit
    data = data[:limit]
    first = data[0]["id"] if data else None
    last = data[-1]["id"] if data else None
    doc = {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}
    return _json(doc)


def _limit(request: web.Request, default: int, high: int) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise RouterError(400, f"limit must be an integer from 1 to {high}", "limit")
    return int(raw)


class BatchApi:
    """The route handlers over one store."""

    def __init__(
        self,
        store: BatchStore,
        settings: BatchSettings,
        gate: Callable[[], Gate],
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._settings = settings
        self._gate = gate
        self._wake = wake

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/files", self._guarded(self.upload))
        r.add_get("/v1/files", self._guarded(self.list_files))
        r.add_get("/v1/files/{id}", self._guarded(self.get_file))
        r.add_delete("/v1/files/{id}", self._guarded(self.delete_file))
        r.add_get("/v1/files/{id}/content", self._guarded(self.content))
        r.add_post("/v1/batches", self._guarded(self.create))
        r.add_get("/v1/batches", self._guarded(self.list_batches))
        r.add_get("/v1/batches/{id}", self._guarded(self.get_batch))
        r.add_post("/v1/batches/{id}/cancel", self._guarded(self.cancel))

    def _guarded(self, fn: Callable[[web.Request, str], Any]) -> Callable[[web.Request], Any]:
        """``fn`` with the caller's owner id; its RouterErrors answered as OpenAI errors."""

        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                tenant = self._gate().identify(request.headers)
                response: web.StreamResponse = await fn(
                    request, tenant.capture_id if tenant is not None else ""
                )
                return response
            except RouterError as exc:
                return error_response(exc)
            except Exception:  # the store failed: say so in OpenAI's shape, log the why
                log.exception("batch API %s %s failed", request.method, request.path)
                return error_response(RouterError(500, "internal router error", code="internal"))

        return handler

    # files

    async def upload(self, request: web.Request, owner: str) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise RouterError(415, "upload a file as multipart/form-data", code="invalid_request")
        purpose: str | None = None
        filename, content = "", b""
        got_file = False
        try:
            async for part in await request.multipart():
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    purpose = (await self._read_part(part, 64)).decode("utf-8", "replace")
                elif part.name == "file":
                    filename = part.filename or "upload.jsonl"
                    content = await self._read_part(part, self._settings.max_file_bytes)
                    got_file = True
        except (ValueError, AssertionError, HttpProcessingError):  # aiohttp's parse errors
            raise RouterError(
                400, "malformed multipart/form-data body", code="invalid_request"
            ) from None
        if not got_file:
            raise RouterError(400, "the form has no file field", "file")
        if purpose != "batch":
            raise RouterError(
                400, "purpose must be 'batch' (the only one this router keeps)", "purpose"
            )
        row = FileRow(
            new_id("file-"), owner, "batch", filename[:255], len(content), int(time.time())
        )
        await self._store.put_file(row, content)
        return _json(file_object(row))

    async def _read_part(self, part: BodyPartReader, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await part.read_chunk(1 << 16):
            size += len(chunk)
            if size > limit:
                raise RouterError(
                    413, f"{part.name} is limited to {limit} bytes", part.name, "too_large"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    async def list_files(self, request: web.Request, owner: str) -> web.Response:
        limit = _limit(request, 10000, 10000)
        order = request.query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise RouterError(400, "order must be asc or desc", "order")
        rows = await self._store.files(
            owner, request.query.get("purpose"), limit, request.query.get("after"), order == "desc"
        )
        return _page([file_object(r) for r in rows], limit)

    async def get_file(self, request: web.Request, owner: str) -> web.Response:
        return _json(file_object(await self._file(request, owner)))

    async def _file(self, request: web.Request, owner: str) -> FileRow:
        row = await self._store.file(owner, request.match_info["id"])
        if row is None:
            raise RouterError(404, "no such file", "file_id", "not_found")
        return row

    async def delete_file(self, request: web.Request, owner: str) -> web.Response:
        file_id = request.match_info["id"]
        if not await self._store.delete_file(owner, file_id):
            raise RouterError(404, "no such file", "file_id", "not_found")
        return _json({"id": file_id, "object": "file", "deleted": True})

    async def content(self, request: web.Request, owner: str) -> web.Response:
        data = await self._store.file_content(owner, request.match_info["id"])
        if data is None:
            raise RouterError(404, "no such file", "file_id", "not_found")
        return web.Response(body=data, content_type="application/jsonl")

    # batches

    async def create(self, request: web.Request, owner: str) -> web.Response:
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise RouterError(400, "the body is not valid JSON") from None
        if not isinstance(doc, dict):
            raise RouterError(400, "the body must be a JSON object")
        endpoint = doc.get("endpoint")
        if not isinstance(endpoint, str) or endpoint not in PATHS.values():
            known = ", ".join(PATHS.values())
            raise RouterError(400, f"endpoint must be one of {known}", "endpoint")
        window = doc.get("completion_window")
        match = WINDOW.match(window) if isinstance(window, str) else None
        if match is None or not isinstance(window, str):
            raise RouterError(
                400, "completion_window must be like 24h (or 30m, 90s)", "completion_window"
            )
        metadata = doc.get("metadata")
        if metadata is not None and not _metadata_ok(metadata):
            raise RouterError(
                400, f"metadata must map at most {MAX_METADATA} strings to strings", "metadata"
            )
        file_id = doc.get("input_file_id")
        source = await self._store.file(owner, file_id) if isinstance(file_id, str) else None
        if source is None or source.purpose != "batch":
            raise RouterError(404, "no such batch input file", "input_file_id", "not_found")
        content = await self._store.file_content(owner, source.id) or b""
        lines, problems = await asyncio.to_thread(
            parse_input, content, endpoint, self._settings.max_lines
        )
        now = int(time.time())
        expires = now + int(match.group(1)) * _UNIT[match.group(2)]
        row = BatchRow(
            id=new_id("batch_"),
            owner=owner,
            endpoint=endpoint,
            input_file_id=source.id,
            completion_window=window,
            status="failed" if problems else "in_progress",
            created_at=now,
            expires_at=expires,
            in_progress_at=None if problems else now,
            failed_at=now if problems else None,
            errors=orjson.dumps([p.to_dict() for p in problems]) if problems else None,
            metadata=None if metadata is None else orjson.dumps(metadata),
            total=len(lines) if not problems else 0,
        )
        await self._store.create_batch(row, [] if problems else lines)
        self._wake()
        return _json(batch_object(row))

    async def list_batches(self, request: web.Request, owner: str) -> web.Response:
        limit = _limit(request, 20, 100)
        rows = await self._store.batches(owner, limit, request.query.get("after"))
        return _page([batch_object(r) for r in rows], limit)

    async def get_batch(self, request: web.Request, owner: str) -> web.Response:
        row = await self._store.batch(owner, request.match_info["id"])
        if row is None:
            raise RouterError(404, "no such batch", "batch_id", "not_found")
        return _json(batch_object(row))

    async def cancel(self, request: web.Request, owner: str) -> web.Response:
        row = await self._store.cancel(owner, request.match_info["id"], int(time.time()))
        if row is None:
            raise RouterError(404, "no such batch", "batch_id", "not_found")
        if row.status not in ("cancelling", "cancelled"):
            raise RouterError(409, f"a {row.status} batch cannot be cancelled", code="conflict")
        self._wake()
        return _json(batch_object(row))


def _metadata_ok(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= MAX_METADATA
        and all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= 512 for k, v in value.items()
        )
    )
