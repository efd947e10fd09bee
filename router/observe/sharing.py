"""Metrics shared between ``turnout serve --workers N`` processes: prometheus-client's
multiprocess files, set up by the parent before it forks and cleaned of a worker that died.
The metrics themselves are router.observe.metrics'."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import mark_process_dead


class _Pid:
    """This process's id, read again in a forked child only."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = os.getpid()
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.value = os.getpid()

    def get(self) -> int:
        return self.value


_PID = _Pid()


def share_between_workers(directory: Path) -> None:
    """Make every metric created from now on in this process (and the children it forks)
    record into prometheus-client's multiprocess files in ``directory`` (fresh and empty).

    prometheus-client picks where values live once, when it is imported, from
    ``PROMETHEUS_MULTIPROC_DIR``; the router imports it before it knows about workers, so
    this sets the variable and lets the library pick again, as its import would have.
    """
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    # As get_value_class() would, but with the pid read once per process: a multiprocess
    # value asks for it on every increment (a system call each; about 15 a request).
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue(_PID.get)  # type: ignore[no-untyped-call]


def forget_worker(directory: Path, pid: int) -> None:
    """Drop the live gauges of worker ``pid``, which died, from the shared metrics; its
    counters and histograms stay in the sums."""
    mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]
