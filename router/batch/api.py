"""``/v1/files`` and ``/v1/batches`` in OpenAI's shapes, for the official client.

Files and batches belong to the API key that created them (its tenant id): another caller
gets 404 for them, as for ids that do not exist, and an ``after`` cursor that is not one of
the caller's ids gives an empty page, as one that does not exist. When the router knows keys,
one it does not know is refused (401), never taken for anonymous; when it knows none, the key
a caller presents is the only thing that tells callers apart, and owns what it creates.
Callers without a key may use the Batch API only with ``batch.anonymous``, as one owner.
Every call counts against the caller's requests per minute and concurrency
(router.control.auth), and keeps the connection limits of every route: a body must arrive
within ``limits.body_seconds``.

Only ``purpose="batch"`` files can be uploaded (router.batch.upload); output and error files
are the router's (``batch_output``). Contents go to and from the store a chunk at a time
(router.batch.content). A batch is validated when created, a chunk at a time: it comes back
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
from aiohttp import web

from router.batch import content
from router.batch.content import FileGone
from router.batch.lines import KEYLESS
from router.batch.store import BatchRow, BatchStore, FileRow, new_id
from router.batch.upload import receive
from router.batch.validate import Validator, load
from router.config.batch import BatchSettings
from router.control.auth import Tenant, digest_of, presented_key, tenant_id
from router.proxy.handler import PATHS
from router.proxy.state import RouterState
from router.server.errors import RouterError, error_response
from router.server.site import read_body

WINDOW = re.compile(r"^([1-9][0-9]{0,5})([hms])$")
_UNIT = {"h": 3600, "m": 60, "s": 1}
MAX_METADATA = 16
MAX_CREATE_BYTES = 64 * 1024
"""A batch's create body (a few ids and at most 16 metadata strings of 512 characters)."""
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
        state: RouterState,
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._settings = settings
        self._state = state
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
        """``fn`` with the caller's owner id, under the caller's limits; its RouterErrors
        answered as OpenAI errors."""

        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                gate = self._state.gate  # a reload swaps it: the one of this request
                tenant = gate.identify(request.headers)  # 401 here when keys are required
                owner = self._owner(tenant, request)
                lease = await gate.admit_call(tenant)
                try:
                    response: web.StreamResponse = await fn(request, owner)
                finally:
                    if lease is not None:
                        lease.release(0)
                return response
            except RouterError as exc:
                refusal = error_response(exc)
                if exc.status == 408:  # the body never came: no waiting for the rest of it
                    refusal.force_close()
                return refusal
            except Exception:  # the store failed: say so in OpenAI's shape, log the why
                log.exception("batch API %s %s failed", request.method, request.path)
                return error_response(RouterError(500, "internal router error", code="internal"))

        return handler

    def _owner(self, tenant: Tenant | None, request: web.Request) -> str:
        """The caller's owner id: its key's tenant id, or ``""`` (anonymous, when allowed)."""
        if tenant is not None:
            return tenant.capture_id
        key = presented_key(request.headers)
        if key is not None:
            if self._state.gate.keyless:
                return KEYLESS + tenant_id(digest_of(key))
            raise RouterError(401, "invalid API key", code="invalid_api_key")
        if not self._settings.anonymous:
            message = "the Batch API needs an API key (batch.anonymous is off)"
            raise RouterError(401, message, code="invalid_api_key")
        return ""

    # files

    async def upload(self, request: web.Request, owner: str) -> web.Response:
        limit, limits = self._settings.max_file_bytes, self._state.config.limits
        return _json(file_object(await receive(request, self._store, owner, limit, limits)))

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

    async def content(self, request: web.Request, owner: str) -> web.StreamResponse:
        """The file a chunk at a time: each is written once the client has taken the last
        (aiohttp's write waits for the socket), so a slow reader holds one chunk, and one
        that reads nothing is cut after ``limits.write_timeout``."""
        row = await self._file(request, owner)
        response = web.StreamResponse(headers={"Content-Type": "application/jsonl"})
        response.content_length = row.bytes
        await response.prepare(request)
        try:
            async for piece in content.read(self._store, row.id, row.bytes):
                await response.write(piece)
            await response.write_eof()
        except ConnectionError:  # the client went away
            pass
        except Exception as exc:  # the head is out: the connection goes, the answer short
            if not isinstance(exc, FileGone):  # (a file deleted meanwhile is no fault)
                log.exception("batch API download of %s failed", row.id)
            response.force_close()
        return response

    # batches

    async def create(self, request: web.Request, owner: str) -> web.Response:
        body = await read_body(request, MAX_CREATE_BYTES, self._state.config.limits)
        try:
            doc = orjson.loads(body)
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
        now = int(time.time())
        row = BatchRow(
            id=new_id("batch_"),
            owner=owner,
            endpoint=endpoint,
            input_file_id=source.id,
            completion_window=window,
            status="validating",
            created_at=now,
            expires_at=now + int(match.group(1)) * _UNIT[match.group(2)],
            metadata=None if metadata is None else orjson.dumps(metadata),
        )
        await self._store.create_batch(row)
        return _json(batch_object(await self._validate(row, source)))

    async def _validate(self, row: BatchRow, source: FileRow) -> BatchRow:
        """The batch once its input is checked and its lines stored (or it failed)."""
        max_line = self._state.config.listen.max_body_bytes
        validator = Validator(row.endpoint, self._settings.max_lines, max_line)
        try:
            total = await load(self._store, source, row.id, validator)
        except FileGone:
            await self._store.drop_batch(row.id)
            raise RouterError(
                404, "the batch input file was deleted", "input_file_id", "not_found"
            ) from None
        except BaseException:  # the client went away (or the store failed): nobody has it
            await asyncio.shield(self._store.drop_batch(row.id))
            raise
        problems = validator.errors
        errors = orjson.dumps([p.to_dict() for p in problems]) if problems else None
        ended = await self._store.end_validation(row.id, total, errors, int(time.time()))
        self._wake()
        return ended if ended is not None else row

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
