"""A command whose reader closed the pipe (``| head``) ends quietly, as Unix tools do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from turnout.common.pipes import SIGPIPE_STATUS

DRY_RUN = ["config/demo-capture.jsonl", "--dry-run"]


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "turnout", "--help"],
        ["-m", "turnout", "replay", *DRY_RUN],
        ["-c", "from replay.cli import main; raise SystemExit(main())", *DRY_RUN],
    ],
)
def test_a_closed_reader_ends_the_command_without_a_traceback(argv: list[str]) -> None:
    with subprocess.Popen(
        [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first line is written
        err = proc.stderr.read()
        status = proc.wait(timeout=60)
    assert status == SIGPIPE_STATUS
    assert err == b""
