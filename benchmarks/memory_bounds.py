"""The router's peak memory under hostile loads, one fresh router process per scenario.

Each scenario of :data:`SCENARIOS` starts ``turnout serve`` from ``--router-root`` (this
checkout by default; point it at another to measure that one) with its own config in a
temporary directory, runs its load over loopback and reports the process's RSS once it was
ready and its peak (the kernel's ``VmHWM``), with what the clients were answered. A scenario
is one row of the table: add one as another :class:`Scenario` entry.

The Batch API scenarios (issue 26) use a file of ``--mib`` MiB (184 by default, the size of
the issue's attack), one configured API key, and a backend that is never up, so no batch
line is served while they run. The capture scenarios send issue 26's capture flood: 200 chat
requests of 8 MiB (a lorem-ipsum prompt) for a model no backend serves, 4 at a time, each
refused with 404 before any backend and captured all the same; they also say how many
lines the capture got, when the last came after the last answer (a writer behind shows
there; the wait ends once every request is written or counted as dropped, or after a
minute without a line) and what was dropped. ``flood-no-capture`` sends the same with
capture off, for what the requests cost in flight::

    .venv/bin/python -m benchmarks.memory_bounds [--scenario NAME ...] [--router-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import re
import sqlite3
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from benchmarks.hostile_backend import ROOT, _spawn

KEY = "memory-bounds-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MiB = 1 << 20
BOUNDARY = "memoryboundsform"


@dataclass(frozen=True)
class Run:
    """A running router as a scenario sees it."""

    url: str
    pid: int
    work: Path
    mib: int


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    configure: Callable[[dict[str, Any], Path], None]
    """Adjusts the router's config (a temporary directory is the second argument)."""
    load: Callable[[Run], Coroutine[Any, Any, str]]
    """Runs against the ready router; returns what the clients were answered."""
    prepare: Callable[[Run], None] | None = None
    """Runs against a first start of the router, stopped before the measured one."""


def _vm_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for process {pid}")


def _tally(statuses: list[int | str]) -> str:
    return ", ".join(f"{n} x {s}" for s, n in Counter(statuses).most_common())


# -- the Batch API's scenarios ---------------------------------------------------------------


def _batch_config(doc: dict[str, Any], work: Path) -> None:
    doc["api_keys"] = [{"name": "bench", "sha256": hashlib.sha256(KEY.encode()).hexdigest()}]
    # One line at a time at most: a created batch must not turn into load while measured.
    doc["batch"] = {"data_dir": str(work / "batch"), "max_concurrency": 1}


def _line(i: int, size: int) -> bytes:
    """A valid chat batch line of about ``size`` bytes."""
    head = {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions"}
    text = "x" * max(1, size - 200)
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": text}]}
    return orjson.dumps({**head, "body": body}) + b"\n"


def _content(mib: int) -> Iterator[bytes]:
    """A valid batch input file of ``mib`` MiB, a MiB at a time (4 KiB lines)."""
    i = 0
    for _ in range(mib):
        piece = io.BytesIO()
        while piece.tell() < MiB - 4096:
            piece.write(_line(i, 4096))
            i += 1
        yield piece.getvalue()


def _form_parts() -> tuple[bytes, bytes]:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"'
        "\r\nContent-Type: application/jsonl\r\n\r\n"
    ).encode()
    return head, f"\r\n--{BOUNDARY}--\r\n".encode()


def _form_size(mib: int) -> int:
    head, tail = _form_parts()
    return len(head) + sum(len(c) for c in _content(mib)) + len(tail)


async def _form(mib: int) -> AsyncIterator[bytes]:
    head, tail = _form_parts()
    yield head
    for piece in _content(mib):
        yield piece
    yield tail


def _upload_headers(length: int, **extra: str) -> dict[str, str]:
    kind = f"multipart/form-data; boundary={BOUNDARY}"
    return {**AUTH, "Content-Type": kind, "Content-Length": str(length), **extra}


