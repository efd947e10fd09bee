"""``--html``: one self-contained report page (inline data, script and SVG; it fetches nothing).

The page holds the report JSON and draws everything from it, so it is complete with a single
run and the same for ``replay``, ``replay simulate``, ``replay merge`` and ``replay compare``:

- the verdict lines (:mod:`replay.compare`) above everything, then what was replayed, how
  fast and over which stretch, how the runs were ordered and kept out of each other's prefix
  caches;
- the comparison per candidate: each metric's change with its 95% interval, the A/A noise
  floor and the verdict; for live against simulated runs, the simulator's error per metric;
- the tables per class, then all requests (:mod:`replay.tables`, the terminal's, the best
  value of a row in bold);
- the runs over the trace's clock, what each backend served, the slowest requests and cost
  (:mod:`replay.charts`, :mod:`replay.views`);
- TTFT and E2E CDFs per group, one curve per run: each curve's element carries the report's
  own figures as data attributes (``data-mean-ms``, ``data-p95-ms``, ``data-n``) and as a
  label, so a browser check can compare what the page shows with ``report.json``.

Every chart is an ``svg.chart`` drawn only when it has data; when all are drawn the script
sets ``data-charts`` (their number) on ``<body>``; an uncaught error sets ``data-error``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

import orjson

from replay.charts import CHARTS
from replay.order import order_text
from replay.tables import header, metric_tables
from replay.views import tables

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Turnout replay report</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1400px}
table{border-collapse:collapse;margin:4px 0 20px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
td:first-child,th:first-child{text-align:left}
td.best{font-weight:700;background:#eef6ee} td.text{text-align:left}
td.better{color:#17692b;font-weight:600} td.worse{color:#a61b1b;font-weight:600}
.scroll{overflow-x:auto;max-width:100%}
.verdict{font-size:16px;font-weight:600;background:#f4f4f8;padding:8px 12px;margin:6px 0}
.plots{display:flex;flex-wrap:wrap;gap:16px}
figure{margin:0}
figcaption{font-weight:600;margin-bottom:4px;width:0;min-width:100%}
nav a{margin-right:12px} h2{margin-top:32px;border-bottom:1px solid #ddd}
.note{color:#555}
</style></head>
<body>
<h1>Turnout replay report</h1>
<div id="verdicts"></div>
<p id="summary">__SUMMARY__</p>
<p class="note">__ORDER__</p>
<nav>__NAV__</nav>
<section id="comparison"><h2>Comparison</h2><div id="comparison-tables"></div></section>
<section id="simulator"><h2>Simulated against live</h2><div id="simulator-tables"></div>
</section>
<section id="tables"><h2>Per class</h2><div id="metric-tables"></div></section>
<section id="timeline"><h2>Over the trace</h2><div class="plots" id="timeline-plots"></div>
</section>
<section id="backends"><h2>Backends</h2><div class="plots" id="backend-plots"></div>
<div id="backend-tables"></div></section>
<section id="slowest"><h2>Slowest requests</h2><div id="slowest-tables"></div></section>
<section id="cost"><h2>Cost</h2><div id="cost-tables"></div></section>
<section id="cdfs"><h2>Latency CDFs</h2><div class="plots" id="plots"></div></section>
<script type="application/json" id="report">__REPORT__</script>
<script type="application/json" id="views">__VIEWS__</script>
<script>
"use strict";
window.addEventListener("error", (e) => { document.body.dataset.error = String(e.message); });
const report = JSON.parse(document.getElementById("report").textContent);
const views = JSON.parse(document.getElementById("views").textContent);
const NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}
function node(tag, text, parent) {
  const e = document.createElement(tag);
  if (text !== null) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(v) { return v === null || v === undefined ? "-" : v.toFixed(1); }
// an axis label: 980, 5.8k, 12.5 (one style on every chart of the page)
const tick = (v) => Math.abs(v) >= 1000 ? (v / 1000).toLocaleString("en",
  {maximumFractionDigits: 1}) + "k" : v.toLocaleString("en",
  {maximumFractionDigits: Math.abs(v) >= 100 ? 0 : 1});
function table(boxId, t) {
  const box = document.getElementById(boxId);
  node("h3", t.title, box);
  const wrap = node("div", null, box);
  wrap.className = "scroll";
  const tab = node("table", null, wrap);
  const head = tab.insertRow();
  for (const c of t.head) node("th", c, head);
  t.rows.forEach((row, i) => {
    const r = tab.insertRow();
    row.forEach((c, k) => {
      const cell = r.insertCell();
      cell.textContent = c;
      if (k === t.best[i]) cell.className = "best";
      if (c === "better" || c === "worse") cell.className = c;
      if (k > 0 && !/^[-+\u2212\u00b10-9]/.test(c)) cell.classList.add("text");
    });
  });
}
function section(id, tables, boxId) {
  if (!tables.length) {
    document.getElementById(id).remove();
    document.querySelector(`nav a[href="#${id}"]`).remove();
    return;
  }
  for (const t of tables) table(boxId, t);
}
function runs() {
  const out = [];
  for (const run of report.runs) {
    const label = run.policy || "target";
    out.push({label, cdf: run.cdf || {},
              groups: Object.assign({all: run.overall}, run.by_class)});
    if (run.shadow) {
      out.push({label: label + " (shadow)", cdf: run.shadow.cdf || {},
                groups: Object.assign({all: run.shadow.overall}, run.shadow.by_class)});
    }
  }
  return out;
}
function plot(metric, group, series) {
  const key = metric === "ttft" ? "ttft" : "e2el";
  const W = 460, PLOT_H = 220, L = 56, R = 12, T = 12, AXIS = 36, LINE = 14;
  const fig = document.createElement("figure");
  const cap = node("figcaption", (metric === "ttft" ? "TTFT" : "E2E latency") + " CDF, " +
    (group === "all" ? "all requests" : "class " + group), fig);
  cap.dataset.group = group;
  const H = T + PLOT_H + AXIS + LINE * series.length;
  const svg = el("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, class: "chart cdf",
                         "data-metric": metric, "data-group": group,
                         "data-series": series.length}, fig);
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
      .textContent = tick(f * max) + " ms";
  }
  series.forEach((s, i) => {
    const n = s.values.length;
    const pts = s.values.map(
      (v, k) => `${x(v).toFixed(1)},${y(n > 1 ? k / (n - 1) : 1).toFixed(1)}`);
    const g = el("g", {class: "curve", "data-run": s.label, "data-n": s.metrics.completed,
                       "data-mean-ms": fmt(s.metrics["mean_" + key + "_ms"]),
                       "data-p95-ms": fmt(s.metrics["p95_" + key + "_ms"])}, svg);
    const color = COLORS[i % COLORS.length];
    el("polyline", {points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 2}, g);
    el("text", {x: L, y: y(0) + AXIS + LINE * i, "font-size": 11, fill: color, class: "label"}, g)
      .textContent = `${s.label}: mean ${g.dataset.meanMs} ms, ` +
        `P95 ${g.dataset.p95Ms} ms (n=${s.metrics.completed})`;
  });
  document.getElementById("plots").appendChild(fig);
}
for (const line of (report.comparison || {}).lines || []) {
  node("p", line, document.getElementById("verdicts")).className = "verdict";
}
section("comparison", views.comparison, "comparison-tables");
section("simulator", views.simulator, "simulator-tables");
section("tables", views.metrics, "metric-tables");
section("backends", views.backends, "backend-tables");
section("slowest", views.slowest.filter((t) => t.rows.length), "slowest-tables");
section("cost", views.cost, "cost-tables");
const all = runs();
const groups = ["all"];
for (const r of all) for (const g of Object.keys(r.groups)) if (!groups.includes(g)) groups.push(g);
for (const group of groups) {
  for (const metric of ["ttft", "e2e"]) {
    const series = all.filter((r) => r.groups[group] && ((r.cdf[group] || {})[metric] || [])
      .length).map((r) => ({label: r.label, metrics: r.groups[group],
                            values: r.cdf[group][metric]}));
    if (series.length) plot(metric, group, series);
  }
}
__CHARTS__
document.body.dataset.charts = String(document.querySelectorAll("svg.chart").length);
</script>
__EXTRA__
</body></html>
"""

