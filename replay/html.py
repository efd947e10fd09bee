"""``--html``: a self-contained report page (inline data, script and SVG; no network fetches).

The page's script draws one CDF plot per latency (TTFT, E2E) and group (all requests, each
class), one curve per run. Every curve's element carries the report's own figures as data
attributes (``data-mean-ms``, ``data-p95-ms``, ``data-n``) and as a text label, so a browser
check can compare what the page shows with ``report.json``. When drawing is complete the
script sets ``data-rendered`` on ``<body>``; an uncaught error sets ``data-error`` instead.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

import orjson

from replay.report import RunReport

Samples = dict[str, dict[str, dict[str, list[float]]]]
"""run label -> group ("all" or a class) -> metric ("ttft", "e2e") -> sorted samples (ms)."""

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Turnout replay report</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:8px 0 24px}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0}
figcaption{font-weight:600;margin-bottom:4px}
</style></head>
<body>
<h1>Turnout replay report</h1>
<p>__SUMMARY__</p>
<div id="tables"></div>
<h2>Latency CDFs</h2>
<div class="plots" id="plots"></div>
<script type="application/json" id="report">__REPORT__</script>
<script type="application/json" id="samples">__SAMPLES__</script>
<script>
"use strict";
window.addEventListener("error", (e) => { document.body.dataset.error = String(e.message); });
const report = JSON.parse(document.getElementById("report").textContent);
const samples = JSON.parse(document.getElementById("samples").textContent);
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
const W = 460, PLOT_H = 220, L = 56, R = 12, T = 12, AXIS = 36, LINE = 14;
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) { return v === null || v === undefined ? "-" : v.toFixed(1); }
function runs() {
  const out = [];
  for (const run of report.runs) {
    const label = run.policy || "target";
    out.push({label, groups: Object.assign({all: run.overall}, run.by_class)});
    if (run.shadow) {
      out.push({label: label + " (shadow)",
                groups: Object.assign({all: run.shadow.overall}, run.shadow.by_class)});
    }
  }
  return out;
}
function plot(metric, group, series) {
  const key = metric === "ttft" ? "ttft" : "e2el";
  const fig = document.createElement("figure");
  const cap = document.createElement("figcaption");
  cap.textContent = (metric === "ttft" ? "TTFT" : "E2E latency") + " CDF, " +
    (group === "all" ? "all requests" : "class " + group);
  fig.appendChild(cap);
  const H = T + PLOT_H + AXIS + LINE * series.length;
  const svg = el("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`,
                         "data-metric": metric, "data-group": group});
  fig.appendChild(svg);
  let max = 0;
  for (const s of series) for (const v of s.values) max = Math.max(max, v);
  max = max > 0 ? max : 1;
  const x = (v) => L + (W - L - R) * v / max;
  const y = (p) => T + PLOT_H * (1 - p);
  el("line", {x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: "#888"}, svg);
  el("line", {x1: L, y1: y(0), x2: L, y2: y(1), stroke: "#888"}, svg);
  for (const p of [0, 0.5, 0.95, 1]) {
    el("text", {x: L - 6, y: y(p) + 4, "text-anchor": "end", "font-size": 11}, svg)
      .textContent = p.toFixed(2);
  }
  for (const [f, anchor] of [[0, "start"], [0.5, "middle"], [1, "end"]]) {
    el("text", {x: x(f * max), y: y(0) + 14, "text-anchor": anchor, "font-size": 11}, svg)
      .textContent = fmt(f * max) + " ms";
  }
  series.forEach((s, i) => {
    const n = s.values.length;
    const pts = s.values.map(
      (v, k) => `${x(v).toFixed(1)},${y(n > 1 ? k / (n - 1) : 1).toFixed(1)}`);
    const g = el("g", {class: "curve", "data-run": s.label, "data-n": s.metrics.completed,
                       "data-mean-ms": fmt(s.metrics["mean_" + key + "_ms"]),
                       "data-p95-ms": fmt(s.metrics["p95_" + key + "_ms"])}, svg);
    const color = COLORS[i % COLORS.length];
    if (n > 0) {
      el("polyline", {points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 2}, g);
    }
    el("text", {x: L, y: y(0) + AXIS + LINE * i, "font-size": 11, fill: color, class: "label"}, g)
      .textContent = `${s.label}: mean ${g.dataset.meanMs} ms, ` +
        `P95 ${g.dataset.p95Ms} ms (n=${s.metrics.completed})`;
  });
  document.getElementById("plots").appendChild(fig);
}
function table(title, cols) {
  const rows = [["Successful requests", (m) => `${m.completed} / ${m.completed + m.failed}`],
    ["Output throughput (tokens/s)", (m) => fmt(m.output_throughput)],
    ["Mean TTFT (ms)", (m) => fmt(m.mean_ttft_ms)], ["P95 TTFT (ms)", (m) => fmt(m.p95_ttft_ms)],
    ["Mean ITL (ms)", (m) => fmt(m.mean_itl_ms)], ["Mean TPOT (ms)", (m) => fmt(m.mean_tpot_ms)],
    ["Mean E2E (ms)", (m) => fmt(m.mean_e2el_ms)], ["P95 E2E (ms)", (m) => fmt(m.p95_e2el_ms)],
    ["Send lag P99 (ms)", (m) => fmt(m.send_lag_p99_ms)]];
  const h = document.createElement("h3");
  h.textContent = title;
  const t = document.createElement("table");
  const head = t.insertRow();
  for (const c of ["Metric", ...cols.map((c) => c[0])]) {
    const th = document.createElement("th"); th.textContent = c; head.appendChild(th);
  }
  for (const [label, f] of rows) {
    const r = t.insertRow();
    r.insertCell().textContent = label;
    for (const c of cols) r.insertCell().textContent = f(c[1]);
  }
  const box = document.getElementById("tables");
  box.appendChild(h); box.appendChild(t);
}
const all = runs();
const groups = ["all"];
for (const r of all) for (const g of Object.keys(r.groups)) if (!groups.includes(g)) groups.push(g);
for (const group of groups) {
  const cols = all.filter((r) => r.groups[group]).map((r) => [r.label, r.groups[group]]);
  table(group === "all" ? "All requests" : "Class " + group, cols);
  for (const metric of ["ttft", "e2e"]) {
    plot(metric, group, all.filter((r) => r.groups[group]).map((r) => ({
      label: r.label, metrics: r.groups[group],
      values: ((samples[r.label] || {})[group] || {})[metric] || []})));
  }
}
document.body.dataset.rendered = String(document.querySelectorAll("svg g.curve").length);
</script>
__EXTRA__
</body></html>
"""


