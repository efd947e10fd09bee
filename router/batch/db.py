"""The SQL connection the Batch API's store runs on: SQLite or PostgreSQL, one thread.

Both drivers are DB-API 2 (the standard library's ``sqlite3``; psycopg 3 for PostgreSQL), so
one set of statements serves both: they differ in the placeholder and the binary column type
(:meth:`Database._sql`, :data:`SCHEMA`). Every call runs on one dedicated thread, so the event
loop never waits on the database and the connection is used by one thread at a time.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
  bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, seq BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS batch_files_owner ON batch_files (owner, seq);
CREATE TABLE IF NOT EXISTS batch_file_chunks (
  file_id TEXT NOT NULL, n BIGINT NOT NULL, written_at DOUBLE PRECISION NOT NULL,
  data {blob} NOT NULL, PRIMARY KEY (file_id, n)
);
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
CHUNK_BYTES = 1 << 20
"""A file's content is stored in pieces of this size (the last one shorter)."""


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


class Database:
    """One connection to a SQLite file or a PostgreSQL URL, used from one thread."""

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
        """Connect, create the tables if missing and bring an older store's up to date."""

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
                for statement in SCHEMA.format(blob=blob).split(";"):
                    if statement.strip():
                        cur.execute(statement)
                self._chunk_old_contents(cur)
                cur.execute("SELECT COALESCE(MAX(seq), 0) FROM batches")
                self._seq = int(cur.fetchone()[0])

        await self._run(connect)

    def _chunk_old_contents(self, cur: Any) -> None:
        """A store from before contents were chunked keeps each file whole in a ``content``
        column: move them into chunks (in SQL, a chunk at a time), then drop the column."""
        cur.execute("SELECT * FROM batch_files WHERE 1 = 0")
        if "content" not in {d[0] for d in cur.description}:
            return
        now, n = time.time(), 0
        while True:
            cur.execute(
                self._sql(
                    "INSERT INTO batch_file_chunks (file_id, n, written_at, data) "
                    "SELECT id, ?, ?, substr(content, CAST(? AS INTEGER), CAST(? AS INTEGER)) "
                    "FROM batch_files WHERE content IS NOT NULL AND length(content) > ?"
                ),
                (n, now, n * CHUNK_BYTES + 1, CHUNK_BYTES, n * CHUNK_BYTES),
            )
            if cur.rowcount <= 0:
                break
            n += 1
        cur.execute("ALTER TABLE batch_files DROP COLUMN content")

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


def _pg_connect(url: str) -> Any:
    import psycopg  # only a PostgreSQL store needs the driver

    return psycopg.connect(url, autocommit=True)
