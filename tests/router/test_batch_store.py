"""The batch store's leases and files, on SQLite and on a real PostgreSQL server alike.

Two workers (each its own connection, as two router replicas) take lines: never the same line
while its lease runs, a dead worker's lines once it has run out, and only the lease's holder
can write a line's answer; the right to finalize a batch is taken once. A file's content is
chunks that go with its row; paging by a cursor of another owner is paging by an unknown one;
the sweep takes what dead writers left and nothing else; an older store is brought up to date.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from router.batch import content
from router.batch.content import FileGone, FileWriter
from router.batch.db import CHUNK_BYTES
from router.batch.sql import SqlStore
from router.batch.store import BatchRow, FileRow, Finished, NewLine
from tests.pg import Postgres, start_postgres

T0 = 1_000_000.0


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    with start_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'batch.db'}"
    server: Postgres = request.getfixturevalue("postgres")
    return server.url


@pytest.fixture
async def stores(url: str) -> AsyncIterator[tuple[SqlStore, SqlStore]]:
    a, b = SqlStore(url), SqlStore(url)
    await asyncio.gather(a.open(), b.open())
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


_counter = iter(range(10**6))


async def new_batch(store: SqlStore, lines: int) -> str:
    batch_id = f"batch_t{next(_counter)}_{id(store)}"
    row = BatchRow(batch_id, "", "/v1/chat/completions", "file-x", "24h", "in_progress",
                   0, 10**10, total=lines)  # fmt: skip
    await store.create_batch(row)
    rows = [NewLine(f"c{i}", row.endpoint, b"{}") for i in range(lines)]
    await store.add_lines(batch_id, 0, rows)
    return batch_id


def answer(n: int) -> Finished:
    return Finished(True, b'{"n": %d}' % n, 3, 5)


async def test_leases_and_takeover(stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = stores
    batch = await new_batch(a, 5)
    mine = await a.claim(batch, "A", 3, T0, T0 + 10)
    theirs = await b.claim(batch, "B", 10, T0, T0 + 10)
    assert [x.idx for x in mine] == [0, 1, 2] and [x.idx for x in theirs] == [3, 4]
    assert await b.claim(batch, "B", 10, T0 + 1, T0 + 11) == []
    assert await a.live_leases(batch, T0 + 1) == 5
    # A goes quiet (B renews its own leases); once A's have run out B takes its lines, and A
    # can no longer answer.
    await b.renew("B", T0 + 50)
    taken = await b.claim(batch, "B", 10, T0 + 20, T0 + 30)
    assert [x.idx for x in taken] == [0, 1, 2] and all(x.attempts == 2 for x in taken)
    assert not await a.finish_line(mine[0], "A", answer(0), T0 + 21)
    for line in [*taken, *theirs]:
        assert await b.finish_line(line, "B", answer(line.idx), T0 + 21)
    assert not await b.finish_line(taken[0], "B", answer(0), T0 + 22)  # answered once only
    row = await a.batch(None, batch)
    assert row is not None
    assert (row.completed, row.failed, row.prompt_tokens, row.completion_tokens) == (5, 0, 15, 25)
    results = await a.line_results(batch, 0, 1 << 20)
    assert [(r.custom_id, r.state, r.result) for r in results] == [
        (f"c{i}", "done", b'{"n": %d}' % i) for i in range(5)
    ]
    # Finalizing is taken once (until its own lease runs out).
    assert await a.begin_finalize(batch, T0 + 30, T0 + 40, "finalizing")
    assert not await b.begin_finalize(batch, T0 + 31, T0 + 41, "finalizing")
    assert await a.finish_batch(batch, "completed", int(T0) + 32, [], None, None, 0)
    assert not await b.finish_batch(batch, "completed", int(T0) + 33, [], None, None, 0)
    done = await b.batch(None, batch)
    assert done is not None and (done.status, done.completed_at) == ("completed", int(T0) + 32)


async def test_renew_and_release(stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = stores
    batch = await new_batch(a, 2)
    first, second = await a.claim(batch, "A", 2, T0, T0 + 10)
    await a.renew("A", T0 + 100)
    assert await b.claim(batch, "B", 2, T0 + 50, T0 + 60) == []
    await a.release_line(first, "A", T0 + 70)  # given back, to be taken from T0 + 70 on
    assert await b.claim(batch, "B", 2, T0 + 60, T0 + 70) == []
    assert [x.idx for x in await b.claim(batch, "B", 2, T0 + 71, T0 + 80)] == [first.idx]
    await a.renew("A", 0.0)  # a router shutting down hands its leases back
    assert [x.idx for x in await b.claim(batch, "B", 2, T0 + 72, T0 + 80)] == [second.idx]


async def test_racing_workers_take_every_line_once(stores: tuple[SqlStore, SqlStore]) -> None:
    a, b = stores
    batch = await new_batch(a, 300)

    async def drain(store: SqlStore, worker: str) -> list[int]:
        got: list[int] = []
        while lines := await store.claim(batch, worker, 7, T0, T0 + 100):
            got += [x.idx for x in lines]
            for line in lines:
                assert await store.finish_line(line, worker, answer(line.idx), T0)
        return got

    got_a, got_b = await asyncio.gather(drain(a, "A"), drain(b, "B"))
    assert sorted(got_a + got_b) == list(range(300))
    assert not set(got_a) & set(got_b)
    row = await a.batch(None, batch)
    assert row is not None and row.completed == 300


async def test_a_restarted_postgresql_server_costs_one_call(postgres: Postgres) -> None:
    store = SqlStore(postgres.url)
    await store.open()
    try:
        batch = await new_batch(store, 3)
        await asyncio.to_thread(postgres.restart)
        with pytest.raises(Exception, match=r"(?i)terminat|connection|closed"):
            await store.claim(batch, "A", 1, T0, T0 + 10)
        assert [x.idx for x in await store.claim(batch, "A", 3, T0, T0 + 10)] == [0, 1, 2]
    finally:
        await store.close()


async def test_replicas_opening_one_new_sqlite_file_together(tmp_path: Path) -> None:
    """Switching a new file to WAL takes an exclusive lock; two openers that both hold a
    shared one deadlock, and SQLite fails one at once instead of waiting (seen in CI)."""
    for attempt in range(10):
        url = f"sqlite:///{tmp_path / f'together{attempt}.db'}"
        stores = [SqlStore(url) for _ in range(6)]
        await asyncio.gather(*(s.open() for s in stores))
        for s in stores:
            await s.close()


async def stored_file(store: SqlStore, owner: str, content: bytes) -> FileRow:
    writer = FileWriter(store)
    await writer.write(content)
    await writer.close()
    row = FileRow(writer.file_id, owner, "batch", "in.jsonl", writer.size, 0)
    await store.put_file(row)
    return row


async def read_whole(store: SqlStore, row: FileRow) -> bytes:
    return b"".join([piece async for piece in content.read(store, row.id, row.bytes)])


async def test_contents_are_chunked_and_go_with_their_file(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    a, b = stores
    data = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 7)  # two chunks and a bit
    row = await stored_file(a, "alice", data)
    assert await b.chunk(row.id, 2) is not None and await b.chunk(row.id, 3) is None
    assert await read_whole(b, row) == data
    assert not await b.delete_file("mallory", row.id)  # not mallory's: nothing happens
    assert await read_whole(b, row) == data
    assert await b.delete_file("alice", row.id)
    assert await a.chunk(row.id, 0) is None
    with pytest.raises(FileGone):
        await read_whole(a, row)


async def test_a_foreign_cursor_pages_as_an_unknown_one(stores: tuple[SqlStore, SqlStore]) -> None:
    a, _ = stores
    alice, mallory = f"alice-{uuid.uuid4().hex}", f"mallory-{uuid.uuid4().hex}"
    mine = [await stored_file(a, alice, b"x\n") for _ in range(3)]
    theirs = await stored_file(a, mallory, b"y\n")
    for newest_first in (True, False):
        pages = [
            await a.files(alice, None, 10, after, newest_first)
            for after in (theirs.id, "file-nope")
        ]
        assert pages == [[], []]
        assert len(await a.files(alice, None, 10, mine[1].id, newest_first)) == 1
    ids = []
    for owner in (alice, alice, mallory):
        row = BatchRow(f"batch_{uuid.uuid4().hex}", owner, "/v1/chat/completions", "file-x",
                       "24h", "in_progress", 0, 10**10)  # fmt: skip
        await a.create_batch(row)
        ids.append(row.id)
    assert [b.id for b in await a.batches(alice, 10, ids[1])] == [ids[0]]
    assert await a.batches(alice, 10, ids[2]) == await a.batches(alice, 10, "batch_nope") == []


async def test_the_sweep_takes_only_what_dead_writers_left(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    a, _ = stores
    kept = await stored_file(a, "alice", b"z" * 10)
    for file_id in ("file-orphan", "file-writing"):
        await a.put_chunk(file_id, 0, b"partial")
    validating = BatchRow("batch_stuck", "", "/v1/chat/completions", "file-x", "24h",
                          "validating", 100, 10**10)  # fmt: skip
    await a.create_batch(validating)
    await a.add_lines(validating.id, 0, [NewLine("c0", validating.endpoint, b"{}")])
    running = await new_batch(a, 1)
    cutoff = time.time()
    await asyncio.sleep(0.01)
    await a.put_chunk("file-writing", 1, b"later")  # written since: a write still going on
    await a.sweep(cutoff)
    assert await a.chunk("file-orphan", 0) is None
    assert [await a.chunk("file-writing", n) for n in (0, 1)] == [b"partial", b"later"]
    assert await read_whole(a, kept) == b"z" * 10
    assert await a.batch(None, validating.id) is None
    assert await a.line_results(validating.id, 0, 1 << 20) == []
    assert await a.batch(None, running) is not None


async def test_line_results_come_in_pages_of_about_a_chunk(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    a, _ = stores
    batch = await new_batch(a, 5)
    lines = await a.claim(batch, "A", 5, T0, T0 + 10)
    sizes = [400_000, 400_000, 400_000, 3_000_000, 10]
    for line, size in zip(lines, sizes, strict=True):
        assert await a.finish_line(line, "A", Finished(True, b"r" * size), T0)
    pages, start = [], 0
    while page := await a.line_results(batch, start, CHUNK_BYTES):
        pages.append([r.idx for r in page])
        start = page[-1].idx + 1
    assert pages == [[0, 1], [2], [3], [4]]  # one larger than a chunk comes alone


OLD_FILES = """CREATE TABLE batch_files (
  id TEXT PRIMARY KEY, owner TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
  bytes BIGINT NOT NULL, created_at BIGINT NOT NULL, seq BIGINT NOT NULL, content {blob}
)"""


async def test_a_store_of_whole_contents_is_chunked_when_opened(url: str) -> None:
    """Before issue 26 a file's content was one column of its row: opening such a store moves
    every content into chunks and drops the column."""
    if url.startswith("postgresql://"):  # a database of its own: this one drops a table
        url = await asyncio.to_thread(fresh_database, url)
    store = SqlStore(url)
    await store.open()
    data = b"line\n" * (CHUNK_BYTES // 2)  # 2.5 chunks
    try:

        def old_layout() -> None:
            with store._tx() as cur:
                cur.execute("DROP TABLE batch_files")
                cur.execute(OLD_FILES.format(blob="BYTEA" if store._pg else "BLOB"))
                cur.execute(
                    store._sql("INSERT INTO batch_files VALUES (?, ?, ?, ?, ?, ?, ?, ?)"),
                    ("file-old", "alice", "batch", "old.jsonl", len(data), 0, 1, data),
                )

        await store._run(old_layout)
    finally:
        await store.close()
    reopened = SqlStore(url)
    await reopened.open()
    try:
        row = await reopened.file("alice", "file-old")
        assert row is not None and row.bytes == len(data)
        assert await reopened.chunk("file-old", 2) is not None
        assert await read_whole(reopened, row) == data
        assert [r.id for r in await reopened.files("alice", None, 10, None, True)] == ["file-old"]
    finally:
        await reopened.close()


def fresh_database(url: str) -> str:
    import psycopg

    name = f"t{uuid.uuid4().hex}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name
