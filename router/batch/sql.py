"""The :class:`~router.batch.store.BatchStore` over SQL: SQLite or PostgreSQL, one text.

Both drivers are DB-API 2 (the standard library's ``sqlite3``; psycopg 3 for PostgreSQL), so
one set of statements serves both: they differ in the placeholder, the binary column type and
how lines are locked while being taken (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas
taking lines at once skip each other's rows; SQLite's ``BEGIN IMMEDIATE`` serializes writers
of one file). Every call runs on one dedicated thread, so the event loop never waits on the
database and the connection is used by one thread at a time.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import astuple, fields
from pathlib import Path
from typing import Any, TypeVar

from router.batch.store import (
    BatchRow,
    BatchStatus,
    FileRow,
    Finished,
    Line,
    LineResult,
    NewLine,
)

T = TypeVar("T")
_BATCH_COLUMNS = ", ".join(f.name for f in fields(BatchRow))
_FILE_COLUMNS = ", ".join(f.name for f in fields(FileRow))

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
  bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, seq BIGINT NOT NULL, content {blob}
);
CREATE INDEX IF NOT EXISTS batch_files_owner ON batch_files (owner, seq);
CREATE TABLE IF NOT EXISTS batches (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL,
  input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL,
  created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, in_progress_at BIGINT,
  finalizing_at BIGINT, completed_at BIGINT, failed_at BIGINT, expired_at BIGINT,
  cancelling_at BIGINT, cancelled_at BIGINT, output_file_id TEXT, error_file_id TEXT,
  errors {blob}, metadata {blob}, total BIGINT NOT NULL, completed BIGINT NOT NULL,
  failed BIGINT NOT NULL, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL,
  seq BIGINT NOT NULL, finalize_until DOUBLE PRECISION NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_owner ON batches (owner, seq);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_lines (
  batch_id TEXT NOT NULL, idx BIGINT NOT NULL, custom_id TEXT NOT NULL, url TEXT NOT NULL,
  body {blob} NOT NULL, state TEXT NOT NULL, owner TEXT,
  lease_until DOUBLE PRECISION NOT NULL DEFAULT 0, attempts BIGINT NOT NULL DEFAULT 0,
  result {blob}, PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS batch_lines_open ON batch_lines (batch_id, state, lease_until);
CREATE INDEX IF NOT EXISTS batch_lines_owner ON batch_lines (owner);
"""
_ACTIVE = ("in_progress", "cancelling", "finalizing")


def _wal(conn: sqlite3.Connection) -> None:
    """Switch ``conn``'s file to WAL. That takes an exclusive lock, and two connections that
    both hold a shared one (replicas opening a new file together) deadlock: SQLite then fails
    one at once rather than wait, so it is retried here, for up to about 10 s."""
    for attempt in range(200):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == 199:
                raise
            time.sleep(0.05)


