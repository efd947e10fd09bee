"""The backend load the workers of one router share (router.backends.shared)."""

from __future__ import annotations

import os

from policies.types import RequestInfo
from router.backends.pool import Pool
from router.backends.shared import SLOTS, SharedLoad
from router.config.model import BackendSpec, HealthSettings


def _request(prompt: int, output: int) -> RequestInfo:
    return RequestInfo(
        request_id="r",
        endpoint="chat",
        model="m",
        stream=True,
        prompt_tokens=prompt,
        max_tokens=output,
        request_class="interactive",
    )


def _pool(shared: SharedLoad, worker: int, names: list[str]) -> Pool:
    specs = [BackendSpec(name=n, url=f"http://127.0.0.1:{9000 + i}", engine="vllm")
             for i, n in enumerate(names)]  # fmt: skip
    return Pool(specs, {}, HealthSettings(), shared=shared.row(worker))


def test_each_worker_sees_the_sum_in_any_backend_order() -> None:
    shared = SharedLoad(2)
    a = _pool(shared, 0, ["vllm", "deepinfer"])
    b = _pool(shared, 1, ["deepinfer", "vllm"])  # another order: found by name
    leases = [a.by_name["vllm"].lease(_request(100, 10)) for _ in range(2)]
    leases.append(b.by_name["vllm"].lease(_request(50, 5)))
    for pool in (a, b):
        vllm = pool.by_name["vllm"]
        assert vllm.figures() == (3, 250, 25)
        c = vllm.candidate()
        assert (c.inflight, c.outstanding_prompt_tokens) == (3, 250)
        assert pool.by_name["deepinfer"].inflight == 0
    leases[0].prefilled()  # the prompt is no longer outstanding
    assert b.by_name["vllm"].figures() == (3, 150, 25)
    for lease in leases:
        lease.release()
        lease.release()  # idempotent, also in the shared figures
    assert a.by_name["vllm"].figures() == b.by_name["vllm"].figures() == (0, 0, 0)


def test_a_forked_worker_writes_what_the_parent_reads() -> None:
    shared = SharedLoad(2)
    parent = _pool(shared, 0, ["vllm"])
    pid = os.fork()
    if pid == 0:  # the child: open two requests and exit without releasing them
        code = 1
        try:
            child = _pool(shared, 1, ["vllm"])
            held = [child.by_name["vllm"].lease(_request(10, 1)) for _ in range(2)]
            code = 0 if len(held) == 2 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The child never released: its row says so, as a live worker's would.
    assert parent.by_name["vllm"].figures() == (2, 20, 2)


def test_a_full_row_leaves_a_backend_counted_alone() -> None:
    row = SharedLoad(1).row(0)
    slots = [row.slot(f"b{i}") for i in range(SLOTS)]
    assert all(s is not None for s in slots)
    assert row.slot("one-too-many") is None
    assert row.slot("b7") is not None  # a known name still finds its slot


def test_a_backend_removed_and_added_again_keeps_its_open_requests() -> None:
    shared = SharedLoad(2)
    pool = _pool(shared, 0, ["vllm"])
    old = pool.by_name["vllm"]
    held = old.lease(_request(10, 1))
    assert pool.remove("vllm") is old  # as a reload does; its request is still open
    pool.add(new := pool.state(old.spec))
    lease = new.lease(_request(20, 2))
    assert new.figures() == (2, 30, 3)
    held.release()
    lease.release()
    assert new.figures() == (0, 0, 0)


def test_worker_0s_grant_is_every_workers_and_turned_away_requests_add_up() -> None:
    shared = SharedLoad(2)
    specs = [BackendSpec(name="vllm", url="http://127.0.0.1:9000", engine="vllm", max_inflight=4)]
    first, second = (
        Pool(specs, {}, HealthSettings(), shared=shared.row(w), granted=True).by_name["vllm"]
        for w in (0, 1)
    )
    assert first.fleet.grant == second.fleet.grant == 0  # none heard yet: none held
    first.fleet.grant = 3
    assert second.fleet.grant == 3 and second.limit == 3
    second.lease(_request(1, 1))  # held until the worker dies below
    assert first.limit == 3 and first.inflight == 1  # room for two more, in either worker
    first.fleet.grant = None  # capping alone
    assert second.fleet.grant is None and second.limit == 4
    first.fleet.turned_away()
    second.fleet.turned_away()
    second.fleet.turned_away()
    assert first.fleet.turned_total() == second.fleet.turned_total() == 3
    shared.clear(1)  # worker 1 died: its requests went, the router's grant stays
    assert first.inflight == 0 and second.fleet.grant is None
