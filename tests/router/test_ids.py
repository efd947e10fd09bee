"""Request ids: distinct within a process, and a forked child never repeats its parent's."""

from __future__ import annotations

import os

from router.server.ids import new_request_id


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