class SqlStore:
    """A :class:`~router.batch.store.BatchStore` over a SQLite file or a PostgreSQL URL."""

    def __init__(self, url: str) -> None:
        """``url``: ``sqlite:///PATH`` or ``postgresql://...`` (libpq's URL and variables)."""
        self._url = url
        self._pg = url.startswith(("postgresql://", "postgres://"))
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="batch-store")
        self._conn: Any = None
        self._seq = 0

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn)

    def _sql(self, text: str) -> str:
        return text.replace("?", "%s") if self._pg else text

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """A write transaction and its cursor; committed on success, else rolled back."""
        conn = self._conn
        if self._pg and (conn.closed or conn.broken):
            # The server restarted or the network dropped: the call that found out failed,
            # this one reconnects (an unfinished line's lease simply runs out).
            conn = self._conn = _pg_connect(self._url)
        if self._pg:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
            return
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")  # writers of one file take turns; no upgrade deadlock
        try:
            yield cur
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def _query(self, text: str, args: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._tx() as cur:
            cur.execute(self._sql(text), tuple(args))
            return list(cur.fetchall())

    def _exec(self, text: str, args: Sequence[object] = ()) -> int:
        with self._tx() as cur:
            cur.execute(self._sql(text), tuple(args))
            return int(cur.rowcount)

    async def open(self) -> None:
        def connect() -> None:
            if self._pg:
                self._conn = _pg_connect(self._url)
                blob = "BYTEA"
            else:
                path = Path(self._url.removeprefix("sqlite:///"))
                path.parent.mkdir(parents=True, exist_ok=True)
                # isolation_level=None: the transactions are the explicit ones of _tx.
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                _wal(conn)
                # NORMAL under WAL: a killed process loses nothing committed (only power loss
                # can take the last transactions), at a fraction of FULL's fsyncs.
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=10000")
                self._conn = conn
                blob = "BLOB"
            with self._tx() as cur:
                if self._pg:  # replicas starting together: one creates, the others wait
                    cur.execute("SELECT pg_advisory_xact_lock(8244681726)")
                for statement in _SCHEMA.format(blob=blob).split(";"):
                    if statement.strip():
                        cur.execute(statement)
                cur.execute("SELECT COALESCE(MAX(seq), 0) FROM batches")
                self._seq = int(cur.fetchone()[0])

        await self._run(connect)

    async def close(self) -> None:
        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await self._run(close)
        self._thread.shutdown(wait=False)

    def _next_seq(self) -> int:
        """An ordering key: nanoseconds, so replicas' rows interleave by creation time."""
        self._seq = max(self._seq + 1, time.time_ns())
        return self._seq

    # files

    async def put_file(self, row: FileRow, content: bytes) -> None:
        def put() -> None:
            self._exec(
                f"INSERT INTO batch_files ({_FILE_COLUMNS}, seq, content) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (*astuple(row), self._next_seq(), content),
            )

        await self._run(put)

    async def file(self, owner: str, file_id: str) -> FileRow | None:
        rows = await self._run(
            lambda: self._query(
                f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE id = ? AND owner = ?",
                (file_id, owner),
            )
        )
        return FileRow(*rows[0]) if rows else None

    async def files(
        self, owner: str, purpose: str | None, limit: int, after: str | None, newest_first: bool
    ) -> list[FileRow]:
        cmp, order = ("<", "DESC") if newest_first else (">", "ASC")
        where, args = "owner = ?", [owner]
        if purpose is not None:
            where += " AND purpose = ?"
            args.append(purpose)
        if after is not None:
            where += f" AND seq {cmp} (SELECT seq FROM batch_files WHERE id = ?)"
            args.append(after)
        text = f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE {where} ORDER BY seq {order} LIMIT ?"
        rows = await self._run(lambda: self._query(text, (*args, limit + 1)))
        return [FileRow(*r) for r in rows]

    async def file_content(self, owner: str, file_id: str) -> bytes | None:
        rows = await self._run(
            lambda: self._query(
                "SELECT content FROM batch_files WHERE id = ? AND owner = ?", (file_id, owner)
            )
        )
        return bytes(rows[0][0]) if rows else None

    async def delete_file(self, owner: str, file_id: str) -> bool:
        text = "DELETE FROM batch_files WHERE id = ? AND owner = ?"
        return await self._run(lambda: self._exec(text, (file_id, owner))) > 0

    # batches

    async def create_batch(self, row: BatchRow, lines: Sequence[NewLine]) -> None:
        marks = ", ".join("?" * len(fields(BatchRow)))

        def create() -> None:
            with self._tx() as cur:
                cur.execute(
                    self._sql(f"INSERT INTO batches ({_BATCH_COLUMNS}, seq) VALUES ({marks}, ?)"),
                    (*astuple(row), self._next_seq()),
                )
                if not lines:
                    return
                cur.executemany(
                    self._sql(
                        "INSERT INTO batch_lines (batch_id, idx, custom_id, url, body, state) "
                        "VALUES (?, ?, ?, ?, ?, 'open')"
                    ),
                    [(row.id, i, n.custom_id, n.url, n.body) for i, n in enumerate(lines)],
                )

        await self._run(create)

    def _batches(self, where: str, args: Sequence[object], tail: str = "") -> list[BatchRow]:
        text = f"SELECT {_BATCH_COLUMNS} FROM batches WHERE {where} {tail}"
        return [_batch_row(r) for r in self._query(text, args)]

    async def batch(self, owner: str | None, batch_id: str) -> BatchRow | None:
        where, args = "id = ?", [batch_id]
        if owner is not None:
            where += " AND owner = ?"
            args.append(owner)
        rows = await self._run(lambda: self._batches(where, args))
        return rows[0] if rows else None

    async def batches(self, owner: str, limit: int, after: str | None) -> list[BatchRow]:
        where, args = "owner = ?", [owner]
        if after is not None:
            where += " AND seq < (SELECT seq FROM batches WHERE id = ?)"
            args.append(after)
        tail = "ORDER BY seq DESC LIMIT ?"
        return await self._run(lambda: self._batches(where, (*args, limit + 1), tail))

    async def cancel(self, owner: str, batch_id: str, now: int) -> BatchRow | None:
        def cancel() -> BatchRow | None:
            self._exec(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                "WHERE id = ? AND owner = ? AND status IN ('validating', 'in_progress')",
                (now, batch_id, owner),
            )
            rows = self._batches("id = ? AND owner = ?", (batch_id, owner))
            return rows[0] if rows else None

        return await self._run(cancel)

    async def active(self) -> list[BatchRow]:
        marks = ", ".join("?" * len(_ACTIVE))
        return await self._run(
            lambda: self._batches(f"status IN ({marks})", _ACTIVE, "ORDER BY seq ASC")
        )

    # lines

    async def claim(
        self, batch_id: str, worker: str, n: int, now: float, lease_until: float
    ) -> list[Line]:
        lock = " FOR UPDATE SKIP LOCKED" if self._pg else ""
        # A materialized CTE: as a plain IN (subquery), PostgreSQL may run the subquery again
        # and take more than n lines.
        text = (
            "WITH picked AS MATERIALIZED (SELECT idx FROM batch_lines WHERE batch_id = ? "
            f"AND state = 'open' AND lease_until < ? ORDER BY idx LIMIT ?{lock}) "
            "UPDATE batch_lines SET owner = ?, lease_until = ?, attempts = attempts + 1 "
            "FROM picked WHERE batch_lines.batch_id = ? AND batch_lines.idx = picked.idx "
            "RETURNING batch_lines.idx, custom_id, url, body, attempts"
        )
        args = (batch_id, now, n, worker, lease_until, batch_id)
        rows = await self._run(lambda: self._query(text, args))
        rows.sort(key=lambda r: int(r[0]))
        return [Line(batch_id, int(i), c, u, bytes(b), int(a)) for i, c, u, b, a in rows]

    async def renew(self, worker: str, lease_until: float) -> None:
        text = "UPDATE batch_lines SET lease_until = ? WHERE owner = ? AND state = 'open'"
        await self._run(lambda: self._exec(text, (lease_until, worker)))

    async def finish_line(self, line: Line, worker: str, done: Finished, now: float) -> bool:
        state = "done" if done.ok else "failed"

        def finish() -> bool:
            with self._tx() as cur:
                cur.execute(
                    self._sql(
                        "UPDATE batch_lines SET state = ?, result = ?, owner = NULL "
                        "WHERE batch_id = ? AND idx = ? AND owner = ? AND state = 'open'"
                    ),
                    (state, done.line, line.batch_id, line.idx, worker),
                )
                if cur.rowcount != 1:
                    return False
                cur.execute(
                    self._sql(
                        "UPDATE batches SET completed = completed + ?, failed = failed + ?, "
                        "prompt_tokens = prompt_tokens + ?, "
                        "completion_tokens = completion_tokens + ? WHERE id = ?"
                    ),
                    (
                        int(done.ok),
                        int(not done.ok),
                        done.prompt_tokens,
                        done.completion_tokens,
                        line.batch_id,
                    ),
                )
                return True

        return await self._run(finish)

    async def release_line(self, line: Line, worker: str, not_before: float) -> None:
        text = (
            "UPDATE batch_lines SET owner = NULL, lease_until = ? "
            "WHERE batch_id = ? AND idx = ? AND owner = ? AND state = 'open'"
        )
        args = (not_before, line.batch_id, line.idx, worker)
        await self._run(lambda: self._exec(text, args))

    async def live_leases(self, batch_id: str, now: float) -> int:
        text = (
            "SELECT COUNT(*) FROM batch_lines WHERE batch_id = ? AND state = 'open' "
            "AND owner IS NOT NULL AND lease_until >= ?"
        )
        rows = await self._run(lambda: self._query(text, (batch_id, now)))
        return int(rows[0][0])

    async def begin_finalize(
        self, batch_id: str, now: float, until: float, status: BatchStatus
    ) -> bool:
        text = (
            "UPDATE batches SET finalize_until = ?, status = ?, "
            "finalizing_at = COALESCE(finalizing_at, ?) "
            "WHERE id = ? AND status IN ('in_progress', 'cancelling', 'finalizing') "
            "AND finalize_until < ?"
        )
        args = (until, status, int(now), batch_id, now)
        return await self._run(lambda: self._exec(text, args)) == 1

    async def line_results(self, batch_id: str) -> list[LineResult]:
        text = (
            "SELECT idx, custom_id, state, result FROM batch_lines WHERE batch_id = ? ORDER BY idx"
        )
        rows = await self._run(lambda: self._query(text, (batch_id,)))
        return [LineResult(int(i), c, s, None if r is None else bytes(r)) for i, c, s, r in rows]

    async def finish_batch(
        self,
        batch_id: str,
        status: BatchStatus,
        now: int,
        files: Sequence[tuple[FileRow, bytes]],
        output_file_id: str | None,
        error_file_id: str | None,
        expired: int,
    ) -> None:
        stamp = {"completed": "completed_at", "expired": "expired_at"}.get(status, "cancelled_at")

        def finish() -> None:
            with self._tx() as cur:
                cur.execute(
                    self._sql(
                        f"UPDATE batches SET status = ?, {stamp} = ?, output_file_id = ?, "
                        "error_file_id = ?, failed = failed + ? WHERE id = ? "
                        "AND status IN ('in_progress', 'cancelling', 'finalizing')"
                    ),
                    (status, now, output_file_id, error_file_id, expired, batch_id),
                )
                if cur.rowcount != 1:  # another router finished it meanwhile
                    return
                for row, content in files:
                    cur.execute(
                        self._sql(
                            f"INSERT INTO batch_files ({_FILE_COLUMNS}, seq, content) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                        ),
                        (*astuple(row), self._next_seq(), content),
                    )

        await self._run(finish)


def _pg_connect(url: str) -> Any:
    import psycopg  # only a PostgreSQL store needs the driver

    return psycopg.connect(url, autocommit=True)


def _batch_row(r: tuple[Any, ...]) -> BatchRow:
    values = list(r)
    for i, f in enumerate(fields(BatchRow)):
        if f.name in ("errors", "metadata") and values[i] is not None:
            values[i] = bytes(values[i])
    return BatchRow(*values)
