"""File descriptors: the budget a worker's client connections must fit in.

Past the soft ``RLIMIT_NOFILE``, ``accept()`` fails with EMFILE, and libuv (under uvloop) then
empties the listen queue by accepting and closing whatever waits in it: clients get resets
instead of the 503 a full site answers, and nothing is logged. At the common soft limit of
1,024 that happens long before a ``limits.max_connections`` of 10,000. So the router raises
its soft limit to the hard one at start (:func:`raise_soft_limit`), and each worker sizes its
site within what is left (:func:`connection_budget`):

- each client connection may hold one descriptor more while it is served: its request's
  upstream socket, or the Batch API file it uploads or downloads. Two a connection.
- what a worker opens after start is kept aside: health probes and metric scrapes (a few per
  backend), shadow mirrors (their ``max_concurrency``), batch lines (each its upstream
  socket, ``batch.max_concurrency`` of them: a line runs in-process) and the batch store,
  plus a fixed slack (DNS lookups, reloads, the capture sink's restarts).
- connections past the cap are accepted, answered 503 and closed, but libuv accepts every
  connection waiting in the listen queue before the first of them is answered, so the listen
  backlog is what a burst costs at once: it is kept to a quarter of what is left.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from router.config.model import RouterConfig

BACKLOG = 2048
"""The listen backlog when descriptors are plenty (aiohttp's default of 128 drops SYNs when
hundreds of clients connect at once: +1 s each)."""
SLACK = 64
PER_BACKEND = 4
"""Probe, scrape and ``/v1/models`` keep-alive sockets of one backend, and one to spare."""
PER_BATCH_LINE = 1
BATCH_STORE = 16
"""The store's database files (SQLite's database, journal and shared memory, or a
PostgreSQL socket) and the files of the batches being created, read or finalized."""
_NR_OPEN = Path("/proc/sys/fs/nr_open")
_LINUX_NR_OPEN = 1 << 20
"""Linux's default ceiling of a soft limit when the hard one is unlimited."""


def raise_soft_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one where the system allows it; the soft
    limit ``(before, after)`` (equal when it stayed: already there, or not allowed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return soft, soft
    target = hard if hard != resource.RLIM_INFINITY else _system_ceiling()
    if target <= soft:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft, soft
    return soft, target


def _system_ceiling() -> int:
    try:
        return int(_NR_OPEN.read_text())
    except (OSError, ValueError):
        return _LINUX_NR_OPEN


def open_descriptors() -> int:
    """How many descriptors this process has open (0 where the system does not say)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(listing)) - 1  # the listing's own
        except OSError:
            continue
    return 0


def reserved(config: RouterConfig) -> int:
    """Descriptors a worker of ``config`` may open after start besides its connections'."""
    n = SLACK + PER_BACKEND * len(config.backends)
    n += sum(s.max_concurrency for s in config.shadow.values())
    if config.batch is not None:
        n += PER_BATCH_LINE * config.batch.max_concurrency + BATCH_STORE
    return n


@dataclass(frozen=True, slots=True)
class Budget:
    """A worker's connection cap and listen backlog, and what they were worked out from."""

    max_connections: int
    backlog: int
    soft_limit: int
    """The soft ``RLIMIT_NOFILE`` (-1: unlimited)."""
    open_at_start: int
    reserved: int

    def lowered(self, configured: int) -> bool:
        return self.max_connections < configured


def connection_budget(config: RouterConfig, open_now: int, soft: int | None = None) -> Budget:
    """The cap on client connections (at most ``limits.max_connections``) and the listen
    backlog that fit in the soft limit (``soft``, default this process's) with ``open_now``
    descriptors open and :func:`reserved` kept aside; the cap is at least 1."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    keep = reserved(config)
    configured = config.limits.max_connections
    if soft == resource.RLIM_INFINITY:
        return Budget(configured, BACKLOG, soft, open_now, keep)
    room = max(0, soft - open_now - keep)
    backlog = max(1, min(BACKLOG, room // 4))
    cap = max(1, min(configured, (room - backlog) // 2))
    return Budget(cap, backlog, soft, open_now, keep)
