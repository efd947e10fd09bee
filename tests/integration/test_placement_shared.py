"""One placement record: a prompt's second turn lands where its first went, whichever
worker of whichever router served the first (two routers of two workers, a real
redis-server, two emulated vLLM replicas with prefix caches)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.test_cache_aware import ask
from tests.procs import start_emulator
from tests.redis_server import start_redis
from tests.router.harness import base_config, get, start_router, write_config

PROMPTS = [" ".join(f"tenant {t} rule {i}." for i in range(300)) for t in range(8)]


def test_a_prompt_follows_its_cache_across_workers_and_routers(tmp_path: Path) -> None:
    with (
        start_redis() as redis,
        start_emulator("vllm", time_scale=50, args=["--set", "ranks=1"]) as one,
        start_emulator("vllm", time_scale=50, args=["--set", "ranks=1"]) as two,
    ):
        doc = base_config([("one", "vllm", one.url), ("two", "vllm", two.url)])
        doc["policies"]["warm"] = {"type": "cache-aware"}
        doc["default_policy"] = "warm"
        doc["limits"] = {"store": {"redis": {"url": redis.url}}}
        with (
            start_router(write_config(tmp_path, doc, "a.yaml"), ["--workers", "2"]) as a,
            start_router(write_config(tmp_path, doc, "b.yaml"), ["--workers", "2"]) as b,
        ):
            first = {p: ask(a.url, p, "What is rule 7?")[0] for p in PROMPTS}
            assert len(set(first.values())) == 2  # cold prompts were spread over both
            time.sleep(0.5)  # the placements travel off the request path
            for prompt, backend in first.items():
                for router in (a, b):  # fresh connections: any worker of each
                    served, cached = ask(router.url, prompt, "And rule 9?")
                    assert served == backend and cached > 1000
            assert "turnout_placement_shared 1.0" in get(b.url + "/metrics").text
