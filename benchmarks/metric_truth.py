"""Metric truth: the replayer's figures against a third-party benchmark client's (aiperf).

Both clients run the same closed-loop workload against a fresh emulator with the same seed.
aiperf generates the requests; the replayer then sends aiperf's own payloads (read from its
``inputs.json``), so the two runs differ only in the client. The script prints both sets of
figures and their ratios and exits 1 if any ratio is off by more than --tolerance.

The default is concurrency 1: every request then meets the same engine state in both runs,
so the ratios compare the metric definitions and client overheads, nothing else. At higher
concurrency (``--concurrency 16 --requests 100 --osl 1024``, the public B200 shape) the two
clients' slightly different send timing changes how the engine batches, so the two runs
themselves differ (one run: within 4.3%, mean E2E within 1.6%).

aiperf is not a project dependency: install it into a throwaway venv and point --aiperf at
it. It needs a tokenizer and has no network here, so the script builds a small word-level
tokenizer (the documented rule's split) with that venv's ``tokenizers`` package::

    python3 -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf
    .venv/bin/python -m benchmarks.metric_truth --aiperf /tmp/aiperf-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from router.server.children import spawn_ready, stop_all

MODEL = "deepseek-v4.1-flash"
_TOKENIZER_SCRIPT = r"""
import json, os, string, sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
corpus, out = sys.argv[1], sys.argv[2]
extra = os.path.join(out, "punctuation.txt")
os.makedirs(out, exist_ok=True)
with open(extra, "w") as f:
    f.write(" ".join(string.punctuation) + "\n")
tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"\w+|[^\w\s]"), "isolated")]
)
tok.decoder = decoders.WordPiece(prefix="##")
tok.train([corpus, extra], trainers.WordLevelTrainer(vocab_size=10**6, special_tokens=["[UNK]"]))
tok.save(os.path.join(out, "tokenizer.json"))
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}, f)
"""

# (label, replay key, aiperf metric, aiperf statistic)
PAIRS = (
    ("Output throughput (tok/s)", "output_throughput", "output_token_throughput", "avg"),
    ("Request throughput (req/s)", "request_throughput", "request_throughput", "avg"),
    ("Mean TTFT (ms)", "mean_ttft_ms", "time_to_first_token", "avg"),
    ("P95 TTFT (ms)", "p95_ttft_ms", "time_to_first_token", "p95"),
    ("Mean TPOT (ms)", "mean_tpot_ms", "inter_token_latency", "avg"),
    ("Mean ITL (ms)", "mean_itl_ms", "inter_chunk_latency", "avg"),
    ("Mean E2E (ms)", "mean_e2el_ms", "request_latency", "avg"),
    ("P95 E2E (ms)", "p95_e2el_ms", "request_latency", "p95"),
)


@contextmanager
def emulator(profile: str, time_scale: float, seed: int) -> Iterator[str]:
    """A fresh emulator process for one run."""
    argv = [sys.executable, "-m", "turnout", "emulator", "--profile", profile, "--port", "0"]
    argv += ["--time-scale", str(time_scale), "--seed", str(seed)]
    proc, url = spawn_ready(argv, "emulator listening on", 30)
    try:
        yield url
    finally:
        stop_all([proc], 10)


def build_tokenizer(aiperf: Path, out: Path) -> None:
    """A word-level tokenizer trained on aiperf's own prompt corpus (no network)."""
    python = aiperf.parent / "python"
    find = "import aiperf, pathlib; print(pathlib.Path(aiperf.__file__).parent)"
    pkg = subprocess.run([python, "-c", find], capture_output=True, text=True, check=True)
    corpus = Path(pkg.stdout.strip()) / "dataset" / "generator" / "assets" / "shakespeare.txt"
    subprocess.run([python, "-c", _TOKENIZER_SCRIPT, corpus, out], check=True)


def run_aiperf(
    a: argparse.Namespace, url: str, tokenizer: Path, out: Path
) -> dict[str, dict[str, Any]]:
    """aiperf profile, closed loop; returns its JSON export."""
    argv = [str(a.aiperf), "profile", "--model", MODEL, "--url", url, "--endpoint-type", "chat"]
    argv += ["--streaming", "--tokenizer", str(tokenizer), "--ui-type", "none"]
    argv += ["--concurrency", str(a.concurrency), "--request-count", str(a.requests)]
    argv += ["--synthetic-input-tokens-mean", str(a.isl), "--synthetic-input-tokens-stddev", "0"]
    argv += ["--output-tokens-mean", str(a.osl), "--output-tokens-stddev", "0"]
    argv += ["--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{a.osl}"]
    argv += ["--use-server-token-count", "--random-seed", str(a.seed), "--artifact-dir", str(out)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    export: dict[str, dict[str, Any]] = json.loads((out / "profile_export_aiperf.json").read_text())
    return export


def payloads_to_batch(inputs: Path, batch: Path) -> int:
    """aiperf's sent payloads as an OpenAI Batch file for the replayer."""
    n = 0
    with batch.open("w") as f:
        for session in json.loads(inputs.read_text())["data"]:
            for body in session["payloads"]:
                line = {"custom_id": f"aiperf-{n}", "method": "POST"}
                line |= {"url": "/v1/chat/completions", "body": body}
                f.write(json.dumps(line) + "\n")
                n += 1
    return n


def run_replay(a: argparse.Namespace, url: str, batch: Path, out: Path) -> dict[str, float]:
    """The replayer, closed loop at the same concurrency; returns its overall metrics."""
    argv = [sys.executable, "-m", "turnout", "replay", str(batch), "--target", url]
    argv += ["--concurrency", str(a.concurrency), "--out", str(out), "--no-progress"]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    overall: dict[str, float] = json.loads(out.read_text())["runs"][0]["overall"]
    return overall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aiperf", type=Path, required=True, help="path to the aiperf script")
    p.add_argument("--profile", default="vllm")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--requests", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--isl", type=int, default=8192)
    p.add_argument("--osl", type=int, default=256)
    p.add_argument("--tolerance", type=float, default=0.03)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        build_tokenizer(a.aiperf, tmp / "tokenizer")
        with emulator(a.profile, a.time_scale, a.seed) as url:
            theirs = run_aiperf(a, url, tmp / "tokenizer", tmp / "aiperf")
        n = payloads_to_batch(tmp / "aiperf" / "inputs.json", tmp / "batch.jsonl")
        with emulator(a.profile, a.time_scale, a.seed) as url:
            ours = run_replay(a, url, tmp / "batch.jsonl", tmp / "report.json")
    print(
        f"{n} requests, concurrency {a.concurrency}, {a.isl}/{a.osl} tokens, "
        f"emulator {a.profile} at time scale {a.time_scale}"
    )
    print(f"{'metric':28} {'aiperf':>12} {'replay':>12} {'ratio':>8}")
    worst = 0.0
    for label, ours_key, metric, stat in PAIRS:
        t = float(theirs[metric][stat])
        o = float(ours[ours_key] or 0.0)
        ratio = o / t if t else float("nan")
        worst = max(worst, abs(ratio - 1.0))
        print(f"{label:28} {t:12.2f} {o:12.2f} {ratio:8.3f}")
    print(f"completed: aiperf {theirs['request_count']['avg']:.0f}, replay {ours['completed']}")
    verdict = "within" if worst <= a.tolerance else "OUTSIDE"
    print(f"largest deviation {worst:.1%}: {verdict} {a.tolerance:.0%}")
    return 0 if worst <= a.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
