"""What the workers' lock around check-and-take costs per admission.

With ``--workers N`` admission looks for a backend with room and takes its slot under a
record lock of the fairness segment (router.control.admission, ``Ledger.taking``): two fcntl
calls per admission. One process alone takes it with no lock (``LocalLedger``). This times
the admission step as the handler runs it, ``Admission.take`` then the attempt's lease, its
release and the wake-up, over the shared in-flight counts of ``--workers`` (so only the lock
differs: the shared ledger with its lock, and the same ledger with ``taking`` a no-op; the
process-local ledger beside them), in 1 process and in 2 processes at once (contending for
the lock), each run twice (A/A), and the bare lock (enter and exit) alone. CPU and wall
time per admission, per process:

    python -m benchmarks.take_lock [--rounds 200000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial

from policies.types import RequestInfo
from router.backends.pool import Pool
from router.backends.shared import SharedLoad
from router.config.model import AdmissionSettings, BackendSpec, HealthSettings
from router.control.admission import Admission
from router.control.fair import Ledger, LocalLedger
from router.control.fair_shared import SharedFairness, SharedLedger
from router.control.plan import Attempt

INFO = RequestInfo("r", "chat", "m", "interactive", stream=True, prompt_tokens=1, max_tokens=1)


class _Unlocked(SharedLedger):
    """The shared ledger without the lock (what the figures are set against)."""

    def taking(self) -> AbstractContextManager[object]:  # type: ignore[override]
        return nullcontext()


async def _admit(pool: Pool, admission: Admission, rounds: int) -> tuple[float, float]:
    backend = pool.by_name["b"]
    started, wall = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        target = await admission.take("interactive", [Attempt(backend, "m")])
        lease = target.backend.lease(INFO)
        lease.release()
        admission.release()
        await asyncio.sleep(0)  # the turn of the loop a request's other steps give it
    return (time.process_time() - started) / rounds, (time.perf_counter() - wall) / rounds


def _one(
    load: SharedLoad, ledger: Callable[[int], Ledger], worker: int, rounds: int
) -> tuple[float, float]:
    """CPU and wall seconds per admission of worker ``worker``."""
    spec = BackendSpec(name="b", url="http://127.0.0.1:9", engine="vllm", max_inflight=10**6)
    pool = Pool([spec], {}, HealthSettings(), shared=load.row(worker))
    admission = Admission(AdmissionSettings(), ledger(worker))
    return asyncio.run(_admit(pool, admission, rounds))


def run(kind: str, processes: int, rounds: int) -> list[tuple[float, float]]:
    """Microseconds of CPU and wall time per admission in each of ``processes`` processes
    at once, with the ledger ``kind``."""
    load, fairness = SharedLoad(processes), SharedFairness(processes)
    ledgers: dict[str, Callable[[int], Ledger]] = {
        "local": lambda _: LocalLedger(),
        "shared, no lock": partial(_unlocked, fairness),
        "shared, locked": fairness.ledger,
    }
    ledger = ledgers[kind]
    pipes = []
    for worker in range(1, processes):
        read, write = os.pipe()
        if os.fork() == 0:
            os.close(read)
            os.write(write, " ".join(map(repr, _one(load, ledger, worker, rounds))).encode())
            os._exit(0)
        os.close(write)
        pipes.append(read)
    figures = [_one(load, ledger, 0, rounds)]
    for read in pipes:
        cpu, wall = os.read(read, 128).split()
        figures.append((float(cpu), float(wall)))
        os.close(read)
        os.wait()
    return [(cpu * 1e6, wall * 1e6) for cpu, wall in figures]


def _unlocked(fairness: SharedFairness, worker: int) -> Ledger:
    ledger = fairness.ledger(worker)
    ledger.__class__ = _Unlocked  # the same object, its lock a no-op: nothing else differs
    return ledger


def bare_lock(rounds: int) -> float:
    """Microseconds of CPU per enter and exit of the lock, uncontended."""
    lock = SharedFairness(1).ledger(0).taking()
    started = time.process_time()
    for _ in range(rounds):
        with lock:
            pass
    return (time.process_time() - started) / rounds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"bare lock, enter + exit: {bare_lock(args.rounds):.2f} us")
    print("| processes | ledger | run | µs CPU per admission | µs wall | load avg |")
    print("|---|---|---|---|---|---|")
    for processes in (1, 2):
        for run_no in range(1, args.repeat + 1):
            for kind in ("local", "shared, no lock", "shared, locked"):
                figures = run(kind, processes, args.rounds)
                cpu = ", ".join(f"{c:.2f}" for c, _ in figures)
                wall = ", ".join(f"{w:.2f}" for _, w in figures)
                load = os.getloadavg()[0]
                print(f"| {processes} | {kind} | {run_no} | {cpu} | {wall} | {load:.1f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
