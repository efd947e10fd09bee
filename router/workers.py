"""``turnout serve --workers N``: the parent process that forks the workers and keeps them up.

The parent maps the backend load, the API keys' usage, the fair queues' counters and the
placement rings the workers share and points every worker's metrics at one fresh directory
before forking, so any worker's /metrics shows them all. Then it only waits for signals:
SIGHUP is passed on (each worker reloads), SIGINT and SIGTERM stop every worker (each
drains), and SIGCHLD means a worker died.

A dead worker is replaced, as gunicorn and uvicorn's supervisors do: otherwise a crash (an
OOM kill, a bug) leaves the pod serving on fewer processes until someone restarts it, with
nothing in its health to show it. Before the new one starts, the dead one's share of the
backend load and of its callers' open requests (they died with it) is zeroed and its live
gauges are dropped; its counters stay in the sums. A worker that keeps dying is a broken
deployment, not a transient fault: after :data:`MAX_RESTARTS` replacements within
:data:`RESTART_WINDOW` seconds the router stops and exits 1, for the orchestrator to restart
or report.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import uvloop

from router.app import listen_socket
from router.backends.fleet_load import unique_name
from router.backends.shared import SharedLoad
from router.config.model import RouterConfig
from router.control.fair_shared import SharedFairness
from router.control.placement import PlacementRings
from router.control.quota import SharedQuotas
from router.observe.sharing import forget_worker, share_between_workers

log = logging.getLogger("router")

MAX_RESTARTS = 5
RESTART_WINDOW = 60.0
_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD}


@dataclass(frozen=True, slots=True)
class Sharing:
    """What the workers of one router share: backend load, API keys' usage, the admission
    queues' counters and a metrics directory."""

    load: SharedLoad
    quotas: SharedQuotas
    fairness: SharedFairness
    placements: PlacementRings
    metrics_dir: Path
    router_id: str
    """What replicas call this router by (router.backends.fleet_load)."""


Worker = Callable[
    [RouterConfig, socket.socket, Callable[[str], None], Path, Sharing, int],
    Coroutine[Any, Any, None],
]
"""A worker's main: ``(config, socket, ready, config path, sharing, index)``."""


def supervise(
    config: RouterConfig,
    first: socket.socket,
    workers: int,
    path: Path,
    worker: Worker,
    announce: Callable[[str], None],
) -> int:
    """Fork ``workers`` processes serving on ``first``'s SO_REUSEPORT port until a signal
    stops them; ``announce(url)`` once all are up. Returns the exit code."""
    metrics_dir = Path(tempfile.mkdtemp(prefix="turnout-metrics-"))
    share_between_workers(metrics_dir)
    sharing = Sharing(
        SharedLoad(workers),
        SharedQuotas(workers),
        SharedFairness(workers),
        PlacementRings(workers),
        metrics_dir,
        unique_name(),
    )
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        return _Supervisor(config, first, path, worker, sharing).run(workers, announce)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


class _Supervisor:
    def __init__(
        self,
        config: RouterConfig,
        first: socket.socket,
        path: Path,
        worker: Worker,
        sharing: Sharing,
    ) -> None:
        self._config = config
        self._first: socket.socket | None = first
        self._port: int = first.getsockname()[1]
        self._path = path
        self._worker = worker
        self._sharing = sharing
        self._pids: dict[int, int] = {}  # pid -> worker index
        self._restarts: deque[float] = deque()

    def run(self, workers: int, announce: Callable[[str], None]) -> int:
        ready_r, ready_w = os.pipe()
        for i in range(workers):
            self._spawn(i, ready_w)
        if self._first is not None:
            self._first.close()
            self._first = None
        os.close(ready_w)
        up = _count_ready(ready_r, workers)
        code = 1
        if up == workers:
            announce(f"http://{self._config.listen.host}:{self._port}")
            code = self._wait()
        for pid in self._pids:
            os.kill(pid, signal.SIGTERM)
        for pid in self._pids:
            os.waitpid(pid, 0)
        return code

    def _wait(self) -> int:
        """Serve signals until one stops the router; 0, or 1 if workers kept dying."""
        while True:
            sig = signal.sigwait(_SIGNALS)
            if sig == signal.SIGHUP:
                for pid in self._pids:
                    os.kill(pid, signal.SIGHUP)
            elif sig == signal.SIGCHLD:
                if not self._replace_dead():
                    return 1
            else:
                return 0

    def _replace_dead(self) -> bool:
        """Reap the workers that exited and start their replacements; False when they die
        too often to go on."""
        # Worker by worker: waiting for any child would reap the emulators the parent may
        # also run, whose status their own handles wait for.
        for pid in list(self._pids):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                continue
            index = self._pids.pop(pid)
            now = time.monotonic()
            while self._restarts and self._restarts[0] < now - RESTART_WINDOW:
                self._restarts.popleft()
            log.error("worker %d (pid %d) died: %s", index, pid, _how(status))
            if len(self._restarts) >= MAX_RESTARTS:
                log.error(
                    "workers died %d times in %g s: stopping", MAX_RESTARTS + 1, RESTART_WINDOW
                )
                return False
            self._restarts.append(now)
            self._sharing.load.clear(index)
            self._sharing.quotas.clear(index)
            self._sharing.fairness.clear(index)
            forget_worker(self._sharing.metrics_dir, pid)
            self._spawn(index, None)
        return True

    def _spawn(self, index: int, ready_w: int | None) -> None:
        """Fork worker ``index``; at start-up it writes a byte to ``ready_w`` once serving."""
        first = self._first
        if index == 0 and first is not None:
            sock = first
        else:
            sock = listen_socket(self._config.listen.host, self._port, reuse_port=True)
        pid = os.fork()
        if pid == 0:
            self._child(sock, index, ready_w)
        self._pids[pid] = index
        if sock is not first:
            sock.close()
        if ready_w is None:
            log.info("worker %d restarted (pid %d)", index, pid)

    def _child(self, sock: socket.socket, index: int, ready_w: int | None) -> NoReturn:
        """Serve as worker ``index``, never returning into the parent's code."""
        first = self._first
        if first is not None and sock is not first:
            # Worker 0's socket, which the parent still holds: kept open here, it would
            # outlive worker 0, and the kernel would queue connections on it that no one
            # accepts.
            first.close()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)

        def tell_parent(_: str) -> None:
            if ready_w is not None:
                os.write(ready_w, b"1")
                os.close(ready_w)

        code = 0
        try:
            main = self._worker(self._config, sock, tell_parent, self._path, self._sharing, index)
            uvloop.run(main)
        except BaseException:
            log.exception("worker %d failed", index)
            code = 1
        os._exit(code)


def _count_ready(ready_r: int, workers: int) -> int:
    """How many workers said they are serving before every one had said so or died."""
    got = b""
    while len(got) < workers:
        chunk = os.read(ready_r, workers)
        if not chunk:
            break
        got += chunk
    os.close(ready_r)
    return len(got)


def _how(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit code {os.waitstatus_to_exitcode(status)}"
