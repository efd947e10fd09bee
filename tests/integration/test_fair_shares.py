"""Fair shares of a class's slots through a real router of two workers in front of a real
emulator: a heavy tenant's flood leaves a backend's reserved slot to a light tenant sharing
the class, and takes every slot when it is alone (admission's ``reserve``). Every request
goes over a fresh connection, so the kernel spreads them over both workers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.procs import Emulator, metric, start_emulator, wait_for
from tests.router.harness import Reply, base_config, post, start_router, write_config

MODEL = "deepseek-v4.1-flash"
HEAVY, LIGHT = "sk-fair-heavy", "sk-fair-light"
LONG = 1500  # tokens: a heavy answer streams for seconds, a light one is over at once


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    with start_emulator("vllm", time_scale=4) as emu:
        yield emu


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
        {"name": name, "sha256": hashlib.sha256(key.encode()).hexdigest(), "class": "batch"}
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
        alone = flood(pool, router.url, 4)
        assert wait_for(lambda: running(emulator) == 3, 30)
        assert all(f.result().status == 200 for f in alone)
        assert wait_for(lambda: running(emulator) == 0, 30)

        assert chat(router.url, LIGHT).status == 200  # the light tenant now shares the class
        beside = flood(pool, router.url, 6)
        assert wait_for(lambda: running(emulator) == 2, 30)  # the third slot is kept
        assert not any(f.done() for f in beside)
        light = [chat(router.url, LIGHT) for _ in range(4)]
        # Served while every heavy request was still streaming or waiting: no light request
        # waited for one of the flood's to end.
        assert [r.status for r in light] == [200] * 4
        assert not any(f.done() for f in beside)
        assert running(emulator) == 2
        assert [f.result().status for f in beside] == [200] * 6  # the flood is served too
