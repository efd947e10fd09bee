"""`make demo`: the showcase run on emulated engines (no GPU needed).

Until the router and replayer land, the demo starts both emulated engines (the ``vllm`` and
``deepinfer`` profiles, on free loopback ports) and runs the public B200 run's benchmark shape
against each over HTTP, printing measured figures beside the published ones. It takes under
two minutes (time scale 2).
"""

from __future__ import annotations

import contextlib
import sys

from benchmarks.calibrate_emulator import calibrate, emulator, verdict

TIME_SCALE = 2.0


def main() -> int:
    """Start both profiles, calibrate each, print the verdict."""
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(emulator(name, TIME_SCALE)) for name in ("vllm", "deepinfer")
        }
        for name, url in urls.items():
            print(f"emulated {name} engine at {url}", flush=True)
        print("\nBenchmark shape of the public run: 100 requests, concurrency 16, "
              "8,192 in / 1,024 out, streamed, measured over HTTP", flush=True)  # fmt: skip
        results = {name: calibrate(name, url, TIME_SCALE) for name, url in urls.items()}
    ok = verdict(results)
    print("\nall figures within tolerance" if ok else "\nsome figures out of tolerance")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