async def _upload(session: aiohttp.ClientSession, run: Run) -> tuple[int, str]:
    headers = _upload_headers(_form_size(run.mib))
    async with session.post(run.url + "/v1/files", data=_form(run.mib), headers=headers) as r:
        doc = await r.json(content_type=None)
        return r.status, str(doc.get("id", doc))


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))


async def gzip_bombs(run: Run) -> str:
    """4 concurrent uploads of a gzip-encoded form whose file inflates to ``mib`` MiB."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: the gzip format
    head, tail = _form_parts()
    block = _line(0, 4096) * (MiB // 4096)
    bomb = squeeze.compress(head)
    for _ in range(run.mib):
        bomb += squeeze.compress(block)
    bomb += squeeze.compress(tail) + squeeze.flush()
    headers = _upload_headers(len(bomb), **{"Content-Encoding": "gzip"})
    async with await _session() as session:

        async def one() -> int | str:
            try:
                async with session.post(run.url + "/v1/files", data=bomb, headers=headers) as r:
                    await r.read()
                    return r.status
            except aiohttp.ClientError as exc:
                return type(exc).__name__

        statuses = await asyncio.gather(*(one() for _ in range(4)))
    return f"{len(bomb) // 1024} KiB on the wire each: {_tally(list(statuses))}"


async def large_uploads(run: Run) -> str:
    """4 concurrent plain uploads of ``mib`` MiB each."""
    async with await _session() as session:
        answers = await asyncio.gather(*(_upload(session, run) for _ in range(4)))
    return _tally([s for s, _ in answers])


async def slow_downloads(run: Run) -> str:
    """One upload of ``mib`` MiB, then 6 concurrent downloads of it read at 640 KiB/s for 15 s."""
    async with await _session() as session:
        status, file_id = await _upload(session, run)
        if status != 200:
            return f"upload: {status} {file_id}"

        async def one() -> int | str:
            try:
                url = f"{run.url}/v1/files/{file_id}/content"
                async with session.get(url, headers=AUTH) as r:
                    until = time.monotonic() + 15
                    while time.monotonic() < until and await r.content.read(64 * 1024):
                        await asyncio.sleep(0.1)
                    return r.status
            except aiohttp.ClientError as exc:
                return type(exc).__name__

        statuses = await asyncio.gather(*(one() for _ in range(6)))
    return _tally(list(statuses))


async def batch_creates(run: Run) -> str:
    """One upload of ``mib`` MiB of valid lines, then 3 concurrent batches created over it."""
    async with await _session() as session:
        status, file_id = await _upload(session, run)
        if status != 200:
            return f"upload: {status} {file_id}"
        doc = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
               "completion_window": "24h"}  # fmt: skip

        async def one() -> str:
            async with session.post(run.url + "/v1/batches", json=doc, headers=AUTH) as r:
                got = await r.json(content_type=None)
                return f"{r.status} {got.get('status', got)}"

        answers = await asyncio.gather(*(one() for _ in range(3)))
    return _tally(list(answers))


FINALIZE_MIB = 400
"""The output file the finalize scenario has the router write."""
_RESULT_BYTES = 32 * 1024


def _finalize_store(run: Run) -> None:
    """A batch whose every line is answered, ``FINALIZE_MIB`` MiB of answers in all, written
    straight into the store the first start created (these tables are the same before and
    after issue 26), for the measured start to finalize."""
    db = sqlite3.connect(run.work / "batch" / "batch.db")
    lines = FINALIZE_MIB * MiB // _RESULT_BYTES
    now = int(time.time())
    batch = ("batch_bench", "", "/v1/chat/completions", "file-none", "24h", "in_progress",
             now, now + 86400, now, lines, lines, 0, 0, 0, time.time_ns())  # fmt: skip
    with db:
        db.execute(
            "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, "
            "status, created_at, expires_at, in_progress_at, total, completed, failed, "
            "prompt_tokens, completion_tokens, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
            "?, ?, ?, ?)",
            batch,
        )
        text = "y" * (_RESULT_BYTES - 200)
        for i in range(lines):
            response = {"status_code": 200, "request_id": f"c{i}", "body": text}
            answer = {"id": f"batch_req_{i}", "custom_id": f"c{i}", "response": response}
            db.execute(
                "INSERT INTO batch_lines (batch_id, idx, custom_id, url, body, state, result) "
                "VALUES (?, ?, ?, ?, ?, 'done', ?)",
                ("batch_bench", i, f"c{i}", "/v1/chat/completions", b"{}", orjson.dumps(answer)),
            )
    db.close()


async def finalize(run: Run) -> str:
    """The router finalizes a batch of ``FINALIZE_MIB`` MiB of answers (prepared store)."""
    deadline = time.monotonic() + 600
    db = sqlite3.connect(run.work / "batch" / "batch.db")
    try:
        while time.monotonic() < deadline:
            row = db.execute("SELECT status FROM batches WHERE id = 'batch_bench'").fetchone()
            if row[0] == "completed":
                return f"completed, {FINALIZE_MIB} MiB of output"
            await asyncio.sleep(0.2)
    finally:
        db.close()
    return f"still {row[0]} after 600 s"


# -- the capture scenarios -------------------------------------------------------------------

FLOOD_REQUESTS, FLOOD_MIB, FLOOD_CLIENTS = 200, 8, 4


def unknown_model_body(size: int) -> bytes:
    """A chat request of ``size`` bytes (a lorem-ipsum prompt) for a model no backend serves:
    refused with 404 before any backend, and captured all the same."""
    head, tail = b'{"model":"no-such-model","messages":[{"role":"user","content":"', b'"}]}'
    words = b"lorem ipsum dolor sit amet "
    return head + (words * (size // len(words) + 1))[: size - len(head) - len(tail)] + tail


def settled(path: Path, done: Callable[[int], bool], quiet: float, limit: float = 900.0) -> float:
    """Wait until ``done(lines in path)`` or ``path`` has not grown for ``quiet`` seconds;
    when it last grew."""
    size, grew = -1, time.monotonic()
    deadline = grew + limit
    while time.monotonic() < deadline and time.monotonic() - grew < quiet:
        now = path.stat().st_size if path.exists() else 0
        if now != size:
            size, grew = now, time.monotonic()
            if done(path.read_bytes().count(b"\n")):
                break
        time.sleep(0.05)
    return grew


def _known_model(doc: dict[str, Any], work: Path) -> None:
    # The backend is never up: a model it lists makes every other name a 404 at once.
    doc["backends"][0]["models"] = ["m"]


def _capture(redaction: str) -> Callable[[dict[str, Any], Path], None]:
    def configure(doc: dict[str, Any], work: Path) -> None:
        _known_model(doc, work)
        doc["capture"] = {"path": str(work / "capture.jsonl"), "redaction": redaction}

    return configure


async def _dropped(session: aiohttp.ClientSession, run: Run) -> dict[str, float]:
    async with session.get(run.url + "/metrics") as r:
        text = await r.text()
    found = re.findall(r'^turnout_capture_dropped_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    return {reason: float(v) for reason, v in found if float(v)}


async def _flood(session: aiohttp.ClientSession, run: Run) -> list[int | str]:
    body = unknown_model_body(FLOOD_MIB * MiB)
    left = list(range(FLOOD_REQUESTS))
    statuses: list[int | str] = []

    async def client() -> None:
        while left:
            left.pop()
            try:
                async with session.post(
                    run.url + "/v1/chat/completions",
                    data=body,
                    headers={"Content-Type": "application/json"},
                ) as r:
                    await r.read()
                    statuses.append(r.status)
            except aiohttp.ClientError as exc:
                statuses.append(type(exc).__name__)  # fmt: skip

    await asyncio.gather(*(client() for _ in range(FLOOD_CLIENTS)))
    return statuses


async def flood_no_capture(run: Run) -> str:
    async with await _session() as session:
        return _tally(await _flood(session, run))


async def capture_flood(run: Run) -> str:
    async with await _session() as session:
        statuses = await _flood(session, run)
        end = time.monotonic()
        loop = asyncio.get_running_loop()

        def done(lines: int) -> bool:
            drops = asyncio.run_coroutine_threadsafe(_dropped(session, run), loop).result()
            return lines + sum(drops.values()) >= len(statuses)

        # A writer that writes in batches goes quiet for long: every line, or a minute.
        capture = run.work / "capture.jsonl"
        last = await asyncio.to_thread(settled, capture, done, 60.0)
        drops = await _dropped(session, run)
    lines = capture.read_bytes().count(b"\n") if capture.exists() else 0
    dropped = ", ".join(f"{v:.0f} {k}" for k, v in drops.items()) or "none"
    return (
        f"{_tally(statuses)}; {lines} lines, the last {max(0.0, last - end):.1f} s after the "
        f"last answer; dropped: {dropped}"
    )


FLOOD = f"{FLOOD_REQUESTS} x {FLOOD_MIB} MiB for an unknown model, {FLOOD_CLIENTS} at a time"
SCENARIOS = (
    Scenario("gzip-bombs", "4 concurrent gzip uploads inflating to --mib MiB each",
             _batch_config, gzip_bombs),
    Scenario("large-uploads", "4 concurrent uploads of --mib MiB", _batch_config, large_uploads),
    Scenario("slow-downloads", "6 slow downloads of one --mib MiB file", _batch_config,
             slow_downloads),
    Scenario("batch-creates", "3 concurrent creates over one --mib MiB input file",
             _batch_config, batch_creates),
    Scenario("finalize", f"finalizing {FINALIZE_MIB} MiB of output", _batch_config, finalize,
             prepare=_finalize_store),
    Scenario("capture-flood", f"{FLOOD}, captured", _capture("none"), capture_flood),
    Scenario("capture-flood-hash", f"{FLOOD}, captured under hash", _capture("hash"),
             capture_flood),
    Scenario("flood-no-capture", f"{FLOOD}, capture off", _known_model, flood_no_capture),
)  # fmt: skip


def _config(work: Path) -> dict[str, Any]:
    """The base config: one backend at a port nobody listens on (it is never up)."""
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": "down", "engine": "vllm", "url": "http://127.0.0.1:9"}],
        "policies": {"only": {"type": "round-robin"}},
        "default_policy": "only",
        "access_log": {"enabled": False},
    }


def measure(scenario: Scenario, root: Path, mib: int) -> tuple[str, float, float, float]:
    """What the clients got, RSS once ready and at its peak (MiB), and the load's seconds."""
    with tempfile.TemporaryDirectory(prefix="memory-bounds-") as tmp:
        work = Path(tmp)
        doc = _config(work)
        scenario.configure(doc, work)
        path = work / "router.yaml"
        path.write_text(yaml.safe_dump(doc))
        argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path), "--port", "0"]
        ready = "turnout listening on "
        if scenario.prepare is not None:
            with _spawn(argv, root, ready) as (proc, url):
                time.sleep(0.5)
            scenario.prepare(Run(url, proc.pid, work, mib))
        with _spawn(argv, root, ready) as (proc, url):
            run = Run(url, proc.pid, work, mib)
            start = _vm_kib(proc.pid, "VmRSS") / 1024
            t0 = time.monotonic()
            outcome = asyncio.run(scenario.load(run))
            took = time.monotonic() - t0
            peak = _vm_kib(proc.pid, "VmHWM") / 1024
    return outcome, start, peak, took


def main() -> None:
    names = [s.name for s in SCENARIOS]
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory_bounds")
    parser.add_argument("--scenario", action="append", choices=names, help="default: all")
    parser.add_argument("--mib", type=int, default=184, help="Batch API file size (MiB)")
    parser.add_argument("--router-root", type=Path, default=ROOT, help="checkout to run")
    args = parser.parse_args()
    root = args.router_root.resolve()
    print(f"router from {root}")
    print("| scenario | what | answers | RSS ready MiB | peak RSS MiB | seconds |")
    print("|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        if args.scenario and scenario.name not in args.scenario:
            continue
        outcome, start, peak, took = measure(scenario, root, args.mib)
        about = scenario.about.replace("--mib", str(args.mib))
        print(f"| {scenario.name} | {about} | {outcome} | {start:.0f} | {peak:.0f} | {took:.1f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
