"""The options ``replay`` and ``replay simulate`` share: one definition, one meaning, and
defaults in every ``--help``. ``replay simulate`` runs in-process (virtual time, no sockets);
nothing here contacts a target."""

from __future__ import annotations

import contextlib
import io
import re
import zlib
from pathlib import Path

import orjson
import pytest

from replay.cli import main
from tests.fixtures import MOONCAKE
from turnout.common.capture import CaptureRecord, dump_line, parse_line

COMMON = (
    "--policy", "--format", "--speed", "--rate", "--max-requests", "--max-gap", "--window",
    "--shard", "--sessions", "--out", "--results", "--html", "--dry-run", "--no-progress",
)  # fmt: skip


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return out.getvalue()


def _entries(text: str) -> dict[str, str]:
    """Each option's help entry (whitespace normalised), by its first option string."""
    entries: dict[str, str] = {}
    name = None
    for line in text.split("options:", 1)[1].splitlines():
        head = re.match(r"  (-[-\w]+)", line)
        if head:
            name = head.group(1)
            entries[name] = line
        elif name is not None and line.startswith("   "):
            entries[name] += line
        else:
            name = None
    return {k: " ".join(v.split()) for k, v in entries.items()}


def test_the_common_options_read_the_same_in_replay_and_simulate() -> None:
    live, simulated = _entries(_help()), _entries(_help("simulate"))
    for flag in COMMON:
        assert flag in live and live[flag] == simulated[flag], flag
    # each command's own options are its own
    assert {"--concurrency", "--target", "--api-key"} <= set(live) - set(simulated)
    assert {"--config", "--set", "--time-shard"} <= set(simulated) - set(live)


def test_every_help_shows_its_defaults() -> None:
    live = _entries(_help())
    assert live["--target"].endswith("(default: http://127.0.0.1:8080)")
    assert live["--speed"] == "--speed X offsets divided by X (default: 1.0)"
    assert live["--sessions"].endswith("(default: auto)")
    assert _entries(_help("simulate"))["--speed"] == live["--speed"]
    assert _entries(_help("convert"))["--model"].endswith("(default: default)")
    for argv in ((), ("simulate",), ("merge",), ("convert",)):
        assert "(default: None)" not in _help(*argv), argv  # an option not given says nothing
        assert "(default: False)" not in _help(*argv), argv


def test_simulate_shard_keeps_the_requests_a_live_shard_sends(tmp_path: Path) -> None:
    ids = [f"mooncake-{n}" for n in range(12)]
    for i in range(3):
        results = tmp_path / f"results-{i}.jsonl"
        argv = [str(MOONCAKE), "--shard", f"{i}/3", "--results", str(results)]
        assert main(["simulate", *argv, "--policy", "round-robin"]) == 0
        kept = {parse_line(line).custom_id for line in results.read_bytes().splitlines()}
        assert kept == {c for c in ids if zlib.crc32(c.encode()) % 3 == i}, i


def test_simulate_dry_run_prints_replays_plan_and_simulates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = [str(MOONCAKE), "--speed", "10", "--max-gap", "0.5", "--shard", "0/2", "--dry-run"]
    assert main(plan) == 0
    live = capsys.readouterr().out
    assert "requests    " in live and "largest gap 0.500 s" in live
    out, results = tmp_path / "report.json", tmp_path / "results.jsonl"
    outputs = ["--out", str(out), "--results", str(results), "--no-progress"]
    assert main(["simulate", *plan, *outputs]) == 0
    assert capsys.readouterr().out == live
    assert not out.exists() and not results.exists()
    # the time shard's window: the second half of the planned schedule
    planned = re.search(r"duration    ([\d.]+) s planned", live)
    assert planned is not None
    assert main(["simulate", *plan, "--time-shard", "1/2"]) == 0
    half = float(planned.group(1)) / 2
    assert capsys.readouterr().out.endswith(f"time shard  1/2: from {half:.3f} s to its end of "
                                            "the schedule\n")  # fmt: skip


def test_simulate_takes_no_progress_as_replay_does(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    argv = [str(MOONCAKE), "--policy", "round-robin", "--no-progress", "--out", str(out)]
    assert main(["simulate", *argv]) == 0
    assert orjson.loads(out.read_bytes())["runs"][0]["overall"]["completed"] == 12


def test_simulate_names_an_unknown_policy_before_running_any(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["simulate", str(MOONCAKE), "--policy", "adaptive", "--policy", "adaptve"]) == 2
    said = capsys.readouterr()
    assert "unknown policy 'adaptve' (did you mean 'adaptive'?); known: " in said.err
    assert "simulated adaptive" not in said.out  # the first one did not run first


def test_simulate_exits_1_when_every_request_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "cap.jsonl"
    body = {"model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    cap.write_bytes(
        b"".join(
            dump_line(CaptureRecord(f"r{i}", "/v1/chat/completions", body, t_offset_ms=i))
            for i in range(3)
        )
    )
    assert main(["simulate", str(cap), "--policy", "round-robin"]) == 1
    said = capsys.readouterr()
    assert "round-robin: 3 of 3 requests failed" in said.out
    assert "3  HTTP 404 model 'nope' does not exist" in said.out
    assert "replay simulate: every request failed" in said.err
