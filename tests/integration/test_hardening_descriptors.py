"""File descriptors over a real router started with a low limit (soft and hard: it cannot
raise them). Idle sockets past what it can hold get 503s, not resets; requests beyond them
get 503 through the official client; it serves again once they close; and each worker says
so once, not once a refused connection. A cap full of streams still has a descriptor for
every upstream socket, and a soft limit under the hard one is raised at start."""

from __future__ import annotations

import contextlib
import re
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from tests.procs import Process, start_emulator
from tests.router.harness import base_config, client_for, get, start_router, write_config

MODEL = "deepseek-v4.1-flash"
FDS = 256
LOWERED = re.compile(r"limits\.max_connections lowered from 10000 to (\d+)")
FULL = "connection limit of"
AGAIN = "accepting connections again"


@contextlib.contextmanager
def _limited(
    tmp_path: Path,
    soft: int = FDS,
    hard: int = FDS,
    *,
    workers: int = 1,
    time_scale: float = 50.0,
    limits: dict[str, Any] | None = None,
) -> Iterator[tuple[Process, Callable[[], str], list[int]]]:
    """A router started with file descriptor limits ``soft`` and ``hard`` before an
    emulator: the router, its log (read when called) and the cap each worker logged."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    with start_emulator("vllm", time_scale=time_scale) as emu:
        doc = base_config([("vllm", "vllm", emu.url)])
        if limits is not None:
            doc["limits"] = limits
        config = write_config(tmp_path, doc)
        path = tmp_path / "router.log"
        args = ["--workers", str(workers)]
        with start_router(config, args, stderr=path, preexec_fn=limit) as router:

            def log() -> str:
                return path.read_text(errors="replace")

            yield router, log, [int(m) for m in LOWERED.findall(log())]


def _addr(router: Process) -> tuple[str, int]:
    parts = urlsplit(router.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _answers(
    socks: list[socket.socket], expected: int, limit: float = 30.0, settle: float = 0.5
) -> tuple[list[bytes], int]:
    """What each socket received until the router closed it (b"" for one still open), and
    how many were reset: read until ``expected`` of them have ended (or ``limit`` s pass),
    then ``settle`` s more, so that one too many is seen as well. (A second of quiet was the
    end once, but a router starved of CPU for a second under load is quiet too.)"""
    for s in socks:
        s.setblocking(False)  # with a timeout, recv would wait for it even with MSG_DONTWAIT
    got = [b""] * len(socks)
    done = [False] * len(socks)
    resets = 0
    deadline = time.monotonic() + limit
    settled: float | None = None
    while time.monotonic() < (deadline if settled is None else settled):
        for i, s in enumerate(socks):
            if done[i]:
                continue
            try:
                data = s.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                resets += 1
                done[i] = True
                continue
            if data:
                got[i] += data
            else:
                done[i] = True
        if settled is None and sum(done) >= expected:
            settled = time.monotonic() + settle
        time.sleep(0.05)
    return [g if done[i] else b"" for i, g in enumerate(got)], resets


def _chat(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    return reply.choices[0].message.content or ""


@pytest.mark.parametrize("workers", [1, 2])
def test_idle_sockets_past_the_descriptor_budget_get_503_not_resets(
    tmp_path: Path, workers: int
) -> None:
    idle = {"idle_seconds": 60}
    with _limited(tmp_path, workers=workers, limits=idle) as (router, log, caps):
        assert len(caps) == workers, log()  # each worker sized its own cap, and said so
        # Twice what all of them hold: every worker (SO_REUSEPORT spreads connections by
        # a hash) gets more than its cap.
        socks = [socket.create_connection(_addr(router), timeout=5) for _ in range(FDS * 2)]
        try:
            answers, resets = _answers(socks, len(socks) - sum(caps))
            refused = [a for a in answers if a]
            assert resets == 0
            assert len(refused) == len(socks) - sum(caps)
            for answer in refused:
                head, _, body = answer.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 503"), answer
                assert b'"code":"overloaded"' in body, answer
            client = client_for(router.url)
            for _ in range(5):
                with pytest.raises(openai.InternalServerError) as caught:
                    _chat(client)
                assert caught.value.status_code == 503
                assert caught.value.code == "overloaded"
            health = get(router.url + "/health")  # a route of aiohttp's, not the lean server's
            assert health.status == 503 and health.json()["error"]["code"] == "overloaded"
        finally:
            for s in socks:
                s.close()
        deadline = time.monotonic() + 10
        while True:  # served again once the idle sockets are gone
            with contextlib.suppress(openai.InternalServerError):
                assert _chat(client)
                break
            assert time.monotonic() < deadline, "never served again"
            time.sleep(0.1)
        # Hundreds refused, one line a worker when its run of refusals began.
        assert log().count(FULL) == workers, log()
        assert AGAIN in log()


def test_a_full_cap_of_streams_keeps_a_descriptor_for_each_upstream(tmp_path: Path) -> None:
    """Every connection the cap admits may hold an upstream socket: with all of them
    streaming at once, one more client gets a 503 and every stream is served whole."""
    with _limited(tmp_path, time_scale=10) as (router, _, caps):
        (cap,) = caps
        client = client_for(router.url)
        served: list[int] = []
        started = threading.Barrier(cap + 1)
        tried = threading.Event()

        def stream() -> None:
            events = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=200,
                stream=True,
            )
            started.wait(30)
            tried.wait(30)
            served.append(sum(1 for _ in events))

        threads = [threading.Thread(target=stream) for _ in range(cap)]
        for t in threads:
            t.start()
        started.wait(30)  # every stream has its answer's head: all upstreams are open
        # A client of its own: the streams' client would reuse a connection one of them is
        # done with (none is, here: they are read only once this is tried).
        try:
            with pytest.raises(openai.InternalServerError) as caught:
                _chat(client_for(router.url))
        finally:
            tried.set()
        assert caught.value.status_code == 503
        for t in threads:
            t.join(60)
        assert len(served) == cap and min(served) > 1


def test_a_soft_limit_under_the_hard_one_is_raised_at_start(tmp_path: Path) -> None:
    hard = 2048
    with _limited(tmp_path, FDS, hard) as (router, log, caps):
        limits = Path(f"/proc/{router.proc.pid}/limits").read_text()
        (row,) = [line for line in limits.splitlines() if line.startswith("Max open files")]
        assert row.split()[3:5] == [str(hard), str(hard)]
        assert f"file descriptor limit raised from {FDS} to {hard}" in log()
        (cap,) = caps
        assert FDS < cap < hard // 2  # sized within the raised limit
        assert _chat(client_for(router.url))
