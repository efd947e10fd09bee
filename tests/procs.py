"""Run real Turnout processes (emulator, router) for tests, over loopback only.

``start_process`` spawns a command, waits (bounded) for the line that says it is ready and
yields the URL it printed; on exit it terminates the process and kills it after a grace
period. ``start_emulator`` wraps it for ``python -m turnout emulator`` on a free port;
``run_replay`` runs the replay CLI to completion::

    with start_emulator("vllm", time_scale=50) as emu:
        client = openai.OpenAI(base_url=emu.url + "/v1", api_key="x")
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TAIL = 64 << 10
"""Bytes of a process's stdout kept to show with its test (the access log, mostly)."""


@dataclass(frozen=True)
class Process:
    """A started process and the URL it announced."""

    url: str
    proc: subprocess.Popen[bytes]


Emulator = Process


@contextlib.contextmanager
def start_process(
    argv: Sequence[str],
    ready_line_prefix: str,
    timeout: float = 20.0,
    grace: float = 5.0,
    lines: list[str] | None = None,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    stderr: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> Iterator[Process]:
    """Start ``argv`` in ``cwd``; wait up to ``timeout`` s for a stdout line ``PREFIX
    http://HOST:PORT``.

    Stdout after the ready line is read by a thread, so a chatty child never blocks on a full
    pipe; its last :data:`TAIL` bytes are written to our stderr once the process has exited,
    within the test (or the fixture's teardown) that started it, so pytest shows them with
    that test. (Copied as they came, the lines a module's router wrote after a test's last
    answer landed between tests, outside pytest's capture, in the middle of its progress
    dots.) With ``lines``, each whole line is also appended there. With
    ``stderr``, the child's stderr (its log) is written to that file instead. ``preexec_fn``
    runs in the child before ``argv`` does (to lower a resource limit, say). The process is
    always terminated, then killed after ``grace`` seconds.
    """
    with contextlib.ExitStack() as files:
        err = None if stderr is None else files.enter_context(stderr.open("wb"))
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            preexec_fn=preexec_fn,
        )
    drain: threading.Thread | None = None
    tail = bytearray()
    try:
        url = _wait_ready(proc, ready_line_prefix, timeout)
        drain = threading.Thread(target=_drain, args=(proc, lines, tail), daemon=True)
        drain.start()
        yield Process(url=url, proc=proc)
    finally:
        stop(proc, grace)
        if drain is not None:
            drain.join(grace)  # EOF follows the exit; join before closing the pipe
        if proc.stdout is not None:
            proc.stdout.close()
        sys.stderr.write(tail.decode(errors="replace"))


def stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Terminate ``proc`` if it still runs; kill it if it has not exited after ``grace`` s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(grace)


def _drain(proc: subprocess.Popen[bytes], lines: list[str] | None, tail: bytearray) -> None:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    rest = b""
    while data := os.read(fd, 65536):
        tail += data
        del tail[:-TAIL]
        if lines is not None:
            *whole, rest = (rest + data).split(b"\n")
            lines.extend(w.decode(errors="replace") for w in whole)


def _wait_ready(proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> str:
    """Read stdout unbuffered (os.read) so select never misses a line already read."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buf = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            data = os.read(fd, 4096)
            if not data:
                raise RuntimeError(f"{proc.args!r} exited ({proc.wait()}) before ready: {buf!r}")
            buf += data
            for line in buf.decode(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
    raise TimeoutError(f"{proc.args!r} not ready after {timeout} s: {buf!r}")


@contextlib.contextmanager
def start_emulator(
    profile: str,
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    args: Sequence[str] = (),
    timeout: float = 20.0,
    stderr: Path | None = None,
) -> Iterator[Emulator]:
    """Run ``python -m turnout emulator --profile PROFILE --port 0 ...`` until the block exits
    (its log to ``stderr`` if given)."""
    argv = [sys.executable, "-m", "turnout", "emulator", "--profile", profile, "--port", "0",
            "--time-scale", str(time_scale), "--seed", str(seed), *args]  # fmt: skip
    with start_process(argv, "emulator listening on", timeout, stderr=stderr) as proc:
        yield proc


@contextlib.contextmanager
def start_misbehaving(*args: str, timeout: float = 20.0) -> Iterator[Process]:
    """Run the scripted hostile backend (``python -m tests.misbehaving --port 0 ARGS``)."""
    argv = [sys.executable, "-m", "tests.misbehaving", "--port", "0", *args]
    with start_process(argv, "misbehaving listening on", timeout) as proc:
        yield proc


def run_replay(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """``python -m turnout replay ARGS`` from the repository root, output captured, bounded
    in time."""
    return subprocess.run(
        [sys.executable, "-m", "turnout", "replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _status_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure the kernel gives in kB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for process {pid}")


def rss_kb(pid: int) -> int:
    """The process's resident set size now, in kB."""
    return _status_kib(pid, "VmRSS")


def scrape(url: str) -> str:
    """``url``'s /metrics as text: one scrape for several :func:`metric_in` readings."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


def metric_in(
    text: str, pattern: str, labels: Mapping[str, str] | None = None, *, required: bool = False
) -> float:
    """The sum of every sample of a /metrics ``text`` whose line matches ``pattern`` from its
    start and carries each of ``labels`` (``metric_in(t, "x_total", {"backend": "a"})``), 0 if
    none does. ``required``: none is an error, so that a renamed series cannot read as 0."""
    wanted = [f'{name}="{value}"' for name, value in (labels or {}).items()]
    values = []
    for line in text.splitlines():
        if line.startswith("#") or not re.match(pattern, line):
            continue
        series, value = line.rsplit(" ", 1)
        given = series.partition("{")[2].rstrip("}")
        if all(f",{label}," in f",{given}," for label in wanted):  # whole labels only
            values.append(float(value))
    assert values or not required, f"no sample matches {pattern!r} {labels or ''}"
    return sum(values)


def metric(
    url: str, pattern: str, labels: Mapping[str, str] | None = None, *, required: bool = False
) -> float:
    """:func:`metric_in` of a fresh scrape of ``url``."""
    return metric_in(scrape(url), pattern, labels, required=required)


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it is true (True) or ``timeout`` s pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def peak_rss_mib(pid: int) -> float:
    """The process's peak RSS (the kernel's ``VmHWM``) since it started or since
    :func:`reset_peak_rss`, in MiB."""
    return _status_kib(pid, "VmHWM") / 1024


def reset_peak_rss(pid: int) -> None:
    """Start the process's peak RSS afresh from its RSS now (``clear_refs``, Linux)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
