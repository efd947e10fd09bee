"""Capture under attack, through a real router process (issue 26): a flood of 8 MiB requests
stays within ``capture.queue_bytes``, a killed sink is replaced, a killed router loses only
what its queue held, and the file never holds half a line."""

from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.memory_bounds import settled, unknown_model_body
from tests.procs import Process, rss_kb, start_misbehaving
from tests.router.harness import base_config, get, post, start_router, write_config
from turnout.common.capture import parse_line

MiB = 1 << 20
PIPE = 64 * 1024  # Linux's default pipe capacity


@pytest.fixture(scope="module")
def backend() -> Iterator[Process]:
    with start_misbehaving() as proc:
        yield proc


def _config(tmp: Path, backend: Process, **capture: Any) -> Path:
    doc = base_config([("bad", "vllm", backend.url)])
    doc["capture"] = {"path": str(tmp / "capture.jsonl"), **capture}
    return write_config(tmp, doc)


def _dropped(router: Process) -> dict[str, float]:
    text = get(router.url + "/metrics").text
    found = re.findall(r'^turnout_capture_dropped_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    return {reason: float(v) for reason, v in found if float(v)}


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines() if path.exists() else []


def _settle(path: Path) -> None:
    """Wait until ``path`` has not grown for two seconds."""
    settled(path, lambda _: False, quiet=2.0, limit=120.0)


def _ids(path: Path) -> list[str]:
    """Every line's id; each line must parse (a torn one would not)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n")
    return [parse_line(line).custom_id for line in data.splitlines()]


class _Clients:
    """Threads sending one body each, back to back, with ids ``{prefix}{n}``; ``answered``
    keeps each id with when its answer arrived."""

    def __init__(self, url: str, body: bytes, prefix: str, clients: int, count: int) -> None:
        self._url, self._body, self._prefix = url, body, prefix
        self._left = count
        self._lock = threading.Lock()
        self.answered: list[tuple[str, float]] = []
        self.statuses: list[int] = []
        self._threads = [threading.Thread(target=self._run) for _ in range(clients)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._left == 0:
                    return
                self._left -= 1
                rid = f"{self._prefix}{self._left:05}"
            try:
                status = post(self._url + "/v1/chat/completions", self._body,
                              {"X-Request-Id": rid}).status  # fmt: skip
            except (OSError, http.client.HTTPException):
                return  # the router is gone
            with self._lock:
                self.statuses.append(status)
                self.answered.append((rid, time.monotonic()))

    def stop(self) -> None:
        with self._lock:
            self._left = 0

    def join(self) -> None:
        for t in self._threads:
            t.join(120)


def test_a_flood_of_large_requests_keeps_the_queue_within_its_bytes(
    backend: Process, tmp_path: Path
) -> None:
    """48 requests of 8 MiB refused with 404 and captured under ``hash``, four at a time: the
    router's memory stays within the queue's 16 MiB, the requests in flight and the line being
    written (before: every request waited in the queue, parsed, 16 MiB each, and the writer
    wrote one a second). Every request is either in the file or counted as dropped."""
    capture = tmp_path / "capture.jsonl"
    config = _config(tmp_path, backend, redaction="hash", queue_bytes=16 * MiB)
    n = 48
    with start_router(config) as router:
        time.sleep(0.5)
        before = rss_kb(router.proc.pid)
        peak = [before]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.01):
                peak[0] = max(peak[0], rss_kb(router.proc.pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            clients = _Clients(router.url, unknown_model_body(8 * MiB), "f", 4, n)
            clients.join()
            _settle(capture)
        finally:
            stop.set()
            sampler.join()
        dropped = _dropped(router)
    assert clients.statuses == [404] * n
    assert set(dropped) <= {"queue_bytes"}
    assert len(_ids(capture)) + sum(dropped.values()) == n
    grown_mb = (peak[0] - before) / 1024
    # Measured with these 48 requests: about 190 MB without capture (four 8 MiB requests in
    # flight), 310 MB with it, 1,000 MB before the queue was bounded in bytes.
    assert grown_mb < 600, f"router RSS grew {grown_mb:.0f} MB under the flood"


def _sink_pid(router: Process) -> int:
    for task in Path(f"/proc/{router.proc.pid}/task").iterdir():
        for pid in (task / "children").read_text().split():
            if b"router.observe.sink" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return int(pid)
    raise AssertionError("the router runs no sink")


def test_a_killed_sink_is_replaced_and_loses_only_what_it_held(
    backend: Process, tmp_path: Path
) -> None:
    capture = tmp_path / "capture.jsonl"
    size = 128 * 1024
    body = unknown_model_body(size)
    with start_router(_config(tmp_path, backend)) as router:
        first = _Clients(router.url, body, "a", 2, 40)
        deadline = time.monotonic() + 30
        while len(_lines(capture)) < 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(_sink_pid(router), signal.SIGKILL)
        first.join()
        time.sleep(1.5)  # a new sink may start once a second
        last = _Clients(router.url, body, "b", 2, 20)
        last.join()
        _settle(capture)
        dropped = _dropped(router)
    ids = _ids(capture)
    assert len(set(ids)) == len(ids)
    assert {i for i in ids if i[0] == "b"} == {rid for rid, _ in last.answered}
    assert set(dropped) <= {"sink_gone"}
    lost = 40 - len([i for i in ids if i[0] == "a"]) - sum(dropped.values())
    # The dead sink's read (1 MiB), its pipe, and a line it held: each line a bit over `size`.
    assert 0 <= lost * size <= MiB + PIPE + size, lost


def test_a_killed_router_loses_at_most_its_queue(backend: Process, tmp_path: Path) -> None:
    """A ``kill -9`` loses only the requests not yet piped to the sink, which the queue's
    bytes bound (here 8 requests), and leaves whole lines."""
    capture = tmp_path / "capture.jsonl"
    size = 256 * 1024
    config = _config(tmp_path, backend, queue_bytes=8 * size + 4096)
    with start_router(config) as router:
        clients = _Clients(router.url, unknown_model_body(size), "k", 3, 100_000)
        deadline = time.monotonic() + 30
        while len(_lines(capture)) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        dropped = sum(_dropped(router).values())
        answered_before = len(clients.answered)
        os.kill(router.proc.pid, signal.SIGKILL)
        router.proc.wait(10)
        clients.stop()
        clients.join()
    _settle(capture)  # the sink finishes what its pipe holds, then exits
    captured = set(_ids(capture))
    missing = {rid for rid, _ in clients.answered} - captured
    answered_after = len(clients.answered) - answered_before
    assert len(missing) <= dropped + answered_after + 8
