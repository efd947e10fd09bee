"""A newcomer's first `turnout serve`: the embedded default serves the Batch API from
Turnout's data directory, says where that is, and keeps a second router off its store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.batchkit import chat_line, lines_of, submit, wait
from tests.router.harness import client_for, start_router


def test_the_embedded_default_serves_the_batch_api_from_the_data_directory(
    tmp_path: Path,
) -> None:
    data_home = tmp_path / "xdg"  # not made: the router makes it at its first start
    env = {**os.environ, "XDG_DATA_HOME": str(data_home)}
    log = tmp_path / "router.log"
    store = data_home / "turnout" / "batch.db"
    with start_router(None, stderr=log, env=env, timeout=60) as router:
        assert f"its store is {store}" in log.read_text()
        assert store.is_file()
        client = client_for(router.url)
        batch = submit(client, [chat_line("first", max_tokens=2), chat_line("second", 2)])
        done = wait(client, batch.id, timeout=120)
        assert done.status == "completed", done
        assert [r["custom_id"] for r in lines_of(client, done.output_file_id)] == [
            "first",
            "second",
        ]

        # A second router on the same data directory is refused before it starts anything.
        second = subprocess.run(
            [sys.executable, "-m", "turnout", "serve", "--port", "0"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert second.returncode == 1, second.stderr
        assert (
            f"the batch store {store} is in use by another router (pid {router.proc.pid})"
            in second.stderr
        )
        assert client.batches.retrieve(batch.id).status == "completed"  # the first one serves on
