"""Emulator child processes for backends configured with ``emulator:`` instead of ``url``.

Each starts as ``python -m turnout emulator --port 0 ...`` on loopback; the URL it announces becomes
the backend's URL. They live exactly as long as the router: stopped on shutdown, and (Linux)
sent SIGTERM by the kernel should the router die without cleaning up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from router.config.model import BackendSpec, EmulatorSpec, RouterConfig

READY_PREFIX = "emulator listening on "
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def emulator_argv(spec: EmulatorSpec, host: str) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "turnout",
        "emulator",
        "--profile",
        spec.profile,
        "--host",
        host,
        "--port",
        "0",
        "--time-scale",
        str(spec.time_scale),
        "--seed",
        str(spec.seed),
    ]
    if spec.model:
        argv += ["--model", spec.model]
    for key, value in spec.profile_overrides().items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        argv += ["--set", f"{key}={text}"]
    return argv


class Children:
    """The emulators of one config; :meth:`start` resolves the backends' URLs."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, config: RouterConfig, timeout: float = 30.0) -> RouterConfig:
        """Start every ``emulator:`` backend; the config with their URLs filled in."""
        backends: list[BackendSpec] = []
        for b in config.backends:
            if b.emulator is None:
                backends.append(b)
                continue
            url = self._spawn(emulator_argv(b.emulator, "127.0.0.1"), timeout)
            backends.append(replace(b, url=url))
        return replace(config, backends=tuple(backends))

    def _spawn(self, argv: Sequence[str], timeout: float) -> str:
        proc, url = spawn_ready(argv, READY_PREFIX, timeout)
        self.procs.append(proc)
        return url

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM every child, then SIGKILL whatever is still alive after ``grace``."""
        stop_all(self.procs, grace)
        self.procs = []


def stop_all(
    procs: Sequence[subprocess.Popen[bytes] | subprocess.Popen[str]], grace: float = 5.0
) -> None:
    """SIGTERM every process, then SIGKILL whatever is still alive after ``grace`` seconds."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()


def spawn_ready(
    argv: Sequence[str],
    ready_prefix: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``argv`` (in ``env``, else this process's environment); wait (bounded) for its
    stdout line ``PREFIX URL``; return both.

    The child gets SIGTERM should this process die first. On failure it is killed. What it
    writes to stdout after that line (a router's access log) is read and dropped by a thread,
    so that it never blocks on a full pipe.
    """
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, preexec_fn=_die_with_parent)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0 and sel.select(left):
                data = os.read(fd, 4096)
                if not data:
                    raise RuntimeError(f"{argv[:4]} exited ({proc.wait()}) before it was ready")
                buf += data
                for line in buf.decode(errors="replace").splitlines():
                    if line.startswith(ready_prefix):
                        threading.Thread(target=discard_output, args=(fd,), daemon=True).start()
                        return proc, line[len(ready_prefix) :].strip()
        raise RuntimeError(f"{argv[:4]} not ready after {timeout} s")
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def discard_output(fd: int) -> None:
    """Read ``fd`` (a child's stdout) to its end, dropping what comes, so the child never
    blocks on a full pipe; run it in a daemon thread."""
    try:
        while os.read(fd, 65536):
            pass
    except OSError:  # closed by stop_all
        pass
