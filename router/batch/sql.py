"""The :class:`~router.batch.store.BatchStore` over SQL: SQLite or PostgreSQL, one text.

The statements run on router.batch.db's connection; SQLite and PostgreSQL differ here only in
how lines are locked while being taken (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so replicas
taking lines at once skip each other's rows; SQLite's ``BEGIN IMMEDIATE`` serializes writers
of one file). A file's content is kept in chunks of at most
:data:`~router.batch.db.CHUNK_BYTES` beside its row, written before the row exists and read
one at a time, so no call holds a whole file; a writer that died leaves chunks without a row,
which :meth:`SqlStore.sweep` removes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, fields
from typing import Any

from router.batch.db import Database
from router.batch.store import (
    BatchRow,
    BatchStatus,
    FileRow,
    Finished,
    Line,
    LineResult,
    NewLine,
)

_BATCH_COLUMNS = ", ".join(f.name for f in fields(BatchRow))
_FILE_COLUMNS = ", ".join(f.name for f in fields(FileRow))
_INSERT_FILE = f"INSERT INTO batch_files ({_FILE_COLUMNS}, seq) VALUES (?, ?, ?, ?, ?, ?, ?)"
_ACTIVE = ("in_progress", "cancelling", "finalizing")
_PAGE_ROWS = 1000
"""Lines whose sizes one page of :meth:`SqlStore.line_results` looks at, at most."""


class SqlStore(Database):
    """A :class:`~router.batch.store.BatchStore` over a SQLite file or a PostgreSQL URL."""

    # files

    async def put_chunk(self, file_id: str, n: int, data: bytes) -> None:
        text = "INSERT INTO batch_file_chunks (file_id, n, written_at, data) VALUES (?, ?, ?, ?)"
        await self._run(lambda: self._exec(text, (file_id, n, time.time(), data)))

    async def chunk(self, file_id: str, n: int) -> bytes | None:
        text = "SELECT data FROM batch_file_chunks WHERE file_id = ? AND n = ?"
        rows = await self._run(lambda: self._query(text, (file_id, n)))
        return bytes(rows[0][0]) if rows else None

    async def drop_chunks(self, file_id: str) -> None:
        text = "DELETE FROM batch_file_chunks WHERE file_id = ?"
        await self._run(lambda: self._exec(text, (file_id,)))

    async def put_file(self, row: FileRow) -> None:
        await self._run(lambda: self._exec(_INSERT_FILE, (*astuple(row), self._next_seq())))

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
        if after is not None:  # another owner's id is no cursor: as one that does not exist
            where += f" AND seq {cmp} (SELECT seq FROM batch_files WHERE id = ? AND owner = ?)"
            args += [after, owner]
        text = f"SELECT {_FILE_COLUMNS} FROM batch_files WHERE {where} ORDER BY seq {order} LIMIT ?"
        rows = await self._run(lambda: self._query(text, (*args, limit + 1)))
        return [FileRow(*r) for r in rows]

    async def delete_file(self, owner: str, file_id: str) -> bool:
        def delete() -> bool:
            with self._tx() as cur:
                cur.execute(
                    self._sql("DELETE FROM batch_files WHERE id = ? AND owner = ?"),
                    (file_id, owner),
                )
                if cur.rowcount != 1:
                    return False
                cur.execute(
                    self._sql("DELETE FROM batch_file_chunks WHERE file_id = ?"), (file_id,)
                )
                return True

        return await self._run(delete)

    # batches

    async def create_batch(self, row: BatchRow) -> None:
        marks = ", ".join("?" * len(fields(BatchRow)))
        text = f"INSERT INTO batches ({_BATCH_COLUMNS}, seq) VALUES ({marks}, ?)"
        await self._run(lambda: self._exec(text, (*astuple(row), self._next_seq())))

    async def add_lines(self, batch_id: str, first: int, lines: Sequence[NewLine]) -> None:
        rows = [(batch_id, first + i, n.custom_id, n.url, n.body) for i, n in enumerate(lines)]

        def add() -> None:
            with self._tx() as cur:
                cur.executemany(
                    self._sql(
                        "INSERT INTO batch_lines (batch_id, idx, custom_id, url, body, state) "
                        "VALUES (?, ?, ?, ?, ?, 'open')"
                    ),
                    rows,
                )

        await self._run(add)

    async def end_validation(
        self, batch_id: str, total: int, errors: bytes | None, now: int
    ) -> BatchRow | None:
        def end() -> BatchRow | None:
            with self._tx() as cur:
                if errors is None:
                    cur.execute(
                        self._sql(
                            "UPDATE batches SET status = 'in_progress', in_progress_at = ?, "
                            "total = ? WHERE id = ? AND status = 'validating'"
                        ),
                        (now, total, batch_id),
                    )
                else:
                    cur.execute(
                        self._sql(
                            "UPDATE batches SET status = 'failed', failed_at = ?, errors = ? "
                            "WHERE id = ? AND status = 'validating'"
                        ),
                        (now, errors, batch_id),
                    )
                    cur.execute(
                        self._sql("DELETE FROM batch_lines WHERE batch_id = ?"), (batch_id,)
                    )
            rows = self._batches("id = ?", (batch_id,))
            return rows[0] if rows else None

        return await self._run(end)

    async def drop_batch(self, batch_id: str) -> None:
        def drop() -> None:
            with self._tx() as cur:
                _drop_validating(cur, self._sql, "id = ?", (batch_id,))

        await self._run(drop)

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
        if after is not None:  # another owner's id is no cursor: as one that does not exist
            where += " AND seq < (SELECT seq FROM batches WHERE id = ? AND owner = ?)"
            args += [after, owner]
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

    async def sweep(self, before: float) -> None:
        def sweep() -> None:
            with self._tx() as cur:
                # A write whose last chunk is that old (no row yet) has stopped for good.
                cur.execute(
                    self._sql(
                        "DELETE FROM batch_file_chunks WHERE file_id IN (SELECT file_id "
                        "FROM batch_file_chunks GROUP BY file_id HAVING MAX(written_at) < ?) "
                        "AND file_id NOT IN (SELECT id FROM batch_files)"
                    ),
                    (before,),
                )
                _drop_validating(cur, self._sql, "created_at < ?", (int(before),))

        await self._run(sweep)

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

    # finalizing

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

    async def extend_finalize(self, batch_id: str, until: float) -> None:
        text = (
            "UPDATE batches SET finalize_until = ? "
            "WHERE id = ? AND status IN ('in_progress', 'cancelling', 'finalizing')"
        )
        await self._run(lambda: self._exec(text, (until, batch_id)))

    async def line_results(self, batch_id: str, start: int, max_bytes: int) -> list[LineResult]:
        def page() -> list[LineResult]:
            with self._tx() as cur:
                # The sizes first (no content read), to take as many lines as fit.
                cur.execute(
                    self._sql(
                        "SELECT idx, COALESCE(LENGTH(result), LENGTH(custom_id)) "
                        "FROM batch_lines WHERE batch_id = ? AND idx >= ? ORDER BY idx LIMIT ?"
                    ),
                    (batch_id, start, _PAGE_ROWS),
                )
                sizes = cur.fetchall()
                if not sizes:
                    return []
                total, last = 0, int(sizes[0][0])
                for idx, size in sizes:
                    if total and total + int(size) > max_bytes:
                        break
                    total, last = total + int(size), int(idx)
                cur.execute(
                    self._sql(
                        "SELECT idx, custom_id, state, result FROM batch_lines "
                        "WHERE batch_id = ? AND idx >= ? AND idx <= ? ORDER BY idx"
                    ),
                    (batch_id, start, last),
                )
                return [
                    LineResult(int(i), c, s, None if r is None else bytes(r))
                    for i, c, s, r in cur.fetchall()
                ]

        return await self._run(page)

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
        stamp = {"completed": "completed_at", "expired": "expired_at"}.get(status, "cancelled_at")

        def finish() -> bool:
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
                    return False
                for row in files:
                    cur.execute(self._sql(_INSERT_FILE), (*astuple(row), self._next_seq()))
                return True

        return await self._run(finish)


def _drop_validating(
    cur: Any, sql: Callable[[str], str], where: str, args: Sequence[object]
) -> None:
    """Delete the batches still ``validating`` that ``where`` selects, with their lines."""
    condition = f"status = 'validating' AND {where}"
    batches = f"SELECT id FROM batches WHERE {condition}"
    cur.execute(sql(f"DELETE FROM batch_lines WHERE batch_id IN ({batches})"), tuple(args))
    cur.execute(sql(f"DELETE FROM batches WHERE {condition}"), tuple(args))


def _batch_row(r: tuple[Any, ...]) -> BatchRow:
    values = list(r)
    for i, f in enumerate(fields(BatchRow)):
        if f.name in ("errors", "metadata") and values[i] is not None:
            values[i] = bytes(values[i])
    return BatchRow(*values)
