"""A throwaway PostgreSQL server for tests: initdb and pg_ctl into a temp dir, loopback only.

Debian's ``postgresql`` package puts the binaries in ``/usr/lib/postgresql/*/bin`` (``.ci/run``
installs it); PATH is searched first. PostgreSQL refuses to run as root, so as root the server
runs as ``nobody``. Without the binaries the tests that need a server are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def pg_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found is not None:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Postgres:
    """A running server: its URL, and a restart that drops every connection to it."""

    url: str
    restart: Callable[[], None]


@contextlib.contextmanager
def start_postgres() -> Iterator[Postgres]:
    """A running server for the block."""
    initdb, pg_ctl = pg_binary("initdb"), pg_binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql)"
        )
    root = Path(tempfile.mkdtemp(prefix="turnout-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        root.chmod(0o755)  # nobody must reach its data directory inside
        as_user = ["runuser", "-u", "nobody", "--"]
    data = root / "data"
    data.mkdir()
    if as_user:
        shutil.chown(data, "nobody")
    port = _free_port()

    def run(*argv: str) -> None:
        subprocess.run([*as_user, *argv], check=True, capture_output=True, timeout=60)

    try:
        run(initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        options = f"-h 127.0.0.1 -p {port} -k {data} -F"
        run(pg_ctl, "-D", str(data), "-o", options, "-l", str(data / "log"), "-w", "start")

        def restart() -> None:
            # -l again: else the new server writes to pg_ctl's pipes and keeps them open.
            log = str(data / "log")
            run(pg_ctl, "-D", str(data), "-l", log, "-m", "immediate", "-w", "restart")

        try:
            yield Postgres(f"postgresql://postgres@127.0.0.1:{port}/postgres", restart)
        finally:
            run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