_NAV = (
    ("comparison", "Comparison"),
    ("simulator", "Simulated against live"),
    ("tables", "Per class"),
    ("timeline", "Over the trace"),
    ("backends", "Backends"),
    ("slowest", "Slowest requests"),
    ("cost", "Cost"),
    ("cdfs", "Latency CDFs"),
)


def _json(doc: object) -> str:
    # "</" would end the <script> element early; JSON allows the escaped form.
    return orjson.dumps(doc).decode().replace("</", "<\\/")


def render_html(report: Mapping[str, Any], *, extra: str = "") -> str:
    """The whole page as one string; ``extra`` is more of the page (trusted markup) after
    the rest, whose scripts may read ``report`` and use ``el`` and ``COLORS``."""
    summary = html.escape(header(report))
    if report.get("simulated"):
        summary = "Simulated in virtual time: " + summary
    notes = []
    if report.get("order") and len(report["runs"]) > 1:
        notes.append("Order: " + order_text(report["order"]) + ".")
    if report.get("prefix_caches"):
        notes.append("Prefix caches: " + report["prefix_caches"]["handling"] + ".")
    views = {**tables(report), "metrics": [t.to_dict() for t in metric_tables(report)]}
    values = {
        "SUMMARY": summary,
        "ORDER": html.escape(" ".join(notes)),
        "NAV": "".join(f'<a href="#{k}">{html.escape(v)}</a>' for k, v in _NAV),
        "REPORT": _json(report),
        "VIEWS": _json(views),
        "CHARTS": CHARTS,
        "EXTRA": extra,
    }
    # one pass, so a marker inside the inserted data is never substituted again
    return re.sub(
        r"__(SUMMARY|ORDER|NAV|REPORT|VIEWS|CHARTS|EXTRA)__", lambda m: values[m.group(1)], _PAGE
    )
