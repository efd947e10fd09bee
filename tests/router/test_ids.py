"""Request ids: distinct within a process, a forked child never repeats its parent's, and a
client's own id is kept only when it is usable."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp

from router.server.ids import MAX_CLIENT_ID, new_request_id, usable_id
from tests.router.fake_upstream import MODEL, in_process_router
from tests.router.test_handler import config


def test_ids_are_distinct_and_prefixed() -> None:
    ids = [new_request_id() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(rid.startswith("req-") for rid in ids)


def test_a_forked_child_draws_its_own_prefix() -> None:
    before = new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the id it makes next, then leave at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    after = new_request_id()
    assert before.rsplit("-", 1)[0] == after.rsplit("-", 1)[0]  # the parent keeps its prefix
    assert child.rsplit("-", 1)[0] != before.rsplit("-", 1)[0]
    assert child not in (before, after)


async def test_a_client_id_is_kept_only_when_usable(tmp_path: Path) -> None:
    """A client's X-Request-Id is echoed when it is a short printable ASCII string; a huge or
    unprintable one is replaced by a fresh id (it would lengthen every record of the request)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with in_process_router(tmp_path, config()) as ip, aiohttp.ClientSession() as s:
        got = {}
        for given in ("trace-42", "x" * (MAX_CLIENT_ID + 1), "a\tb", "caf\xc3\xa9"):
            async with s.post(
                ip.url + "/v1/chat/completions", json=body, headers={"X-Request-Id": given}
            ) as r:
                assert r.status == 200
                got[given] = r.headers["X-Request-Id"]
    assert got["trace-42"] == "trace-42"
    assert got["x" * MAX_CLIENT_ID + "x"].startswith("req-")
    assert got["a\tb"].startswith("req-")
    assert got["caf\xc3\xa9"].startswith("req-")
    assert usable_id("x" * MAX_CLIENT_ID)  # the bound itself is kept
