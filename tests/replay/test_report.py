"""Metrics as vLLM's benchmark defines them, the table's shape, shadow agreement."""

from __future__ import annotations

import pytest

from replay.client import Result
from replay.report import REASONS, Acc, RunReport
from replay.tables import failed_runs, render_tables


def _ok(cid: str, ttft: float, e2e: float, tokens: int, **kw: object) -> Result:
    gap = (e2e - ttft) / (tokens - 1)
    base: dict[str, object] = {
        "custom_id": cid,
        "request_class": "interactive",
        "status": 200,
        "stream": True,
        "lag": 0.001,
        "backend": "vllm",
        "ttft": ttft,
        "e2e": e2e,
        "itls": [gap] * (tokens - 1),
        "prompt_tokens": 10,
        "completion_tokens": tokens,
        "finish_reason": "length",
    }
    base.update(kw)
    return Result(**base)  # type: ignore[arg-type]


def test_metrics_follow_the_definitions() -> None:
    acc = Acc()
    acc.add(_ok("a", 0.1, 1.1, 11))  # tpot = 1.0 / 10 = 0.1
    acc.add(_ok("b", 0.3, 0.7, 5))  # tpot = 0.4 / 4 = 0.1
    acc.add(Result("c", "interactive", 503, False, 0.002, error={"message": "x"}))
    m = acc.metrics(duration=2.0)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["output_throughput"] == 8.0  # 16 tokens / 2 s
    assert m["total_token_throughput"] == 18.0
    assert m["request_throughput"] == 1.0
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx(100.0)
    assert m["mean_itl_ms"] == pytest.approx(100.0)
    assert m["mean_e2el_ms"] == pytest.approx(900.0)
    assert m["p99_e2el_ms"] == pytest.approx(1096.0)
    assert m["send_lag_p50_ms"] == pytest.approx(1.0)


def test_table_has_the_b200_rows_per_run_and_class() -> None:
    runs = []
    for policy, ttft in (("round-robin", 0.5), ("adaptive", 0.2)):
        run = RunReport(policy)
        run.add(_ok("a", ttft, 2.0, 10))
        run.add(_ok("b", ttft, 3.0, 10, request_class="batch", backend="deepinfer"))
        run.duration = 4.0
        runs.append(run.to_dict())
    report = {"mode": "timed", "target": "http://t", "speed": 2.0, "runs": runs}
    text = render_tables(report)
    assert text.splitlines()[0].endswith("timed, speed 2x, timeline windows 1 s of the trace")
    for row in (
        "Successful requests",
        "Output throughput (tokens/s)",
        "Mean TTFT (ms)",
        "P95 TTFT (ms)",
        "Mean ITL (ms)",
        "Mean TPOT (ms)",
        "Mean E2E (ms)",
        "P95 E2E (ms)",
    ):
        assert text.count(row) == 3  # batch, interactive, then all requests
    # per class first; the table mixing them last
    titles = [line for line in text.splitlines() if line and line[0] not in "|"][1:]
    assert titles == ["Class batch", "Class interactive", "All requests (classes mixed)"]
    header = next(line for line in text.splitlines() if line.startswith("| Metric"))
    assert header.index("round-robin") < header.index("adaptive")
    # the best cell of a row is marked: adaptive's TTFT is lower
    first_ttft = next(line for line in text.splitlines() if line.startswith("| Mean TTFT (ms)"))
    cells = [c.strip() for c in first_ttft.split("|")]
    assert cells[2:4] == ["500.0", "200.0 *"]
    tokens = next(line for line in text.splitlines() if line.startswith("| Output throughput"))
    assert "*" not in tokens  # a tie marks nothing
    backends = runs[0]["by_backend"]
    assert {k: b["requests"] for k, b in backends.items()} == {"deepinfer": 1, "vllm": 1}
    assert backends["deepinfer"]["by_class"]["batch"]["output_tokens"] == 10
    assert runs[1]["overall"]["mean_ttft_ms"] == pytest.approx(200.0)


