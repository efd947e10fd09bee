"""What the Batch API keeps: files, batches and their lines, behind one :class:`BatchStore`.

Two implementations share one SQL text (router.batch.sql): SQLite in the data directory by
default (nothing to install), or a PostgreSQL database that several router replicas share.
A line is taken under a lease (its ``owner`` and ``lease_until``), renewed while it runs; a
finished line is written only by the lease's holder, so every line is answered exactly once
even when a replica dies mid-line and another takes its lines over.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

BatchStatus = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
TERMINAL: frozenset[str] = frozenset({"failed", "completed", "expired", "cancelled"})
LineState = Literal["open", "done", "failed"]


def new_id(prefix: str) -> str:
    """A fresh id for a file, batch or output line."""
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class FileRow:
    """A stored file (its content is kept beside it, in chunks)."""

    id: str
    owner: str
    """The creator's tenant id (a keyed hash of its API key) or ``""`` for anonymous."""
    purpose: str
    filename: str
    bytes: int
    created_at: int


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One batch as stored; the API object is derived from it (router.batch.api)."""

    id: str
    owner: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: bytes | None = None
    """The validation errors as JSON (a failed batch)."""
    metadata: bytes | None = None
    total: int = 0
    completed: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class NewLine:
    """A validated input line."""

    custom_id: str
    url: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Line:
    """A line taken under lease, to be run."""

    batch_id: str
    idx: int
    custom_id: str
    url: str
    body: bytes
    attempts: int
    """Tries so far, this one included."""


@dataclass(frozen=True, slots=True)
class LineResult:
    """A line's state and, once finished, its output or error line (JSON)."""

    idx: int
    custom_id: str
    state: LineState
    result: bytes | None


@dataclass(frozen=True, slots=True)
class Finished:
    """A line's outcome as the executor hands it to the store."""

    ok: bool
    """True: it goes to the output file; False: to the error file."""
    line: bytes
    """The output or error line (JSON, no newline)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0


class BatchStore(Protocol):
    """The Batch API's durable state. Every method is one transaction.

    A file's content is a sequence of chunks (``n`` from 0), written before its row: a file
    is there once its row is; chunks without one are an unfinished or abandoned write.
    """

    async def open(self) -> None:
        """Connect and create the tables if missing."""

    async def close(self) -> None: ...

    async def put_chunk(self, file_id: str, n: int, data: bytes) -> None: ...

    async def chunk(self, file_id: str, n: int) -> bytes | None:
        """Chunk ``n`` of the file's content; None past its end (or for a deleted file)."""

    async def drop_chunks(self, file_id: str) -> None:
        """Delete the chunks of a write given up."""

    async def put_file(self, row: FileRow) -> None:
        """The file's row, once its chunks are written."""

    async def file(self, owner: str, file_id: str) -> FileRow | None: ...

    async def files(
        self, owner: str, purpose: str | None, limit: int, after: str | None, newest_first: bool
    ) -> list[FileRow]:
        """A page of the owner's files (``limit`` + 1 rows tell there are more); ``after``
        not one of the owner's ids: an empty page."""

    async def delete_file(self, owner: str, file_id: str) -> bool:
        """Delete the owner's file, row and content; False: it has no such file."""

    async def create_batch(self, row: BatchRow) -> None:
        """Insert the batch (``validating`` while its lines are added)."""

    async def add_lines(self, batch_id: str, first: int, lines: Sequence[NewLine]) -> None:
        """Lines of a validating batch, numbered from ``first``."""

    async def end_validation(
        self, batch_id: str, total: int, errors: bytes | None, now: int
    ) -> BatchRow | None:
        """A validating batch now ``in_progress`` with ``total`` lines, or ``failed`` with
        ``errors`` (its lines deleted); the batch as it now is (it may have been cancelled
        meanwhile)."""

    async def drop_batch(self, batch_id: str) -> None:
        """Delete a batch still validating, and its lines (its creation was given up)."""

    async def batch(self, owner: str | None, batch_id: str) -> BatchRow | None:
        """The batch (any owner's when ``owner`` is None: the executor's view)."""

    async def batches(self, owner: str, limit: int, after: str | None) -> list[BatchRow]:
        """A page of the owner's batches, newest first (``limit`` + 1 rows); ``after`` not
        one of the owner's ids: an empty page."""

    async def cancel(self, owner: str, batch_id: str, now: int) -> BatchRow | None:
        """Mark a validating or running batch ``cancelling``; the batch as it now is."""

    async def active(self) -> list[BatchRow]:
        """Batches some router still has work on (running, cancelling, finalizing)."""

    async def sweep(self, before: float) -> None:
        """Remove what writers that died left behind them before ``before`` (a Unix time):
        chunks of files without a row, batches still validating and their lines."""

    async def claim(
        self, batch_id: str, worker: str, n: int, now: float, lease_until: float
    ) -> list[Line]:
        """Take up to ``n`` open lines whose lease has run out (or that never had one)."""

    async def renew(self, worker: str, lease_until: float) -> None:
        """Extend every lease ``worker`` holds."""

    async def finish_line(self, line: Line, worker: str, done: Finished, now: float) -> bool:
        """Record a line's answer if ``worker`` still holds it; False: another took it."""

    async def release_line(self, line: Line, worker: str, not_before: float) -> None:
        """Give a line back, to be taken again from ``not_before`` on."""

    async def live_leases(self, batch_id: str, now: float) -> int:
        """Lines of the batch some router is running now."""

    async def begin_finalize(
        self, batch_id: str, now: float, until: float, status: BatchStatus
    ) -> bool:
        """Take the right to finalize the batch until ``until``; ``status`` shows meanwhile."""

    async def extend_finalize(self, batch_id: str, until: float) -> None:
        """Keep the right to finalize the batch until ``until`` (a long finalization)."""

    async def line_results(self, batch_id: str, start: int, max_bytes: int) -> list[LineResult]:
        """The batch's lines from index ``start`` on, in input order, as many as fit in
        about ``max_bytes`` (at least one); empty past the last."""

    async def finish_batch(
        self,
        batch_id: str,
        status: BatchStatus,
        now: int,
        files: Sequence[FileRow],
        output_file_id: str | None,
        error_file_id: str | None,
        expired: int,
    ) -> bool:
        """Add the result files' rows (their chunks written) and set the terminal status;
        ``expired`` lines count as failed. False: another router finished it first."""
