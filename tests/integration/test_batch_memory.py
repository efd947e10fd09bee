"""Issue 26: the Batch API holds no file whole, measured on a real router process.

Each attack runs against the router over loopback and its peak RSS (the kernel's ``VmHWM``,
reset before each) must stay within :data:`MARGIN_MIB` of its RSS before it, with files of
:data:`FILE_MIB` MiB and several at once: holding even one of them whole would pass the
margin. Before, 4 uploads of 184 MiB took the router to 1.3 GB, 6 slow downloads of one to
2.45 GB, 3 creates over one to 3.3 GB and finalizing 400 MiB of output to 1.65 GB.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import openai
import pytest

from router.batch.sql import SqlStore
from router.batch.store import BatchRow, Finished, NewLine
from router.config.model import ApiKeySpec
from router.control.auth import Gate
from tests.batchkit import AUTH, KEY, batch_client, chat_line, jsonl, keyed, wait
from tests.procs import Process, peak_rss_mib, reset_peak_rss
from tests.router.harness import base_config, start_router, write_config

FILE_MIB = 96
MARGIN_MIB = 80
MiB = 1 << 20


def batch_file(mib: int) -> bytes:
    """Valid chat lines of about 4 KiB each, ``mib`` MiB in all."""
    one = jsonl([chat_line("x", content_pad="y" * 3900)])
    count = mib * MiB // len(one)
    return jsonl([chat_line(f"line-{i}", content_pad="y" * 3900) for i in range(count)])


def config(work: Path) -> dict[str, object]:
    doc = base_config([("down", "vllm", "http://127.0.0.1:9")])  # never up: no line is served
    doc["batch"] = {"data_dir": str(work / "data"), "max_concurrency": 1}
    doc["limits"] = {"body_seconds": 120}  # several uploads of 96 MiB on a loaded machine
    return keyed(doc)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    work = tmp_path_factory.mktemp("batch-memory")
    with start_router(write_config(work, config(work))) as proc:
        yield proc


@pytest.fixture(scope="module")
def content() -> bytes:
    return batch_file(FILE_MIB)


@pytest.fixture(scope="module")
def uploaded(router: Process, content: bytes) -> str:
    client = batch_client(router.url, timeout=300)
    return client.files.create(file=("big.jsonl", io.BytesIO(content)), purpose="batch").id


class Peak:
    """The router's peak RSS over a block, against its RSS when the block began."""

    def __init__(self, router: Process) -> None:
        self.pid = router.proc.pid

    def __enter__(self) -> Peak:
        reset_peak_rss(self.pid)
        self.start = peak_rss_mib(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.grew = peak_rss_mib(self.pid) - self.start


def test_concurrent_large_uploads(router: Process, content: bytes) -> None:
    client = batch_client(router.url, timeout=300)

    def upload(i: int) -> openai.types.FileObject:
        return client.files.create(file=(f"up{i}.jsonl", io.BytesIO(content)), purpose="batch")

    with Peak(router) as peak, ThreadPoolExecutor(3) as pool:
        files = list(pool.map(upload, range(3)))
    assert [f.bytes for f in files] == [len(content)] * 3
    assert peak.grew < MARGIN_MIB, peak.grew
    got = client.files.content(files[0].id).content  # and what is stored is what was sent
    assert hashlib.sha256(got).digest() == hashlib.sha256(content).digest()


async def _slow_reader(url: str, seconds: float) -> int:
    """Read a download at 640 KiB/s for ``seconds``; the bytes read."""
    got = 0
    async with aiohttp.ClientSession() as session, session.get(url, headers=AUTH) as r:
        assert r.status == 200 and r.content_length is not None
        until = time.monotonic() + seconds
        while time.monotonic() < until and (piece := await r.content.read(64 * 1024)):
            got += len(piece)
            await asyncio.sleep(0.1)
    return got


def test_slow_downloads(router: Process, uploaded: str) -> None:
    url = f"{router.url}/v1/files/{uploaded}/content"

    async def readers() -> list[int]:
        return await asyncio.gather(*(_slow_reader(url, 8.0) for _ in range(6)))

    with Peak(router) as peak:
        got = asyncio.run(readers())
    assert all(0 < n < FILE_MIB * MiB for n in got), got  # still reading when they left
    assert peak.grew < MARGIN_MIB, peak.grew


def test_concurrent_creates(router: Process, uploaded: str, content: bytes) -> None:
    client = batch_client(router.url, timeout=300)

    def create(_: int) -> openai.types.Batch:
        return client.batches.create(
            input_file_id=uploaded, endpoint="/v1/chat/completions", completion_window="24h"
        )

    with Peak(router) as peak, ThreadPoolExecutor(3) as pool:
        batches = list(pool.map(create, range(3)))
    lines = content.count(b"\n")
    for b in batches:
        assert b.status == "in_progress" and b.request_counts is not None, b
        assert b.request_counts.total == lines
        client.batches.cancel(b.id)
    assert peak.grew < MARGIN_MIB, peak.grew


def test_a_gzip_bomb_is_refused_unread(router: Process) -> None:
    """A form that inflates to most of the size limit from a few hundred KiB: 415 at once
    (gzip and deflate: the encodings the HTTP parser decodes here; one it cannot decode is
    its 400), with nothing stored."""
    block = jsonl([chat_line("bomb", content_pad="z" * 4000)]) * 256
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    bomb = squeeze.compress(
        b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="b.jsonl"\r\n\r\n'
    )
    for _ in range(150 * MiB // len(block)):
        bomb += squeeze.compress(block)
    bomb += squeeze.compress(b"\r\n--B--\r\n") + squeeze.flush()
    assert len(bomb) < MiB
    client = batch_client(router.url)
    before = len(client.files.list().data)

    async def send(encoding: str) -> tuple[int, dict[str, object]]:
        headers = {**AUTH, "Content-Type": "multipart/form-data; boundary=B",
                   "Content-Encoding": encoding}  # fmt: skip
        async with (
            aiohttp.ClientSession() as session,
            session.post(router.url + "/v1/files", data=bomb, headers=headers) as r,
        ):
            return r.status, await r.json()

    async def bombs() -> list[tuple[int, dict[str, object]]]:
        return await asyncio.gather(*(send(e) for e in ("gzip", "gzip", "gzip", "deflate")))

    with Peak(router) as peak:
        answers = asyncio.run(bombs())
    for status, doc in answers:
        assert status == 415, doc
        assert doc["error"]["code"] == "unsupported_media_type"  # type: ignore[index]
    assert peak.grew < MARGIN_MIB, peak.grew
    assert len(client.files.list().data) == before


def tenant_id(key: str) -> str:
    """The owner id the router gives ``key``'s files (its own code, router.control.auth)."""
    spec = ApiKeySpec(name="tests", sha256=hashlib.sha256(key.encode()).hexdigest())
    tenant = Gate([spec], required=False).identify({"Authorization": f"Bearer {key}"})
    assert tenant is not None
    return tenant.capture_id


async def _answered_but_one(url: str, lines: int, size: int) -> tuple[str, SqlStore]:
    """A running batch in the store at ``url`` whose lines are answered (``size`` bytes each)
    but the last, held by worker T: the store, open, to answer it with."""
    store = SqlStore(url)
    await store.open()
    row = BatchRow("batch_big", tenant_id(KEY), "/v1/chat/completions", "file-x", "24h",
                   "in_progress", int(time.time()), 10**10, total=lines)  # fmt: skip
    await store.create_batch(row)
    await store.add_lines(row.id, 0, [NewLine(f"c{i}", row.endpoint, b"{}") for i in range(lines)])
    taken = await store.claim(row.id, "T", lines, time.time(), time.time() + 3600)
    answer = b'{"pad": "' + b"a" * (size - 12) + b'"}'  # with its newline, size bytes
    for line in taken[:-1]:
        assert await store.finish_line(line, "T", Finished(True, answer), time.time())
    return row.id, store


def test_finalizing_a_large_output(tmp_path: Path) -> None:
    """The last line of a batch of ``FILE_MIB`` MiB of answers is answered (by another
    replica, through the shared store): the router writes the output file, bounded."""
    url = f"sqlite:///{tmp_path / 'data' / 'batch.db'}"
    lines, size = FILE_MIB * 32, 32 * 1024
    batch_id, store = asyncio.run(_answered_but_one(url, lines, size))
    with start_router(write_config(tmp_path, config(tmp_path))) as router:

        async def last() -> None:
            [line] = await store.claim(batch_id, "T", 1, time.time() + 7200, time.time() + 7300)
            assert await store.finish_line(line, "T", Finished(True, b'{"last": 1}'), time.time())
            await store.close()

        client = batch_client(router.url)
        time.sleep(1.0)  # the executor has looked, and found the batch still running
        assert client.batches.retrieve(batch_id).status == "in_progress"
        with Peak(router) as peak:
            asyncio.run(last())
            done = wait(client, batch_id, timeout=120)
        assert done.status == "completed" and done.output_file_id is not None
        output = client.files.retrieve(done.output_file_id)
        assert output.bytes == (lines - 1) * size + len(b'{"last": 1}\n')
        assert peak.grew < MARGIN_MIB, peak.grew
