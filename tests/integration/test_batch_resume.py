"""A router stopped mid-batch (killed with SIGKILL, or drained after SIGTERM) and restarted on
the same data directory finishes the batch with every line answered exactly once, and re-runs
none of those already answered."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.batchkit import answered_once, batch_client, chat_line, keyed, submit
from tests.procs import start_emulator
from tests.router.harness import base_config, start_router, write_config

LINES = 200
WINDOW = 8


@pytest.fixture
def engines() -> Iterator[list[tuple[str, str, str]]]:
    """The two emulated engines, time-scaled, as base_config's backend rows."""
    with (
        start_emulator("vllm", time_scale=50) as vllm,
        start_emulator("deepinfer", time_scale=50) as deepinfer,
    ):
        yield [("vllm", "vllm", vllm.url), ("deepinfer", "deepinfer", deepinfer.url)]


def _client(url: str) -> openai.OpenAI:
    return batch_client(url)


def _stopped_mid_batch(
    config: Path, rows: list[dict[str, Any]], after: int, sig: signal.Signals, wait: float
) -> tuple[str, int]:
    """Submit ``rows``, send ``sig`` to the router once ``after`` lines are answered, wait
    ``wait`` seconds for it to exit; the batch's id and the lines answered by then."""
    with start_router(config) as first:
        client = _client(first.url)
        batch = submit(client, rows)
        deadline = time.monotonic() + 60
        completed = 0
        while time.monotonic() < deadline:
            counts = client.batches.retrieve(batch.id).request_counts
            assert counts is not None
            completed = counts.completed
            if completed >= after:
                break
            time.sleep(0.05)
        first.proc.send_signal(sig)
        first.proc.wait(wait)
    return batch.id, completed


def test_sigkill_mid_batch_then_restart(
    tmp_path: Path, engines: list[tuple[str, str, str]]
) -> None:
    doc = base_config(engines)
    doc["batch"] = {
        "data_dir": str(tmp_path / "data"),
        "max_concurrency": WINDOW,
        "lease_seconds": 1.0,
    }
    config = write_config(tmp_path, keyed(doc))
    rows = [chat_line(f"r{i}", max_tokens=150, ignore_eos=True) for i in range(LINES)]
    batch_id, completed = _stopped_mid_batch(config, rows, LINES // 5, signal.SIGKILL, 10)
    assert completed < LINES, "the batch ended before the kill: make its lines longer"
    with start_router(config) as second:
        answered_once(_client(second.url), batch_id, rows, [e[2] for e in engines], WINDOW)


def test_a_draining_router_takes_no_new_lines(
    tmp_path: Path, engines: list[tuple[str, str, str]]
) -> None:
    """SIGTERM: the lines running finish, no new one is taken, so the router exits long
    before its drain deadline; a restart finishes the batch, every line answered once."""
    doc = base_config(engines)
    doc["batch"] = {"data_dir": str(tmp_path / "data"), "max_concurrency": WINDOW}
    # Long enough that the whole batch (about 6 s of lines) would fit in it: a router that
    # kept taking lines while draining would answer every line before it exits.
    doc["shutdown"] = {"drain_seconds": 30}
    config = write_config(tmp_path, keyed(doc))
    rows = [chat_line(f"d{i}", max_tokens=1000, ignore_eos=True) for i in range(LINES)]
    batch_id, _ = _stopped_mid_batch(config, rows, WINDOW, signal.SIGTERM, 30)
    with start_router(config) as second:
        client = _client(second.url)
        counts = client.batches.retrieve(batch_id).request_counts
        assert counts is not None
        assert counts.completed + counts.failed < LINES // 2, counts
        # A line whose answer came back while the executor was being closed is given back
        # unrecorded and runs again: at most the window's worth.
        answered_once(client, batch_id, rows, [e[2] for e in engines], WINDOW)
