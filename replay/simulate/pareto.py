"""The sweep's Pareto chart: P95 TTFT of interactive requests against batch output throughput.

One point per run (a policy at one grid setting). A point is on the front when no other run
has both a lower P95 TTFT and a higher batch throughput. When the trace has no batch class
the x axis is the whole run's output throughput, and without an interactive class the y axis
is the whole run's P95 TTFT (the axis titles say which). The points are computed here, into
``report.json`` (``pareto``); the page's script only draws them: an inline SVG, each point a
``g.point`` with its figures as data attributes and a hover title; clicking a legend entry
hides or shows that policy's points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _axis(run: Mapping[str, Any], cls: str, key: str) -> tuple[float | None, bool]:
    group = run["by_class"].get(cls)
    if group is not None:
        return group.get(key), True
    return run["overall"].get(key), False


def pareto_points(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One point per run, ``front`` true where no other run beats it on both axes."""
    points: list[dict[str, Any]] = []
    for run in runs:
        x, x_batch = _axis(run, "batch", "output_throughput")
        y, y_interactive = _axis(run, "interactive", "p95_ttft_ms")
        label = str(run["policy"])
        points.append(
            {
                "run": label,
                "policy": label.split(" [", 1)[0],
                "setting": run.get("simulation", {}).get("setting", {}),
                "batch_output_throughput": x,
                "p95_ttft_ms": y,
                "x_is_batch": x_batch,
                "y_is_interactive": y_interactive,
            }
        )
    for p in points:
        x, y = p["batch_output_throughput"], p["p95_ttft_ms"]
        p["front"] = (
            x is not None
            and y is not None
            and not any(
                q is not p
                and q["batch_output_throughput"] is not None
                and q["p95_ttft_ms"] is not None
                and q["batch_output_throughput"] >= x
                and q["p95_ttft_ms"] <= y
                and (q["batch_output_throughput"] > x or q["p95_ttft_ms"] < y)
                for q in points
            )
        )
    return points


_CHART = """<h2>Pareto: P95 TTFT against batch output throughput</h2>
<div id="pareto"></div>
<script>
"use strict";
(function () {
  const pts = (report.pareto || []).filter(
    (p) => p.batch_output_throughput !== null && p.p95_ttft_ms !== null);
  const box = document.getElementById("pareto");
  const W = 640, H = 420, L = 70, R = 200, T = 16, B = 48;
  const svg = el("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`, id: "pareto-chart"}, box);
  const xs = pts.map((p) => p.batch_output_throughput), ys = pts.map((p) => p.p95_ttft_ms);
  const x0 = Math.min(...xs, 0), x1 = Math.max(...xs, 1), y0 = 0, y1 = Math.max(...ys, 1);
  const x = (v) => L + (W - L - R) * (v - x0) / ((x1 - x0) || 1);
  const y = (v) => T + (H - T - B) * (1 - (v - y0) / ((y1 - y0) || 1));
  el("line", {x1: L, y1: y(y0), x2: W - R, y2: y(y0), stroke: "#888"}, svg);
  el("line", {x1: L, y1: y(y0), x2: L, y2: T, stroke: "#888"}, svg);
  const batch = pts.every((p) => p.x_is_batch), inter = pts.every((p) => p.y_is_interactive);
  el("text", {x: (L + W - R) / 2, y: H - 8, "text-anchor": "middle", "font-size": 12}, svg)
    .textContent = (batch ? "batch" : "all requests'") + " output throughput (tokens/s)";
  el("text", {x: 14, y: (T + H - B) / 2, "font-size": 12, "text-anchor": "middle",
              transform: `rotate(-90 14 ${(T + H - B) / 2})`}, svg)
    .textContent = "P95 TTFT (ms), " + (inter ? "interactive" : "all requests");
  for (const f of [0, 0.5, 1]) {
    el("text", {x: x(x0 + f * (x1 - x0)), y: y(y0) + 16, "text-anchor": "middle",
                "font-size": 11}, svg).textContent = (x0 + f * (x1 - x0)).toFixed(0);
    el("text", {x: L - 6, y: y(y0 + f * (y1 - y0)) + 4, "text-anchor": "end",
                "font-size": 11}, svg).textContent = (y0 + f * (y1 - y0)).toFixed(0);
  }
  const front = pts.filter((p) => p.front)
    .sort((a, b) => a.batch_output_throughput - b.batch_output_throughput);
  if (front.length > 1) {
    el("polyline", {points: front.map((p) =>
      `${x(p.batch_output_throughput).toFixed(1)},${y(p.p95_ttft_ms).toFixed(1)}`).join(" "),
      fill: "none", stroke: "#999", "stroke-dasharray": "4 3", class: "front"}, svg);
  }
  const policies = [...new Set(pts.map((p) => p.policy))];
  for (const p of pts) {
    const color = COLORS[policies.indexOf(p.policy) % COLORS.length];
    const g = el("g", {class: "point", "data-run": p.run, "data-policy": p.policy,
                       "data-x": p.batch_output_throughput.toFixed(2),
                       "data-y": p.p95_ttft_ms.toFixed(2), "data-front": p.front}, svg);
    el("circle", {cx: x(p.batch_output_throughput), cy: y(p.p95_ttft_ms),
                  r: p.front ? 6 : 4, fill: color, stroke: p.front ? "#000" : "none"}, g);
    el("title", {}, g).textContent = `${p.run}: P95 TTFT ${p.p95_ttft_ms.toFixed(1)} ms, ` +
      `${p.batch_output_throughput.toFixed(1)} tokens/s` + (p.front ? " (on the front)" : "");
  }
  policies.forEach((name, i) => {
    const item = el("g", {class: "legend", "data-policy": name, cursor: "pointer"}, svg);
    el("rect", {x: W - R + 16, y: T + 18 * i, width: 12, height: 12,
                fill: COLORS[i % COLORS.length]}, item);
    el("text", {x: W - R + 34, y: T + 18 * i + 11, "font-size": 12}, item).textContent = name;
    item.addEventListener("click", () => {
      const hidden = item.dataset.hidden !== "true";
      item.dataset.hidden = String(hidden);
      item.setAttribute("opacity", hidden ? 0.4 : 1);
      for (const g of svg.querySelectorAll(`g.point[data-policy="${CSS.escape(name)}"]`)) {
        g.setAttribute("visibility", hidden ? "hidden" : "visible");
      }
    });
  });
  document.body.dataset.pareto = String(pts.length);
})();
</script>"""


def render_pareto(report: Mapping[str, Any]) -> str:
    """The chart's markup and script for the report page; empty without a sweep."""
    return _CHART if report.get("pareto") else ""
