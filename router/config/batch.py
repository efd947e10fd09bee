"""The ``batch`` section: the Batch API's store and limits, and where its data lives.

Without ``store`` and ``data_dir`` the SQLite store goes in Turnout's data directory after
the XDG base directory convention: ``$XDG_DATA_HOME/turnout``, else
``~/.local/share/turnout``; the router creates it when it starts (router.batch.service).
A PostgreSQL store needs the ``postgres`` extra; without it the config is refused here, at
``check-config`` and at ``serve`` alike, rather than failing on its first connection.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from turnout.common.schema import Reader

_POSTGRES = ("postgresql://", "postgres://")


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The Batch API (``/v1/files``, ``/v1/batches``), executed by the router (router.batch)."""

    store: str = ""
    """``sqlite:///path`` or ``postgresql://...``; empty: ``batch.db`` in :attr:`data_dir`."""
    data_dir: str = ""
    """Where the default store lives; the parser gives Turnout's data directory when the
    config names neither (router.config.batch)."""
    max_concurrency: int = 64
    """Lines in flight per router process at most: the budget when no policy declares SLOs,
    else the ceiling of the window the interactive TTFT paces (router.batch.pacing)."""
    min_concurrency: int = 1
    initial_concurrency: int = 4
    headroom: float = 0.8
    """The window shrinks when interactive P95 TTFT passes this share of its SLO."""
    lease_seconds: float = 30.0
    """A line's lease: renewed while it runs; a dead router's lines are taken after it."""
    max_attempts: int = 3
    """Tries of a line whose engine failed (5xx); 429 and saturation are retried until the
    completion window ends."""
    max_file_bytes: int = 200 * 1024 * 1024
    max_lines: int = 50000
    anonymous: bool = False
    """Callers without an API key (keys optional) may use it, all as one owner; off, they
    get 401 (a key the router does not know always does)."""


def data_home(env: Mapping[str, str] = os.environ) -> Path | None:
    """Turnout's data directory (see the module docstring); None when there is no home
    directory to put it in. A relative ``XDG_DATA_HOME`` is ignored, as the convention says."""
    xdg = env.get("XDG_DATA_HOME", "")
    if os.path.isabs(xdg):
        return Path(xdg) / "turnout"
    try:
        home = Path.home()
    except RuntimeError:  # no HOME and no passwd entry
        return None
    return home / ".local" / "share" / "turnout" if home.is_absolute() else None


def read_batch(m: Reader) -> BatchSettings:
    d = BatchSettings()
    store = m.string("store", d.store)
    if store and not store.startswith(("sqlite:///", *_POSTGRES)):
        m.error("store", "expected sqlite:///PATH or postgresql://...")
    elif store.startswith(_POSTGRES) and not _have_psycopg():
        m.error("store", "a PostgreSQL store needs psycopg, which is not installed here: "
                "pip install 'turnout[postgres]'")  # fmt: skip
    high = m.integer("max_concurrency", d.max_concurrency, low=1)
    low = m.integer("min_concurrency", d.min_concurrency, low=1, high=high)
    out = BatchSettings(
        store=store,
        data_dir=m.string("data_dir", "") or _default_dir(m, store),
        max_concurrency=high,
        min_concurrency=low,
        initial_concurrency=m.integer(
            "initial_concurrency", d.initial_concurrency, low=low, high=high
        ),
        headroom=m.number("headroom", d.headroom, low=0.05, high=1.0),
        lease_seconds=m.number("lease_seconds", d.lease_seconds, low=0.5),
        max_attempts=m.integer("max_attempts", d.max_attempts, low=1),
        max_file_bytes=m.integer("max_file_bytes", d.max_file_bytes, low=1),
        max_lines=m.integer("max_lines", d.max_lines, low=1),
        anonymous=m.flag("anonymous", d.anonymous),
    )
    m.done()
    return out


def _default_dir(m: Reader, store: str) -> str:
    """The data directory when none is given: Turnout's, for the default SQLite store."""
    if store:
        return ""  # the store names its own place
    home = data_home()
    if home is None:
        m.error("data_dir", "no home directory to keep batch.db in: give batch.data_dir, "
                "or set XDG_DATA_HOME")  # fmt: skip
        return ""
    return str(home)


def _have_psycopg() -> bool:
    # Imported, not only looked up: a driver that is there but cannot load (its libpq) is
    # as missing as one that is not.
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return True