def test_shadow_agreement() -> None:
    run = RunReport("p", shadow_target="http://s")
    a = _ok("a", 0.1, 1.0, 10, text="hello")
    run.add(a)
    run.add_shadow(a, _ok("a", 0.2, 1.0, 10, text="hello"), deterministic=True)
    b = _ok("b", 0.1, 1.0, 10, text="x")
    run.add(b)
    run.add_shadow(b, _ok("b", 0.2, 1.0, 9, text="y", finish_reason="stop"), deterministic=True)
    run.duration = 1.0
    d = run.to_dict()
    ag = d["shadow"]["agreement"]
    assert ag["compared"] == 2 and ag["status"] == 1.0
    assert ag["finish_reason"] == 0.5 and ag["output_tokens"] == 0.5 and ag["text"] == 0.5
    assert d["shadow"]["overall"]["mean_ttft_ms"] == pytest.approx(200.0)
    assert "Shadow agreement" in render_tables({"mode": "timed", "target": "t", "runs": [d]})


def test_non_streamed_answers_have_no_tpot() -> None:
    acc = Acc()
    acc.add(_ok("a", 0.1, 1.1, 11))
    whole = _ok("b", 2.0, 2.0, 50, stream=False, itls=[])
    assert whole.tpot is None and whole.ok
    acc.add(whole)
    m = acc.metrics(duration=1.0)
    assert m["mean_tpot_ms"] == pytest.approx(100.0)  # the 0 of the non-streamed one is left out
    assert m["mean_ttft_ms"] == pytest.approx(1050.0)  # its first byte is its last
    assert m["total_output_tokens"] == 61


def test_failures_are_counted_by_status_and_reason_most_frequent_first() -> None:
    run = RunReport("p")
    run.add(_ok("ok", 0.1, 1.0, 5))
    for i in range(3):
        err = {"message": "model 'x' does not exist", "type": "not_found_error"}
        run.add(
            Result(
                f"a{i}", "interactive", 404, False, 0.0, error={**err, "code": "model_not_found"}
            )
        )
    run.add(
        Result(
            "b",
            "interactive",
            0,
            False,
            0.0,
            error={"message": "Cannot connect", "type": "connection_error"},
        )
    )
    run.add(
        Result(
            "c", "interactive", 503, False, 0.0, error={"message": "HTTP 503", "type": "http_error"}
        )
    )
    run.add(Result("d", "interactive", 200, True, 0.0))  # answered, but no first token
    run.duration = 1.0
    entry = run.to_dict()
    report = {"mode": "timed", "target": "http://t", "runs": [entry]}
    assert entry["failures"] == [
        {"status": 404, "reason": "model_not_found: model 'x' does not exist", "count": 3},
        {"status": 0, "reason": "connection_error: Cannot connect", "count": 1},
        {"status": 200, "reason": "no content", "count": 1},
        {"status": 503, "reason": "http_error", "count": 1},
    ]
    text = render_tables(report)
    assert "p: 6 of 7 requests failed" in text
    assert "     3  HTTP 404 model_not_found: model 'x' does not exist" in text
    assert "     1  connection_error: Cannot connect" in text
    assert "     1  HTTP 200 no content" in text
    assert "     1  other reasons" in text  # beyond the three shown
    assert failed_runs(report) == []


def test_a_hostile_target_cannot_grow_the_reasons_without_bound() -> None:
    run = RunReport(None)
    for i in range(1000):
        message = f"error {i} " + "x" * 10_000
        run.add(Result(f"r{i}", "interactive", 500, False, 0.0, error={"message": message}))
    failures = run.to_dict()["failures"]
    assert len(failures) == REASONS + 1
    assert all(len(f["reason"]) <= 160 for f in failures)
    assert failures[-1] == {"status": None, "reason": "other reasons", "count": 1000 - REASONS}
    report = {"mode": "timed", "target": "http://t", "runs": [run.to_dict()]}
    assert failed_runs(report) == ["target"]
    assert "target: 1000 of 1000 requests failed" in render_tables(report)