def _label(policy: str | None) -> str:
    return policy or "target"


def collect_samples(runs: list[RunReport]) -> Samples:
    """CDF sample points for every run (and shadow), group and metric."""
    out: Samples = {}
    for run in runs:
        sets = [(_label(run.policy), run.overall, run.by_class)]
        if run.shadow_target is not None:
            sets.append((_label(run.policy) + " (shadow)", run.shadow, run.shadow_by_class))
        for label, overall, by_class in sets:
            groups = {"all": overall, **by_class}
            out[label] = {
                g: {"ttft": acc.samples("ttft"), "e2e": acc.samples("e2e")}
                for g, acc in groups.items()
            }
    return out


def _json(doc: object) -> str:
    # "</" would end the <script> element early; JSON allows the escaped form.
    return orjson.dumps(doc).decode().replace("</", "<\\/")


def render_html(report: Mapping[str, Any], samples: Samples, *, extra: str = "") -> str:
    """The whole page as one string; ``extra`` is more of the page (trusted markup) after
    the plots, whose scripts may read ``report``."""
    merged = report.get("merged_from")
    if merged is not None:
        summary = "Merged from " + html.escape(", ".join(map(str, merged)))
    else:
        summary = (
            f"{html.escape(str(report['file']))} ({html.escape(str(report['format']))}) against "
            f"{html.escape(str(report['target']))}, {html.escape(str(report['mode']))} mode"
        )
    if report.get("simulated"):
        summary = "Simulated in virtual time: " + summary
    values = {
        "SUMMARY": summary,
        "REPORT": _json(report),
        "SAMPLES": _json(samples),
        "EXTRA": extra,
    }
    # one pass, so a marker inside the inserted data is never substituted again
    return re.sub(r"__(SUMMARY|REPORT|SAMPLES|EXTRA)__", lambda m: values[m.group(1)], _PAGE)
