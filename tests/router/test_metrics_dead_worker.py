"""A dead worker's live gauges leave the shared /metrics once the parent forgets it.

prometheus-client's multiprocess mode keeps one file per process; a gauge in a ``live*``
mode counts a process's file until it is marked dead. The router's parent does that for a
worker it reaps (router.workers); this runs the same calls in real processes: a forked
"worker" records a queue length and dies, and the "survivor" renders with and without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import json, os, sys
from pathlib import Path
from router.observe.metrics import Metrics
from router.observe.sharing import forget_worker, share_between_workers

directory = Path(sys.argv[1])
share_between_workers(directory)
metrics = Metrics(workers_dir=directory)

def queued():
    text = metrics.render().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("turnout_admission_queue_length{"))

pid = os.fork()
if pid == 0:  # the worker that dies with two requests queued
    metrics.watch_queue("batch", lambda: 2)
    metrics.refresh()
    os._exit(0)
os.waitpid(pid, 0)
metrics.watch_queue("batch", lambda: 1)
before = queued()
forget_worker(directory, pid)
print(json.dumps({"before": before, "after": queued()}))
"""


def test_a_forgotten_worker_leaves_the_live_gauges(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout) == {"before": 3.0, "after": 1.0}
