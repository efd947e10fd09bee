"""What a hostile backend costs the router: its memory and its /health latency meanwhile.

    python -m benchmarks.hostile_backend [--megabytes 100] [--seconds 5] [--clients 1]
                                         [--router-root PATH]

Starts the misbehaving backend of the tests (tests/misbehaving.py) and one router in front
of it, then plays two attacks one after the other, each from ``--clients`` clients sending
requests back to back for ``--seconds`` (a request still open then is waited for):

- ``endless-line``: streams whose second SSE event is a line of ``--megabytes`` MB that
  never ends (no separator);
- ``huge-body``: non-streamed answers of ``--megabytes`` MB.

While each runs, a thread asks the router's ``/health`` every 10 ms and another samples its
RSS (``/proc/PID/status``) every 10 ms. Printed per attack: requests and how their answers
ended, the longest a client waited, how much of the flood the backend got out before the
router stopped reading, the router's RSS before / at its peak / after, and the /health
latency (p50, p99, max, and how many probes failed). ``--router-root`` runs the router from
another checkout (e.g. an older commit exported with ``git archive``) to put figures side by
side; the config uses only keys every version knows, so each runs with its defaults.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from router.server.children import discard_output

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Attack:
    name: str
    model: str
    stream: bool


ATTACKS = (Attack("endless-line", "endless-line", True), Attack("huge-body", "huge-body", False))


@contextmanager
def _spawn(argv: list[str], cwd: Path, ready: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """Run ``argv`` in ``cwd`` until the block ends; yield it and the URL of its ready line."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        buf = b""
        deadline = time.monotonic() + 30
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while ready.encode() not in buf or not buf.endswith(b"\n"):
                if time.monotonic() > deadline or not sel.select(deadline - time.monotonic()):
                    raise RuntimeError(f"{argv[:3]} not ready: {buf!r}")
                data = os.read(proc.stdout.fileno(), 4096)
                if not data:
                    raise RuntimeError(f"{argv[:3]} exited: {buf!r}")
                buf += data
        line = next(x for x in buf.decode().splitlines() if x.startswith(ready))
        # A router writes an access line per request to stdout from here on.
        threading.Thread(target=discard_output, args=(proc.stdout.fileno(),), daemon=True).start()
        yield proc, line[len(ready) :].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def _connect(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)


def _get_json(url: str, path: str) -> object:
    conn = _connect(url, 10)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class _Sampler:
    """Calls ``probe`` every ``every`` seconds in a thread until stopped."""

    def __init__(self, probe: Callable[[], None], every: float = 0.01) -> None:
        self._probe = probe
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._probe()
            self._stop.wait(self._every)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@dataclass
class Outcomes:
    """What the clients of one attack saw."""

    endings: Counter[str] = field(default_factory=Counter)
    received: int = 0
    longest: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ending: str, received: int, took: float) -> None:
        with self.lock:
            self.endings[ending] += 1
            self.received += received
            self.longest = max(self.longest, took)


