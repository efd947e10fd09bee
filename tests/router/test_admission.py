"""Admission queues: interactive first, bounded queues, bounded waits, over the attempts of
a plan on real backend states (their in-flight counts kept by leases)."""

from __future__ import annotations

import asyncio

import pytest

from policies.types import RequestInfo
from router.backends.pool import BackendLease, Pool
from router.config.model import (
    AdmissionSettings,
    BackendSpec,
    ClassAdmission,
    ConfigError,
    HealthSettings,
)
from router.config.parse import parse_config
from router.control.admission import Admission, QueueRejected, WaitQueues
from router.control.plan import Attempt
from tests.router.harness import base_config

REQ = RequestInfo("r", "chat", "m", "batch")


class Slots:
    """One backend with ``max_inflight`` 1, held full by a lease until :meth:`free`."""

    def __init__(self, names: tuple[str, ...] = ("a",)) -> None:
        specs = [BackendSpec(n, "vllm", "http://127.0.0.1:9", max_inflight=1) for n in names]
        self.pool = Pool(specs, {}, HealthSettings())
        self.held: dict[str, BackendLease] = {b.name: b.lease(REQ) for b in self.pool.backends}

    def attempts(self, *names: str) -> list[Attempt]:
        return [Attempt(self.pool.by_name[n], "m") for n in names or ("a",)]

    def free(self, name: str = "a") -> None:
        self.held.pop(name).release()

    def take(self, name: str = "a") -> None:
        self.held[name] = self.pool.by_name[name].lease(REQ)


def settings(queue: int = 10, wait: float = 5.0) -> AdmissionSettings:
    c = ClassAdmission(queue_size=queue, max_wait=wait)
    return AdmissionSettings(classes={"interactive": c, "batch": c}, retry_after=2.5)


async def test_a_backend_with_room_is_taken_at_once() -> None:
    slots, adm = Slots(("a", "b")), Admission(settings())
    slots.free("b")
    options = slots.attempts("a", "b")
    got = await adm.take("batch", options)
    assert got.backend.name == "b"
    assert [o.backend.name for o in options] == ["a"]  # taken out: the rest is failover
    assert adm.waiting("batch") == 0


async def test_interactive_is_woken_before_earlier_batch() -> None:
    slots, adm = Slots(), Admission(settings())
    order: list[str] = []

    async def one(cls: str, tag: str) -> None:
        await adm.take(cls, slots.attempts())  # type: ignore[arg-type]
        slots.take()
        order.append(tag)

    tasks = [asyncio.create_task(one("batch", f"b{i}")) for i in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(one("interactive", f"i{i}")) for i in range(2)]
    await asyncio.sleep(0)
    assert (adm.waiting("batch"), adm.waiting("interactive")) == (3, 2)
    for _ in range(5):
        slots.free()
        adm.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["i0", "i1", "b0", "b1", "b2"]


async def test_woken_without_room_on_its_own_backends_keeps_its_turn() -> None:
    slots, adm = Slots(("a", "b")), Admission(settings())
    first = asyncio.create_task(adm.take("batch", slots.attempts("a")))
    await asyncio.sleep(0)
    second = asyncio.create_task(adm.take("batch", slots.attempts("a")))
    await asyncio.sleep(0)
    slots.free("b")  # room, but not on a backend of the first's plan
    adm.release()  # the first looks at its own attempts, finds none, goes back to the head
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert adm.waiting("batch") == 2
    slots.free("a")
    adm.release()
    assert (await asyncio.wait_for(first, 2)).backend.name == "a"
    assert not second.done()
    second.cancel()


async def test_a_wake_up_is_passed_on_when_the_woken_request_left() -> None:
    slots, adm = Slots(), Admission(settings())
    first = asyncio.create_task(adm.take("batch", slots.attempts()))
    await asyncio.sleep(0)
    second = asyncio.create_task(adm.take("batch", slots.attempts()))
    await asyncio.sleep(0)
    slots.free()
    adm.release()  # wakes the first ...
    first.cancel()  # ... whose client goes away before it runs
    assert (await asyncio.wait_for(second, 2)).backend.name == "a"
    assert first.cancelled()


async def test_full_queue_rejects_with_retry_after() -> None:
    slots, adm = Slots(), Admission(settings(queue=1))
    waiter = asyncio.create_task(adm.take("batch", slots.attempts()))
    await asyncio.sleep(0)
    with pytest.raises(QueueRejected) as info:
        await adm.take("batch", slots.attempts())
    assert info.value.status == 429
    assert info.value.headers == {"Retry-After": "3", "X-Turnout-Refused": "queue_full"}
    assert "queue is full" in info.value.message
    waiter.cancel()


async def test_no_queue_rejects_at_once() -> None:
    slots, adm = Slots(), Admission(AdmissionSettings())
    with pytest.raises(QueueRejected) as info:
        await adm.take("interactive", slots.attempts())
    assert info.value.headers == {"Retry-After": "1", "X-Turnout-Refused": "queue_full"}


async def test_wait_runs_out() -> None:
    slots, adm = Slots(), Admission(settings(wait=0.05))
    with pytest.raises(QueueRejected) as info:
        await asyncio.wait_for(adm.take("batch", slots.attempts()), 2)
    assert "for over 0.05 s" in info.value.message
    assert adm.waiting("batch") == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    slots, adm = Slots(), Admission(settings())
    task = asyncio.create_task(adm.take("interactive", slots.attempts()))
    await asyncio.sleep(0)
    assert adm.waiting("interactive") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.waiting("interactive") == 0


def test_the_queues_hold_no_clock_the_caller_gives_the_times() -> None:
    """What the simulator runs on its virtual clock: the same limits and refusals."""
    q: WaitQueues[str] = WaitQueues(settings(queue=1, wait=2.0))
    assert q.refusal("batch", since=10.0, now=10.0) is None
    q.put("batch", "w")
    full = q.refusal("batch", since=10.5, now=10.5)
    assert full is not None and "queue is full" in full.message
    assert q.refusal("batch", since=10.0, now=11.0, front=True) is None  # keeps its turn
    late = q.refusal("batch", since=10.0, now=12.0, front=True)
    assert late is not None and "for over 2 s" in late.message
    q.put("interactive", "i")
    assert (q.pop(), q.pop(), q.pop()) == ("i", "w", None)


def test_admission_config_values_and_errors() -> None:
    doc = base_config([("a", "vllm", "http://127.0.0.1:9")])
    doc["admission"] = {"batch": {"queue_size": 8, "max_wait": 2.5}, "retry_after": 3}
    got = parse_config(doc).admission
    assert got.for_class("batch") == ClassAdmission(8, 2.5)
    assert got.for_class("interactive") == ClassAdmission()  # absent: 429 at once
    assert got.retry_after == 3
    doc["admission"] = {"batch": {"queue_size": -1, "wait": 1}, "bulk": {}, "retry_after": -2}
    with pytest.raises(ConfigError) as info:
        parse_config(doc)
    assert {p for p, _ in info.value.errors} == {
        "admission.batch.queue_size",
        "admission.batch.wait",
        "admission.bulk",
        "admission.retry_after",
    }
