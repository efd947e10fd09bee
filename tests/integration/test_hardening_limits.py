"""Connection limits over a real router: slowloris, idle crowds, the connection cap and a
client that stops reading its stream. Memory stays bounded and timeouts close them all."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.procs import Process, rss_kb, start_emulator
from tests.router.harness import base_config, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
IDLE = 1.0


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    with start_emulator("vllm", time_scale=50) as emu:
        doc = base_config([("vllm", "vllm", emu.url)])
        doc["limits"] = {
            "idle_seconds": IDLE,
            "max_connections": 3000,
            "write_timeout": 1.0,
            "body_seconds": 1.0,
        }
        with start_router(write_config(tmp_path_factory.mktemp("limits"), doc)) as proc:
            yield proc


def _addr(router: Process) -> tuple[str, int]:
    parts = urlsplit(router.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _closed_by_peer(sock: socket.socket) -> bool:
    """True once the router has closed (EOF or reset); never blocks."""
    try:
        return sock.recv(65536, socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _wait_all_closed(socks: list[socket.socket], limit: float) -> float:
    t0 = time.monotonic()
    open_ = list(socks)
    while open_:
        assert time.monotonic() - t0 < limit, f"{len(open_)} still open"
        open_ = [s for s in open_ if not _closed_by_peer(s)]
        time.sleep(0.05)
    return time.monotonic() - t0


def test_slowloris_headers_are_cut_off(router: Process) -> None:
    socks = [socket.create_connection(_addr(router), timeout=5) for _ in range(100)]
    try:
        for s in socks:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        deadline = time.monotonic() + IDLE + 5
        alive = list(socks)
        while alive:  # trickle a header byte now and then; the router must not wait forever
            assert time.monotonic() < deadline, f"{len(alive)} slow clients still connected"
            for s in alive:
                with contextlib.suppress(OSError):
                    s.send(b"X")
            time.sleep(0.1)
            alive = [s for s in alive if not _closed_by_peer(s)]
    finally:
        for s in socks:
            s.close()
    assert get(router.url + "/health").status == 200


def test_a_trickled_body_gets_408(router: Process) -> None:
    with socket.create_connection(_addr(router), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
        )
        data = b""
        deadline = time.monotonic() + 8
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            assert time.monotonic() < deadline, data
            with contextlib.suppress(OSError):
                sock.send(b" ")  # one byte now and then: never the whole body
            try:
                data += sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                time.sleep(0.1)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert json.loads(body)["error"]["code"] == "request_timeout"


def test_thousands_of_idle_connections_stay_cheap_and_are_closed(router: Process) -> None:
    before = rss_kb(router.proc.pid)
    socks = []
    try:
        for _ in range(2000):
            socks.append(socket.create_connection(_addr(router), timeout=5))
        time.sleep(0.2)  # let the router accept them all
        during = rss_kb(router.proc.pid)
        assert get(router.url + "/health").status == 200  # still serving
        _wait_all_closed(socks, IDLE + 10)
    finally:
        for s in socks:
            s.close()
    # Each idle connection costs a few KiB of router memory, not a buffer per request.
    assert during - before < 48 * 1024, (before, during)


def test_connection_cap_answers_503(tmp_path: Path) -> None:
    with start_emulator("vllm", time_scale=50) as emu:
        doc = base_config([("vllm", "vllm", emu.url)])
        doc["limits"] = {"max_connections": 5, "idle_seconds": 30}
        with start_router(write_config(tmp_path, doc)) as router:
            held = [socket.create_connection(_addr(router), timeout=5) for _ in range(5)]
            try:
                time.sleep(0.2)
                with socket.create_connection(_addr(router), timeout=5) as extra:
                    data = b""
                    while chunk := extra.recv(65536):
                        data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503")
                assert json.loads(body)["error"]["code"] == "overloaded"
            finally:
                for s in held:
                    s.close()
            deadline = time.monotonic() + 5
            while get(router.url + "/health").status != 200:
                assert time.monotonic() < deadline
                time.sleep(0.05)


def test_a_client_that_stops_reading_is_disconnected(router: Process) -> None:
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 30000,
            "min_tokens": 30000,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(5)
    sock.connect(_addr(router))
    try:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        # Never read: the router's send buffer fills, its write waits, then times out.
        _wait_inflight(router, 1)
        _wait_inflight(router, 0)
        rss = rss_kb(router.proc.pid)
    finally:
        sock.close()
    # Ended by the router as a client that went away (499), not served to the end (200).
    assert _count(router, 'code="499"') == 1
    assert rss < 200 * 1024


def _wait_inflight(router: Process, n: int) -> None:
    deadline = time.monotonic() + 30
    while get(router.url + "/turnout/backends").json()[0]["inflight"] != n:
        assert time.monotonic() < deadline, f"in-flight never reached {n}"
        time.sleep(0.05)


def _count(router: Process, label: str) -> float:
    text = get(router.url + "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("turnout_requests_total{") and label in line
    )
