"""Fair shares of a class's slots through a real router of two workers in front of a real
emulator: a heavy tenant's flood leaves a backend's reserved slot to a light tenant sharing
the class, and takes every slot when it is alone (admission's ``reserve``); a slot freed in
one worker goes to the router's first waiter, whichever worker holds it. Every request goes
over a fresh connection, so the kernel spreads them over both workers."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest

from router.control.fair import SWEEP
from router.control.fair_shared import TENANTS
from tests.procs import Emulator, metric, start_emulator, wait_for
from tests.router.harness import Reply, base_config, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
HEAVY, LIGHT, VIP = "sk-fair-heavy", "sk-fair-light", "sk-fair-vip"
LONG = 3000  # tokens: a heavy answer streams for seconds, a light one is over at once


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with start_emulator("vllm", time_scale=4) as emu:
        yield emu


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(emulator: Emulator) -> dict[str, Any]:
    doc = base_config([("vllm", "vllm", emulator.url)])
    doc["backends"][0]["max_inflight"] = 3
    doc["require_api_key"] = True
    doc["access_log"] = {"enabled": False}
    doc["health"]["scrape_metrics"] = False
    # A long window: the light tenant still shares the class however slow the machine is.
    doc["admission"] = {"batch": {"queue_size": 16, "max_wait": 120, "reserve": 1,
                                  "active_window": 600}}  # fmt: skip
    doc["api_keys"] = [
        {"name": name, "sha256": digest(key), "class": "batch"}
        for name, key in (("heavy", HEAVY), ("light", LIGHT))
    ]
    return doc


def chat(url: str, key: str, tokens: int = 2) -> Reply:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True}  # fmt: skip
    return post(url + "/v1/chat/completions", body, {"Authorization": f"Bearer {key}"})


def running(emulator: Emulator) -> float:
    return metric(emulator.url, "vllm:num_requests_running")


def flood(pool: ThreadPoolExecutor, url: str, count: int) -> list[Future[Reply]]:
    return [pool.submit(chat, url, HEAVY, LONG) for _ in range(count)]


def test_a_flood_takes_every_slot_alone_and_leaves_one_beside_a_light_tenant(
    emulator: Emulator, tmp_path: Path
) -> None:
    with (
        start_router(write_config(tmp_path, config(emulator)), ["--workers", "2"]) as router,
        ThreadPoolExecutor(12) as pool,
    ):
        # Alone (the light tenant not seen yet), the heavy tenant fills the backend.
        alone = flood(pool, router.url, 3)
        assert wait_for(lambda: running(emulator) == 3, 30)
        assert all(f.result().status == 200 for f in alone)
        assert wait_for(lambda: running(emulator) == 0, 30)

        assert chat(router.url, LIGHT).status == 200  # the light tenant now shares the class
        beside = flood(pool, router.url, 4)
        assert wait_for(lambda: running(emulator) == 2, 30)  # the third slot is kept
        assert not any(f.done() for f in beside), [f.result().text for f in beside if f.done()]
        light = [chat(router.url, LIGHT) for _ in range(4)]
        # Served while every heavy request was still streaming or waiting: no light request
        # waited for one of the flood's to end.
        assert [r.status for r in light] == [200] * 4
        assert not any(f.done() for f in beside)
        assert running(emulator) == 2
        assert [f.result().status for f in beside] == [200] * 4  # the flood is served too


def worker(reply: Reply) -> str:
    """The worker process that answered (request ids start with its own prefix)."""
    return reply.headers["x-request-id"].rsplit("-", 1)[0]


def queued(url: str) -> float:
    return metric(url, r'turnout_admission_queue_length\{class="batch"\}')


def answered(order: list[str], url: str, name: str, key: str, tokens: int = 2) -> Reply:
    """``chat``, ``name`` appended to ``order`` once answered (one at a time: the backend's
    one slot serves them in turn)."""
    reply = chat(url, key, tokens)
    order.append(name)
    return reply


def test_a_freed_slot_goes_to_the_routers_first_waiter_in_whichever_worker(
    emulator: Emulator, tmp_path: Path
) -> None:
    doc = config(emulator)
    doc["backends"][0]["max_inflight"] = 1
    doc["admission"]["batch"]["reserve"] = 0
    doc["api_keys"].append({"name": "vip", "sha256": digest(VIP), "class": "batch",
                            "priority": 1})  # fmt: skip
    across = 0
    with (
        start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router,
        ThreadPoolExecutor(10) as pool,
    ):
        for _ in range(8):  # until the slot freed in one worker and the vip waited in the other
            order: list[str] = []
            served = partial(answered, order, router.url)
            long = pool.submit(served, "long", HEAVY, 300)
            assert wait_for(lambda: running(emulator) == 1, 30)
            heavy = [pool.submit(served, "heavy", HEAVY) for _ in range(6)]
            assert wait_for(lambda: queued(router.url) == 6, 30)
            vip = pool.submit(served, "vip", VIP)
            assert wait_for(lambda: queued(router.url) == 7, 30)
            assert all(f.result().status == 200 for f in [long, vip, *heavy])
            # The vip's band goes first of every waiter, in whichever worker the slot freed.
            assert order[:2] == ["long", "vip"], order
            across += worker(long.result()) != worker(vip.result())
            if across:
                break
    assert across  # the freed slot and the first waiter were in different workers


def test_the_reserve_holds_after_more_tenants_came_and_went_than_the_table_holds(
    emulator: Emulator, tmp_path: Path
) -> None:
    """Past ``TENANTS`` keys, each seen once and idle since for longer than the window, the
    workers still share what the heavy and the light tenant hold: rows were freed for them.
    The light tenant keeps to one connection, so one worker; a table that kept every key
    would count it in that worker alone, and the other would let the flood take the kept
    slot."""
    doc = config(emulator)
    doc["admission"]["batch"]["active_window"] = 2.0
    others = [f"sk-fair-many-{i}" for i in range(TENANTS + 40)]
    doc["api_keys"] += [{"name": f"m{i}", "sha256": digest(key), "class": "batch"}
                        for i, key in enumerate(others)]  # fmt: skip
    with (
        start_router(write_config(tmp_path, doc), ["--workers", "2"]) as router,
        ThreadPoolExecutor(12) as pool,
        openai.OpenAI(base_url=router.url + "/v1", api_key=LIGHT, max_retries=0) as light,
    ):

        def ask() -> str:
            """One light request over the light tenant's one connection: its worker."""
            reply = light.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            return reply.headers["x-request-id"].rsplit("-", 1)[0]

        replies = [pool.submit(chat, router.url, key) for key in others]
        assert {f.result().status for f in replies} == {200}
        time.sleep(2.0 + 2 * SWEEP)  # every one of them idle past the window
        home = ask()  # the light tenant is seen, in one worker
        beside = flood(pool, router.url, 4)  # over fresh connections: both workers
        assert wait_for(lambda: running(emulator) == 2, 30)  # the third slot is kept
        assert [ask() for _ in range(4)] == [home] * 4  # served at once, while...
        assert running(emulator) == 2 and not any(f.done() for f in beside)  # ...all wait
        assert [f.result().status for f in beside] == [200] * 4
