"""Issue 26: the Batch API against a hostile client, each attack on a real router process.

Bodies that never come are timed out (408) and their connections closed, on ``/v1/files``
and ``/v1/batches`` as on every route; no port but the public one listens, lines running or
not; every Batch call counts against the caller's
requests per minute and concurrency; one tenant's own 429s inside its batch hold back its
lines only, never the window every batch shares; a key the router does not know is refused,
never taken for anonymous, and anonymous callers get the Batch API only when configured;
paging from another caller's id looks like paging from one that does not exist. (The memory
attacks are in test_batch_memory.py.)
"""

from __future__ import annotations

import hashlib
import io
import re
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import openai
import pytest

from tests.batchkit import (
    AUTH,
    KEY,
    batch_client,
    chat_line,
    jsonl,
    keyed,
    lines_of,
    paced,
    submit,
    wait,
)
from tests.procs import Process, start_emulator
from tests.router.harness import base_config, get, request, start_router, write_config

IDLE, BODY = 5.0, 3.0
"""The attack's limits: idle connections closed after 5 s, bodies due within 3 s."""


def key(name: str, **limits: int) -> dict[str, Any]:
    return {"name": name, "sha256": hashlib.sha256(f"k-{name}".encode()).hexdigest(), **limits}


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Process]:
    work = tmp_path_factory.mktemp("batch-attacks")
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        # An SLO far above what the emulators take: no interactive traffic moves the window,
        # only what the batches themselves meet does.
        paced(doc, 600.0)
        doc["limits"] = {"idle_seconds": IDLE, "body_seconds": BODY}
        doc["batch"] = {"data_dir": str(work / "data"), "initial_concurrency": 2,
                        "max_concurrency": 32}  # fmt: skip
        keyed(doc, key("alice"), key("bob"), key("slow", requests_per_minute=3),
              key("single", max_concurrency=1), key("thin", requests_per_minute=6))  # fmt: skip
        with start_router(write_config(work, doc)) as proc:
            yield proc


