"""One list of request outcomes: the code's reasons, the documented table, and the failures
that the dashboard's error ratio and the availability alerts count."""

from __future__ import annotations

import json
import re

import yaml

from router.observe.outcomes import FAILURES, REJECTED, REQUEST_REASONS
from tests.procs import ROOT

DOC = (ROOT / "docs/router.md").read_text(encoding="utf-8")
DASHBOARD = json.loads((ROOT / "deploy/grafana/turnout.json").read_text(encoding="utf-8"))
RULES = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yaml").read_text(encoding="utf-8"))
_REASON_MATCHER = re.compile(r'reason=~"([^"]+)"')


def test_the_reason_table_documents_every_reason_once() -> None:
    start = DOC.index("| reason | what happened | code |")
    rows = DOC[start:].split("\n\n", 1)[0].splitlines()[2:]
    documented = [re.match(r"\| `([a-z_]+)` \|", row)[1] for row in rows]  # type: ignore[index]
    assert sorted(documented) == sorted(REQUEST_REASONS)


def test_rejections_and_failures_are_known_reasons() -> None:
    assert set(REJECTED.values()) <= set(REQUEST_REASONS)
    assert set(REQUEST_REASONS) >= FAILURES and "ok" not in FAILURES


def test_dashboard_and_alerts_count_exactly_the_failures() -> None:
    exprs = [r["expr"] for g in RULES["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]
    matched = [set(m.split("|")) for e in exprs for m in _REASON_MATCHER.findall(e)]
    assert len(matched) >= 5  # the four burn-rate expressions and the error ratio
    assert all(m == FAILURES for m in matched)
