"""Two router replicas sharing a real PostgreSQL server race over one batch: both take lines,
one is killed with SIGKILL mid-batch, the other takes its lines over once their leases run
out, and every line is answered exactly once."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.batchkit import answered_once, batch_client, chat_line, keyed, submit
from tests.pg import Postgres, start_postgres
from tests.procs import start_emulator
from tests.router.harness import base_config, get, start_router, write_config

LINES = 240
WINDOW = 6


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    with start_postgres() as server:
        yield server


def lines_run(router_url: str) -> int:
    text = get(router_url + "/metrics").text
    found = re.findall(r'^turnout_batch_lines_total\{[^}]*outcome="completed"\} (\S+)$', text, re.M)
    return sum(int(float(x)) for x in found)


def test_two_replicas_one_killed(postgres: Postgres, tmp_path: Path) -> None:
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        doc = base_config([("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)])
        doc["batch"] = {"store": postgres.url, "max_concurrency": WINDOW, "lease_seconds": 1.0}
        config = write_config(tmp_path, keyed(doc))
        rows = [chat_line(f"p{i}", max_tokens=150, ignore_eos=True) for i in range(LINES)]
        with start_router(config) as a, start_router(config) as b:
            client = batch_client(b.url)
            batch = submit(client, rows)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (lines_run(a.url) and lines_run(b.url) > 10):
                time.sleep(0.05)
            by_b = lines_run(b.url)
            assert by_b > 10 and lines_run(a.url) > 0, "both replicas take lines"
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait(10)
            # The survivor finishes and serves the batch created through the dead replica.
            client = batch_client(a.url)
            answered_once(client, batch.id, rows, [vllm.url, deepinfer.url], WINDOW)
