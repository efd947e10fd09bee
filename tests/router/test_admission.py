"""Admission queues: interactive first, bounded queues, bounded waits."""

from __future__ import annotations

import asyncio

import pytest

from router.config.model import AdmissionSettings, ClassAdmission, ConfigError
from router.config.parse import parse_config
from router.control.admission import Admission, QueueRejected, Saturated
from tests.router.harness import base_config


class Slots:
    """A stand-in for the pool's in-flight limits: ``free`` slots, taken by ``plan``."""

    def __init__(self) -> None:
        self.free = 0

    def plan(self, tag: str) -> str:
        if self.free <= 0:
            raise Saturated()
        self.free -= 1
        return tag


def settings(queue: int = 10, wait: float = 5.0) -> AdmissionSettings:
    c = ClassAdmission(queue_size=queue, max_wait=wait)
    return AdmissionSettings(classes={"interactive": c, "batch": c}, retry_after=2.5)


async def test_free_slot_admits_at_once() -> None:
    slots, adm = Slots(), Admission(settings())
    slots.free = 1
    assert await adm.admit("batch", lambda: slots.plan("b")) == "b"
    assert adm.waiting("batch") == 0


async def test_interactive_is_woken_before_earlier_batch() -> None:
    slots, adm = Slots(), Admission(settings())
    order: list[str] = []

    async def one(cls: str, tag: str) -> None:
        order.append(await adm.admit(cls, lambda: slots.plan(tag)))  # type: ignore[arg-type]

    tasks = [asyncio.create_task(one("batch", f"b{i}")) for i in range(3)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(one("interactive", f"i{i}")) for i in range(2)]
    await asyncio.sleep(0)
    assert (adm.waiting("batch"), adm.waiting("interactive")) == (3, 2)
    for _ in range(5):
        slots.free += 1
        adm.release()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 2)
    assert order == ["i0", "i1", "b0", "b1", "b2"]


async def test_woken_without_a_slot_keeps_its_turn() -> None:
    slots, adm = Slots(), Admission(settings())
    first = asyncio.create_task(adm.admit("batch", lambda: slots.plan("first")))
    await asyncio.sleep(0)
    second = asyncio.create_task(adm.admit("batch", lambda: slots.plan("second")))
    await asyncio.sleep(0)
    adm.release()  # nothing freed: the first waiter re-plans, fails, goes back to the head
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    slots.free = 1
    adm.release()
    assert await asyncio.wait_for(first, 2) == "first"
    assert not second.done()
    second.cancel()


async def test_a_wake_up_is_passed_on_when_the_woken_request_left() -> None:
    slots, adm = Slots(), Admission(settings())
    first = asyncio.create_task(adm.admit("batch", lambda: slots.plan("first")))
    await asyncio.sleep(0)
    second = asyncio.create_task(adm.admit("batch", lambda: slots.plan("second")))
    await asyncio.sleep(0)
    slots.free = 1
    adm.release()  # wakes the first ...
    first.cancel()  # ... whose client goes away before it runs
    assert await asyncio.wait_for(second, 2) == "second"
    assert first.cancelled()


async def test_full_queue_rejects_with_retry_after() -> None:
    slots, adm = Slots(), Admission(settings(queue=1))
    waiter = asyncio.create_task(adm.admit("batch", lambda: slots.plan("w")))
    await asyncio.sleep(0)
    with pytest.raises(QueueRejected) as info:
        await adm.admit("batch", lambda: slots.plan("x"))
    assert info.value.status == 429
    assert info.value.headers == {"Retry-After": "3"}
    assert "queue is full" in info.value.message
    waiter.cancel()


async def test_no_queue_rejects_at_once() -> None:
    slots, adm = Slots(), Admission(AdmissionSettings())
    with pytest.raises(QueueRejected) as info:
        await adm.admit("interactive", lambda: slots.plan("x"))
    assert info.value.headers == {"Retry-After": "1"}


async def test_wait_runs_out() -> None:
    slots, adm = Slots(), Admission(settings(wait=0.05))
    with pytest.raises(QueueRejected) as info:
        await asyncio.wait_for(adm.admit("batch", lambda: slots.plan("x")), 2)
    assert "for over 0.05 s" in info.value.message
    assert adm.waiting("batch") == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    slots, adm = Slots(), Admission(settings())
    task = asyncio.create_task(adm.admit("interactive", lambda: slots.plan("x")))
    await asyncio.sleep(0)
    assert adm.waiting("interactive") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert adm.waiting("interactive") == 0


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
