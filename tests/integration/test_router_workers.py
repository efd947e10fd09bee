"""`turnout serve --workers 2`: one truthful /metrics and one view of the backends' load.

Each request and scrape goes over a fresh connection, so the kernel spreads them over both
workers (SO_REUSEPORT) as it would a fleet of clients and a Prometheus server.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from openai import Stream
from openai.types.chat import ChatCompletionChunk

from router.workers import MAX_RESTARTS
from tests.procs import Emulator, Process, start_emulator
from tests.router.harness import base_config, client_for, get, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
SCRAPES = 30
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with start_emulator("vllm", time_scale=4) as emu:
        yield emu


@contextlib.contextmanager
def two_workers(
    emulator: Emulator, tmp_path: Path, **backend: object
) -> Iterator[tuple[Process, set[int]]]:
    """The router and its workers' pids."""
    doc = base_config([("vllm", "vllm", emulator.url)])
    doc["backends"][0].update(backend)
    with start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router:
        pids = {get(router.url + "/health").json()["pid"] for _ in range(40)}
        assert len(pids) == 2  # both workers answer on the shared port
        yield router, pids


def dead(pid: int) -> bool:
    """``pid`` has exited, all its threads too (their last one closes its sockets): reaped
    by its parent, the router, or a zombie it has yet to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z" and tasks == [str(pid)]


def workers_of(router: Process) -> set[int]:
    """The router's child processes: its workers (these tests give it no emulators)."""
    pid = router.proc.pid
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except FileNotFoundError:  # the router has exited
        return set()


def long_stream(open_: contextlib.ExitStack, url: str) -> Stream[ChatCompletionChunk]:
    """A chat stream of 3,000 tokens on a connection of its own, closed with ``open_``."""
    client = open_.enter_context(client_for(url))
    return open_.enter_context(
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3000,
            stream=True,
            extra_body={"min_tokens": 3000, "ignore_eos": True},
        )
    )


def worker_prefix(request_id: str) -> str:
    """The part of a router-made request id that names the worker process."""
    return request_id.rsplit("-", 1)[0]


def gone(router: Process, pid: int) -> bool:
    """The router has reaped its worker ``pid``."""
    return pid not in workers_of(router)


def wait_for(check: Callable[[], bool], seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, check
        time.sleep(0.05)


def series(text: str, name: str, label: str = "") -> float:
    """The sum of every sample of ``name`` in an exposition (those with ``label``)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_every_scrape_counts_every_workers_requests(emulator: Emulator, tmp_path: Path) -> None:
    sequence: list[tuple[int, float, float, float]] = []
    with two_workers(emulator, tmp_path) as (router, pids):
        for sent in range(1, SCRAPES + 1):
            reply = post(router.url + "/v1/chat/completions", CHAT)
            assert reply.status == 200, reply.text
            text = get(router.url + "/metrics").text
            sequence.append(
                (
                    sent,
                    series(text, "turnout_requests_total"),
                    series(text, "turnout_e2e_request_latency_seconds_count"),
                    series(text, "turnout_e2e_request_latency_seconds_bucket", 'le="+Inf"'),
                )
            )
        # A worker that dies takes nothing with it: its figures stay in the sum.
        os.kill(victim := min(pids), signal.SIGKILL)
        wait_for(lambda: dead(victim))  # else a connection could still reach its closing socket
        after = [series(get(router.url + "/metrics").text, "turnout_requests_total")
                 for _ in range(5)]  # fmt: skip
    assert after == [SCRAPES] * 5
    print("sent, requests_total, e2e count, e2e +Inf bucket:", sequence)  # for the report
    totals = [s[1] for s in sequence]
    assert totals == sorted(totals)  # never backwards
    # Each request was recorded before its answer was sent, whichever worker served it, and
    # whichever worker answered the scrape summed them all; the histograms merged likewise.
    assert all(sent == total == count == inf for sent, total, count, inf in sequence)


def test_workers_see_one_load_and_one_max_inflight(emulator: Emulator, tmp_path: Path) -> None:
    with (
        two_workers(emulator, tmp_path, max_inflight=2) as (router, _),
        contextlib.ExitStack() as open_,
    ):
        for _ in range(2):  # two streams of about 10 s, each on its own connection
            next(iter(long_stream(open_, router.url)))
        for _ in range(10):  # every worker sees both streams...
            [backend] = get(router.url + "/turnout/backends").json()
            assert backend["inflight"] == 2
            text = get(router.url + "/metrics").text
            assert series(text, "turnout_inflight_requests") == 2  # one series, not two
            assert series(text, "turnout_backend_up") == 1
        # ...so the backend's max_inflight is the router's, not each worker's.
        for _ in range(6):
            reply = post(router.url + "/v1/chat/completions", CHAT)
            assert reply.status == 429, reply.text


def test_a_dead_worker_is_replaced_and_its_load_forgotten(
    emulator: Emulator, tmp_path: Path
) -> None:
    with two_workers(emulator, tmp_path) as (router, pids), contextlib.ExitStack() as open_:
        assert workers_of(router) == pids
        streams: list[tuple[str, Iterator[object]]] = []  # (serving worker's id prefix, chunks)
        while len(streams) < 4 or len({w for w, _ in streams}) < 2:  # streams on both workers
            assert len(streams) < 16
            stream = long_stream(open_, router.url)
            chunks = iter(stream)
            next(chunks)
            streams.append((worker_prefix(stream.response.headers["x-request-id"]), chunks))
        [backend] = get(router.url + "/turnout/backends").json()
        assert backend["inflight"] == len(streams)
        os.kill(victim := min(pids), signal.SIGKILL)
        wait_for(lambda: gone(router, victim) and len(workers_of(router)) == 2)
        [replacement] = workers_of(router) - pids
        wait_for(lambda: replacement in {get(router.url + "/health").json()["pid"]
                                         for _ in range(20)})  # fmt: skip
        # The survivor is the worker of the two that still answers (each worker's request
        # ids start with its own prefix; the replacement drew a new one).
        answering = {worker_prefix(post(router.url + "/v1/chat/completions", CHAT).headers[
            "x-request-id"]) for _ in range(30)}  # fmt: skip
        [survivor] = answering & {w for w, _ in streams}
        kept = [c for w, c in streams if w == survivor]
        for live in kept:
            next(live)
        # The victim's in-flight requests died with it: the load every worker sees, and the
        # gauge every scrape shows, count only the streams still open.
        for _ in range(10):
            [backend] = get(router.url + "/turnout/backends").json()
            assert backend["inflight"] == len(kept)
            text = get(router.url + "/metrics").text
            assert series(text, "turnout_inflight_requests") == len(kept)
        for w, cut in streams:
            if w != survivor:  # past what its socket had buffered, the stream is cut
                with pytest.raises(openai.APIConnectionError):
                    for _ in cut:
                        pass


def test_workers_that_keep_dying_stop_the_router(emulator: Emulator, tmp_path: Path) -> None:
    with two_workers(emulator, tmp_path) as (router, _):
        for _ in range(MAX_RESTARTS + 1):
            victim = min(workers_of(router))
            os.kill(victim, signal.SIGKILL)
            wait_for(functools.partial(gone, router, victim))
        assert router.proc.wait(timeout=15) == 1