def _one_request(url: str, attack: Attack) -> tuple[str, int]:
    """Send the attack's request: how its answer ended, and how many bytes came."""
    body = {
        "model": attack.model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": attack.stream,
    }
    conn = _connect(url, 600)
    got, tail = 0, b""
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode(),
                     {"Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        while data := resp.read(65536):
            got += len(data)
            tail = (tail + data)[-1000:]
    except (OSError, http.client.HTTPException) as exc:
        return f"connection error ({exc.__class__.__name__})", got
    finally:
        conn.close()
    return f"{resp.status} {_ending(tail)}", got


def _ending(tail: bytes) -> str:
    """How an answer ended: an OpenAI error's code, ``[DONE]``, or its last bytes."""
    lines = [x[6:] for x in tail.split(b"\n") if x.startswith(b"data: {")]
    for doc in [tail, *reversed(lines)]:
        try:
            error = json.loads(doc).get("error")
        except (ValueError, AttributeError):
            continue
        if error:
            return f"error {error.get('code')}"
    if tail.endswith(b"data: [DONE]\n\n"):
        return "[DONE]"
    return repr(tail[-40:])


def _client(url: str, attack: Attack, until: float, out: Outcomes) -> None:
    while time.monotonic() < until:
        t0 = time.monotonic()
        ending, got = _one_request(url, attack)
        out.add(ending, got, time.monotonic() - t0)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_attack(
    router_url: str, pid: int, backend_url: str, attack: Attack, seconds: float, clients: int
) -> None:
    flooded = _get_json(backend_url, "/stats")["sent"].get(attack.name, 0)  # type: ignore[index]
    rss_before = _rss_mb(pid)
    peak = [rss_before]
    health_ms: list[float] = []
    failed = [0]

    def health() -> None:
        t0 = time.perf_counter()
        try:
            conn = _connect(router_url, 30)
            conn.request("GET", "/health")
            ok = conn.getresponse().status == 200
            conn.close()
        except OSError:
            ok = False
        health_ms.append((time.perf_counter() - t0) * 1000)
        failed[0] += not ok

    def rss() -> None:
        peak[0] = max(peak[0], _rss_mb(pid))

    out = Outcomes()
    until = time.monotonic() + seconds
    with _Sampler(health), _Sampler(rss):
        threads = [
            threading.Thread(target=_client, args=(router_url, attack, until, out))
            for _ in range(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    time.sleep(0.5)  # let the router settle (freed buffers) before the "after" figure
    stats = _get_json(backend_url, "/stats")
    sent = stats["sent"].get(attack.name, 0) - flooded  # type: ignore[index]
    requests = sum(out.endings.values())
    endings = ", ".join(f"{n} x {e}" for e, n in out.endings.most_common())
    print(f"{attack.name}: {requests} requests from {clients} client(s) in {seconds:g} s")
    print(f"  answers            {endings}")
    print(f"  longest wait       {out.longest:8.2f} s")
    print(f"  client received    {out.received / 1e6:8.2f} MB")
    print(f"  backend got out    {sent / 1e6:8.2f} MB in all, before the router stopped reading")
    print(f"  router RSS         {rss_before:8.1f} MB before, {peak[0]:.1f} peak, "
          f"{_rss_mb(pid):.1f} after")  # fmt: skip
    print(f"  /health latency    p50 {statistics.median(health_ms):.1f} ms, "
          f"p99 {_pct(health_ms, 0.99):.1f} ms, max {max(health_ms):.1f} ms "
          f"({len(health_ms)} probes, {failed[0]} failed)")  # fmt: skip


def router_config(backend_url: str) -> dict[str, Any]:
    """A router in front of the one backend at ``backend_url``, never ejecting it, with keys
    every version knows."""
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "backends": [{"name": "bad", "engine": "vllm", "url": backend_url}],
        "policies": {"only": {"type": "round-robin"}},
        "default_policy": "only",
        "health": {"failures_to_eject": 1000},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hostile_backend")
    parser.add_argument("--megabytes", type=float, default=100.0, help="flood size (MB)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each attack")
    parser.add_argument("--clients", type=int, default=1, help="concurrent attacking clients")
    parser.add_argument("--router-root", type=Path, default=ROOT, help="checkout to run")
    args = parser.parse_args()
    flood = int(args.megabytes * 1_000_000)
    backend_argv = [sys.executable, "-m", "tests.misbehaving", "--port", "0",
                    "--flood-bytes", str(flood)]  # fmt: skip
    with (
        _spawn(backend_argv, ROOT, "misbehaving listening on ") as (_, backend_url),
        tempfile.TemporaryDirectory() as tmp,
    ):
        path = Path(tmp) / "router.yaml"
        path.write_text(yaml.safe_dump(router_config(backend_url)))
        router_argv = [sys.executable, "-m", "turnout", "serve", "--config", str(path),
                       "--port", "0"]  # fmt: skip
        root = args.router_root.resolve()
        with _spawn(router_argv, root, "turnout listening on ") as (router, router_url):
            print(f"router from {root}, flood {flood / 1e6:.0f} MB per attack")
            time.sleep(1.0)  # the first health probe and model discovery
            for attack in ATTACKS:
                run_attack(router_url, router.pid, backend_url, attack, args.seconds, args.clients)


if __name__ == "__main__":
    main()
