"""llama.cpp's ``llama-server`` on loopback: the real engine of the ``realengine`` suite.

``make llama-server`` builds the binary and fetches the model into ``.engines/`` (ignored by
git). :func:`start_llama_server` runs it with continuous batching over several slots and
``--metrics``, and yields once ``/health`` answers 200. Run by hand::

    .venv/bin/python -m tests.realengine.llama_server --slots 4   # prints its URL, Ctrl-C ends
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.procs import ROOT, Process, stop

LLAMA_SERVER = ROOT / ".engines" / "bin" / "llama-server"
MODEL_FILE = ROOT / ".engines" / "models" / "smollm2-135m.gguf"
MODEL = "smollm2-135m"
"""The name llama-server lists in /v1/models (``--alias``); it answers any name asked for."""


def missing() -> str | None:
    """Why the suite cannot run here (None when the binary and the model are in place)."""
    for path in (LLAMA_SERVER, MODEL_FILE):
        if not path.is_file():
            return f"{path.relative_to(ROOT)} is missing: run `make llama-server` first"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@contextlib.contextmanager
def start_llama_server(
    *,
    slots: int = 4,
    context_per_slot: int = 2048,
    threads: int = 2,
    log: Path | None = None,
    timeout: float = 60.0,
    grace: float = 5.0,
) -> Iterator[Process]:
    """Run llama-server on a free loopback port until the block exits.

    ``slots`` requests decode together in one continuous batch (``--parallel``); more wait
    in its queue (``llamacpp:requests_deferred``). Its log goes to ``log`` (else discarded).
    """
    port = _free_port()
    argv = [
        str(LLAMA_SERVER), "--model", str(MODEL_FILE), "--alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(slots), "--cont-batching", "--ctx-size", str(slots * context_per_slot),
        "--threads", str(threads), "--metrics", "--no-ui", "--no-warmup",
    ]  # fmt: skip
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log else subprocess.DEVNULL
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not _healthy(port):
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({proc.returncode}) before ready")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"llama-server not healthy after {timeout} s")
                time.sleep(0.1)
            yield Process(url=f"http://127.0.0.1:{port}", proc=proc)
        finally:
            stop(proc, grace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--context-per-slot", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if reason := missing():
        sys.exit(reason)
    # SIGTERM unwinds like Ctrl-C, so the server is stopped with us, not left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with start_llama_server(
        slots=args.slots,
        context_per_slot=args.context_per_slot,
        threads=args.threads,
        log=Path("/dev/stderr"),
    ) as server:
        print(f"llama-server listening on {server.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.proc.wait()


if __name__ == "__main__":
    main()