def _addr(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def got_socket(obj: object) -> socket.socket:
    assert isinstance(obj, socket.socket)
    return obj


def _until_closed(socks: list[socket.socket], limit: float) -> dict[socket.socket, bytes]:
    """What each socket received before the router closed it; fails past ``limit`` s."""
    got = {s: b"" for s in socks}
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            assert left > 0, f"{len(sel.get_map())} of {len(socks)} connections still open"
            for k, _ in sel.select(min(left, 0.5)):
                s = got_socket(k.fileobj)
                try:
                    data = s.recv(65536)
                except ConnectionError:
                    data = b""
                got[s] += data
                if not data:
                    sel.unregister(s)
    return got


def test_bodies_that_never_come_are_timed_out_on_every_batch_route(router: Process) -> None:
    """300 connections send a head and no body: each gets 408 once ``body_seconds`` are up,
    and is closed at most ``body_seconds`` later (the rest of its body read and dropped
    meanwhile, so the client reads the answer); heads that never end are closed after
    ``idle_seconds``."""
    heads = [
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: multipart/form-data; boundary=B\r\nContent-Length: 100000\r\n\r\n",
        b"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
    ]  # fmt: skip
    socks, halves = [], []
    try:
        for i in range(300):
            s = socket.create_connection(_addr(router.url), timeout=5)
            s.sendall(heads[i % 2])
            socks.append(s)
        for _ in range(50):
            s = socket.create_connection(_addr(router.url), timeout=5)
            s.sendall(b"POST /v1/files HTTP/1.1\r\nHost: x\r\n")
            halves.append(s)
        started = time.monotonic()
        got = _until_closed(socks, 2 * BODY + 4)
        assert all(g.startswith(b"HTTP/1.1 408") for g in got.values()), set(got.values())
        assert all(b'"code":"request_timeout"' in g for g in got.values())
        _until_closed(halves, max(1.0, IDLE + 4 - (time.monotonic() - started)))
    finally:
        for s in socks + halves:
            s.close()
    assert get(router.url + "/health").status == 200


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (from /proc: its sockets' inodes)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = str(fd.readlink()) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


def test_lines_run_in_process_and_the_router_listens_on_its_public_port_alone(
    router: Process,
) -> None:
    """Batch lines enter the request path in-process (router.batch.lines): while a batch's
    lines run, and after, the router listens on no port but the public one, so there is no
    side door for a stranger to send a line through."""
    public = {_addr(router.url)[1]}
    alice = batch_client(router.url, "k-alice")
    batch = submit(alice, [chat_line(f"p{i}", max_tokens=32) for i in range(20)])
    deadline = time.monotonic() + 60
    while not getattr(alice.batches.retrieve(batch.id).request_counts, "completed", 0):
        assert time.monotonic() < deadline, "no line of the batch ran"
        time.sleep(0.05)
    assert _listening_ports(router.proc.pid) == public  # lines are running
    done = wait(alice, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 20
    out = lines_of(alice, done.output_file_id)
    assert {row["response"]["status_code"] for row in out} == {200}
    assert _listening_ports(router.proc.pid) == public


def test_batch_calls_count_against_the_keys_limits(router: Process) -> None:
    """A key at 3 requests a minute: an upload and 2 of 20 creates, the rest 429; a key at
    one concurrent request: a call while its upload trickles in is 429."""
    slow = batch_client(router.url, "k-slow")
    bad = slow.files.create(file=("bad.jsonl", io.BytesIO(b"not json\n")), purpose="batch")
    created = refused = 0
    for _ in range(20):  # the batches fail validation: nothing of them runs meanwhile
        try:
            slow.batches.create(
                input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            created += 1
        except openai.RateLimitError as exc:
            assert int(exc.response.headers["Retry-After"]) >= 1
            refused += 1
    assert (created, refused) == (2, 18)
    single = batch_client(router.url, "k-single")
    with socket.create_connection(_addr(router.url), timeout=10) as s:
        s.sendall(b"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k-single\r\n"
                  b"Content-Type: multipart/form-data; boundary=B\r\nContent-Length: 9999\r\n\r\n"
                  b"--B\r\n")  # fmt: skip
        time.sleep(0.5)  # the upload holds the key's one slot while its form trickles in
        with pytest.raises(openai.RateLimitError):
            single.files.list()
        assert _until_closed([s], 2 * BODY + 3)[s].startswith(b"HTTP/1.1 408")
    assert single.files.list().data == []  # the slot is free again


def _windows(url: str, stop: threading.Event, seen: list[float]) -> None:
    while not stop.is_set():
        text = get(url + "/metrics").text
        found = re.search(r"^turnout_batch_concurrency_limit (\S+)$", text, re.M)
        if found is not None:
            seen.append(float(found.group(1)))
        time.sleep(0.05)


def quota_refusals(url: str) -> float:
    """Requests the router refused for their key's quota (before classification or after)."""
    text = get(url + "/metrics").text
    found = re.findall(r'^turnout_requests_total\{[^}]*reason="quota"[^}]*\} (\S+)$', text, re.M)
    return sum(float(x) for x in found)


def test_a_tenants_own_429s_pace_only_that_tenant(router: Process) -> None:
    """Tenant thin (6 requests a minute) runs a batch far over its quota beside tenant
    tests' batch: thin's lines get 429 and wait, and the window both share never shrinks
    for them (it keeps growing while lines wait); tests' batch completes whole."""
    thin = batch_client(router.url, "k-thin")
    tests = batch_client(router.url)
    seen: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=_windows, args=(router.url, stop, seen))
    refused = quota_refusals(router.url)
    sampler.start()
    try:
        over = thin.files.create(
            file=("thin.jsonl", io.BytesIO(jsonl([chat_line(f"t{i}") for i in range(60)]))),
            purpose="batch",
        )
        # Its window ends on its own: thin's calls may well be over its quota by then.
        thin.batches.create(
            input_file_id=over.id,
            endpoint="/v1/chat/completions",
            completion_window="30s",  # type: ignore[arg-type]  # a window of the router's own
        )
        time.sleep(1.5)  # thin's lines have met its quota
        # Lines long enough that the batch outlasts a few pacing periods (PERIOD, 1 s): at 16
        # tokens it was over in about 0.6 s, and whether an adjustment fell inside it was luck.
        rows = [chat_line(f"m{i}", max_tokens=400, ignore_eos=True) for i in range(200)]
        mine = tests.files.create(file=("mine.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
        batch = tests.batches.create(
            input_file_id=mine.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = wait(tests, batch.id, timeout=120)
    finally:
        stop.set()
        sampler.join()
    assert done.status == "completed" and done.request_counts is not None, done
    assert done.request_counts.completed == 200
    assert sorted(x["custom_id"] for x in lines_of(tests, done.output_file_id)) == sorted(
        r["custom_id"] for r in rows
    )
    assert seen == sorted(seen), seen  # never a decrease
    assert seen[-1] > 2, seen  # ...and it grew past its start while tests' lines waited
    assert quota_refusals(router.url) > refused  # thin's lines did meet its quota


def test_a_key_the_router_does_not_know_is_refused(router: Process) -> None:
    """Keys are optional here, yet the Batch API is off for callers without a key (no
    ``batch.anonymous``) and a key the router does not know is a 401, never anonymous."""
    files = router.url + "/v1/files"
    for headers in ({}, {"Authorization": "Bearer k-mallory"}, {"Authorization": "Bearer"}):
        reply = request("GET", files, headers=headers)
        assert reply.status == 401, reply.text
        assert reply.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        batch_client(router.url, "k-mallory").files.list()
    assert request("GET", files, headers=AUTH).status == 200


def test_anonymous_callers_are_one_owner_only_when_configured(tmp_path: Path) -> None:
    doc = keyed(base_config([("down", "vllm", "http://127.0.0.1:9")]), key("alice"))
    doc["batch"] = {"data_dir": str(tmp_path / "data"), "anonymous": True}
    with start_router(write_config(tmp_path, doc)) as router:
        files = router.url + "/v1/files"
        form = b'--B\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--B\r\n'
        form += b'Content-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{}\r\n'
        kind = {"Content-Type": "multipart/form-data; boundary=B"}
        anonymous = request("POST", files, form + b"--B--\r\n", kind)
        assert anonymous.status == 200, anonymous.text
        anonymous_id = anonymous.json()["id"]
        alice = batch_client(router.url, "k-alice")
        hers = alice.files.create(file=("h.jsonl", io.BytesIO(b"{}\n")), purpose="batch")
        assert [f.id for f in alice.files.list()] == [hers.id]
        listed = request("GET", files, headers={}).json()["data"]
        assert [f["id"] for f in listed] == [anonymous_id]
        assert request("GET", f"{files}/{hers.id}", headers={}).status == 404
        with pytest.raises(openai.NotFoundError):
            alice.files.retrieve(anonymous_id)
        with pytest.raises(openai.AuthenticationError):  # still no side door for a wrong key
            batch_client(router.url, "k-mallory").files.list()


def test_without_configured_keys_a_file_belongs_to_the_key_presented(tmp_path: Path) -> None:
    """A router that knows no key cannot tell a right key from a wrong one: each key a caller
    presents owns what it creates (its lines run as anonymous traffic), and a caller with no
    key at all is still refused without ``batch.anonymous``."""
    with start_emulator("deepinfer", time_scale=50) as engine:
        doc = base_config([("deepinfer", "deepinfer", engine.url)])
        doc["batch"] = {"data_dir": str(tmp_path / "data")}
        with start_router(write_config(tmp_path, doc)) as router:
            one, two = batch_client(router.url, "k-one"), batch_client(router.url, "k-two")
            f = one.files.create(file=("a.jsonl", io.BytesIO(jsonl([chat_line("a")]))),
                                 purpose="batch")  # fmt: skip
            done = wait(one, one.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            ).id)  # fmt: skip
            assert done.status == "completed" and done.request_counts is not None
            assert done.request_counts.completed == 1
            for call in (lambda: two.files.retrieve(f.id), lambda: two.batches.retrieve(done.id)):
                with pytest.raises(openai.NotFoundError):
                    call()
            assert two.files.list().data == [] and [x.id for x in one.files.list()] != []
            assert request("GET", router.url + "/v1/files", headers={}).status == 401


def test_paging_from_another_callers_id_is_paging_from_none(router: Process) -> None:
    """Bob pages his lists from alice's ids: empty pages, byte for byte those from ids that
    do not exist (before, they showed his rows older or newer than hers: hers existed)."""
    alice, bob = batch_client(router.url, "k-alice"), batch_client(router.url, "k-bob")

    def upload_and_submit(client: openai.OpenAI) -> tuple[str, str]:
        f = client.files.create(file=("x.jsonl", io.BytesIO(b"x\n")), purpose="batch")
        b = client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        return f.id, b.id

    upload_and_submit(bob)  # bob's rows on either side of alice's
    her_file, her_batch = upload_and_submit(alice)
    upload_and_submit(bob)
    bobs = {"Authorization": "Bearer k-bob"}
    for path, query, foreign in (
        ("/v1/files", "", her_file),
        ("/v1/files", "&order=asc", her_file),
        ("/v1/batches", "", her_batch),
    ):
        pages = [
            request("GET", f"{router.url}{path}?after={cursor}{query}", headers=bobs)
            for cursor in (foreign, foreign[:-4] + "0000")
        ]
        assert pages[0].status == pages[1].status == 200
        assert pages[0].content == pages[1].content, (pages[0].text, pages[1].text)
        assert pages[0].json()["data"] == []
    assert len(bob.files.list().data) == 2 and len(bob.batches.list().data) == 2
