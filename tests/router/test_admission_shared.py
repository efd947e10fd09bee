"""A backend's last slot, taken by the workers of one router at once (router.control.admission
over router.backends.shared): the check for room and the take are one step across them."""

from __future__ import annotations

import asyncio
import os
import time

from policies.types import RequestInfo
from router.backends.pool import Pool
from router.backends.shared import SharedLoad
from router.config.model import AdmissionSettings, BackendSpec, HealthSettings
from router.control.admission import Admission, QueueRejected
from router.control.fair_shared import SharedFairness
from router.control.plan import Attempt

ROUNDS = 5000
SECONDS = 20.0


def _request() -> RequestInfo:
    return RequestInfo(
        request_id="r",
        endpoint="chat",
        model="m",
        stream=True,
        prompt_tokens=1,
        max_tokens=1,
        request_class="interactive",
    )


async def _hammer(pool: Pool, admission: Admission, until: float) -> int:
    """Take the backend's one slot as often as it can; the times it found it taken twice."""
    backend = pool.by_name["b"]
    info = _request()
    over = 0
    for _ in range(ROUNDS):
        if time.monotonic() > until:
            break
        try:
            target = await admission.take("interactive", [Attempt(backend, "m")])
        except QueueRejected:  # full: no queue is configured, so it is refused at once
            await asyncio.sleep(0)
            continue
        lease = target.backend.lease(info)  # as the proxy does, in the same step
        for _ in range(20):  # while held, nobody else may hold it
            over += backend.inflight > 1
        lease.release()
        admission.release()
        await asyncio.sleep(0)
    return over


def _worker(load: SharedLoad, fairness: SharedFairness, worker: int, until: float) -> int:
    spec = BackendSpec(name="b", url="http://127.0.0.1:9", engine="vllm", max_inflight=1)
    pool = Pool([spec], {}, HealthSettings(), shared=load.row(worker))
    admission = Admission(AdmissionSettings(), fairness.ledger(worker))
    return asyncio.run(_hammer(pool, admission, until))


def test_two_workers_never_both_hold_a_backends_last_slot() -> None:
    load, fairness = SharedLoad(2), SharedFairness(2)
    until = time.monotonic() + SECONDS
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 1 if _worker(load, fairness, 1, until) else 0
        finally:
            os._exit(code)
    here = _worker(load, fairness, 0, until)
    _, status = os.waitpid(pid, 0)
    assert (here, os.waitstatus_to_exitcode(status)) == (0, 0)


def test_a_slot_taken_without_an_attempt_is_given_back_at_the_next_turn() -> None:
    load, fairness = SharedLoad(1), SharedFairness(1)
    spec = BackendSpec(name="b", url="http://127.0.0.1:9", engine="vllm", max_inflight=1)
    pool = Pool([spec], {}, HealthSettings(), shared=load.row(0))
    admission = Admission(AdmissionSettings(), fairness.ledger(0))
    backend = pool.by_name["b"]

    async def taken_then_gone() -> tuple[int, int]:
        await admission.take("interactive", [Attempt(backend, "m")])
        held = backend.inflight  # counted at once, before any lease
        await asyncio.sleep(0)  # the request went away before its attempt
        return held, backend.inflight

    assert asyncio.run(taken_then_gone()) == (1, 0)
    lease = backend.lease(_request())  # a lease with no claim before it counts itself
    assert backend.inflight == 1
    lease.release()
    assert backend.inflight == 0
