"""A batch's end: its output and error files written from its lines, then its final status.

The lines are read from the store a page of about a chunk at a time and written to the two
files as they come (router.batch.content), so a batch of any size is finalized in a few MiB.
The right to finalize is taken under a lease (only one router writes a batch's files) and
kept while the pages take long; a router that dies meanwhile leaves chunks without a file
row, swept later, and another finalizes once its lease has run out.
"""

from __future__ import annotations

import time

import orjson

from router.batch.content import FileWriter
from router.batch.db import CHUNK_BYTES
from router.batch.metrics import BatchMetrics
from router.batch.store import BatchRow, BatchStatus, BatchStore, FileRow, new_id

_EXPIRED = "This line was not run before the batch's completion window ended."


def error_line(custom_id: str, code: str, message: str) -> bytes:
    """An error-file line for a line without an answer."""
    error = {"code": code, "message": message}
    return orjson.dumps(
        {"id": new_id("batch_req_"), "custom_id": custom_id, "response": None, "error": error}
    )


async def finalize(
    store: BatchStore,
    batch: BatchRow,
    status: BatchStatus,
    lease_seconds: float,
    metrics: BatchMetrics,
) -> None:
    """Write the batch's output and error files and set its final ``status``, unless another
    router holds the right to (or finishes it first)."""
    now = time.time()
    showing: BatchStatus = "finalizing" if status == "completed" else batch.status  # type: ignore[assignment]
    if not await store.begin_finalize(batch.id, now, now + lease_seconds, showing):
        return
    output, errors = FileWriter(store), FileWriter(store)
    expired = 0
    kept = time.monotonic()
    try:
        start = 0
        while page := await store.line_results(batch.id, start, CHUNK_BYTES):
            for r in page:
                if r.result is not None:
                    await (output if r.state == "done" else errors).write(r.result + b"\n")
                elif status == "expired":
                    expired += 1
                    line = error_line(r.custom_id, "batch_expired", _EXPIRED)
                    await errors.write(line + b"\n")
            start = page[-1].idx + 1
            if time.monotonic() - kept > lease_seconds / 3:
                kept = time.monotonic()
                await store.extend_finalize(batch.id, time.time() + lease_seconds)
        rows: dict[str, FileRow] = {}
        for kind, writer in (("output", output), ("error", errors)):
            if writer.size:
                await writer.close()
                name = f"{batch.id}_{kind}.jsonl"
                rows[kind] = FileRow(
                    writer.file_id, batch.owner, "batch_output", name, writer.size, int(now)
                )
    except BaseException:
        await output.discard()
        await errors.discard()
        raise
    # Not discarded if cancelled from here: the files are in with the status, or (cancelled
    # before) their chunks are left to the sweep and another turn finalizes again.
    won = await store.finish_batch(
        batch.id,
        status,
        int(time.time()),
        list(rows.values()),
        rows["output"].id if "output" in rows else None,
        rows["error"].id if "error" in rows else None,
        expired,
    )
    if not won:  # another router finished it meanwhile: its files are the batch's
        await output.discard()
        await errors.discard()
    elif expired:
        metrics.expired(expired)
