"""The report page's charts over the trace's clock (part of :mod:`replay.html`'s script).

From each run's ``timeline`` (:mod:`replay.timeline`): line charts with one line per run,
the window's middle on the x axis in seconds of the trace: arrival rate, requests in flight
and errors over all requests; per class TTFT P95 (solid) and P50 (dashed), mean TPOT, SLO
attainment and output throughput. Per class and run, stacked bars of each backend's share of
the window's requests and tokens. A chart none of whose lines has a value is not drawn; a
drawn one is an ``svg.chart`` whose ``g.series`` each hold a line, a dot or bars.
"""

CHARTS = """(function () {
  const W = 460, H = 230, L = 56, R = 12, T = 12, B = 30, LINE = 14;
  const BACKEND_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                          "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  const timed = report.runs.map((r, i) => ({label: r.policy || "target", t: r.timeline,
                                           color: COLORS[i % COLORS.length]}))
    .filter((r) => r.t && r.t.starts_s.length);
  const gone = (id) => {
    const s = document.getElementById(id);
    if (s) s.remove();
    const a = document.querySelector(`nav a[href="#${id}"]`);
    if (a) a.remove();
  };
  if (!timed.length) { gone("timeline"); document.getElementById("backend-plots").remove();
                       return; }
  const mid = (t) => t.starts_s.map((s) => s + t.window_s / 2);
  // one time axis for every chart: the longest run's windows
  const XMAX = Math.max(...timed.map((r) => r.t.starts_s[r.t.starts_s.length - 1] +
                                              r.t.window_s));
  function frame(box, title, series, kind) {
    const fig = document.createElement("figure");
    node("figcaption", title, fig);
    const height = H + LINE * series.length;
    const svg = el("svg", {width: W, height: height, viewBox: `0 0 ${W} ${height}`,
                           class: "chart " + kind, "data-chart": title,
                           "data-series": series.length}, fig);
    box.appendChild(fig);
    return svg;
  }
  function axes(svg, ymax, yunit) {
    const xmax = XMAX;
    const x = (v) => L + (W - L - R) * v / xmax;
    const y = (v) => T + (H - T - B) * (1 - v / ymax);
    el("line", {x1: L, y1: y(0), x2: W - R, y2: y(0), stroke: "#888"}, svg);
    el("line", {x1: L, y1: y(0), x2: L, y2: T, stroke: "#888"}, svg);
    for (const f of [0, 0.5, 1]) {
      el("text", {x: L - 6, y: y(f * ymax) + 4, "text-anchor": "end", "font-size": 11}, svg)
        .textContent = tick(f * ymax) + yunit;
      el("text", {x: x(f * xmax), y: y(0) + 14, "font-size": 11,
                  "text-anchor": f === 0 ? "start" : f === 1 ? "end" : "middle"}, svg)
        .textContent = tick(f * xmax) + " s";
    }
    return [x, y];
  }
  function lines(box, title, yunit, series) {
    const drawn = series.filter((s) => s.ys.some((v) => v !== null && v !== undefined));
    if (!drawn.length) return;
    const svg = frame(box, title, drawn, "line");
    let ymax = 0;
    for (const s of drawn) {
      for (const v of s.ys) if (v !== null && v !== undefined) ymax = Math.max(ymax, v);
    }
    const [x, y] = axes(svg, ymax || 1, yunit);
    drawn.forEach((s, i) => {
      const n = s.ys.filter((v) => v !== null && v !== undefined).length;
      const g = el("g", {class: "series", "data-run": s.label, "data-points": n}, svg);
      let seg = [];
      const flush = () => {
        if (seg.length === 1) {
          el("circle", {cx: seg[0][0], cy: seg[0][1], r: 2.5, fill: s.color}, g);
        } else if (seg.length) {
          el("polyline", {points: seg.map((p) => p.join(",")).join(" "), fill: "none",
                          stroke: s.color, "stroke-width": 1.5,
                          "stroke-dasharray": s.dash || "none"}, g);
        }
        seg = [];
      };
      s.xs.forEach((xv, k) => {
        const v = s.ys[k];
        if (v === null || v === undefined) flush();
        else seg.push([x(xv).toFixed(1), y(v).toFixed(1)]);
      });
      flush();
      el("text", {x: L, y: H + LINE * i + 4, "font-size": 11, fill: s.color}, g)
        .textContent = s.label;
    });
  }
  function shares(box, title, t, backends, counts) {
    const drawn = backends.filter((b) => counts[b].some((v) => v > 0));
    if (!drawn.length) return;
    const svg = frame(box, title, drawn, "bars");
    const starts = t.starts_s, width = t.window_s;
    const [x, y] = axes(svg, 100, "%");
    const totals = starts.map((_, j) => drawn.reduce((a, b) => a + counts[b][j], 0));
    const base = starts.map(() => 0);
    drawn.forEach((b, i) => {
      const color = BACKEND_COLORS[backends.indexOf(b) % BACKEND_COLORS.length];
      const g = el("g", {class: "series", "data-backend": b}, svg);
      starts.forEach((start, j) => {
        if (!totals[j] || !counts[b][j]) return;
        const share = 100 * counts[b][j] / totals[j];
        el("rect", {x: x(start), y: y(base[j] + share),
                    width: Math.max(x(start + width) - x(start) - 1, 1),
                    height: y(base[j]) - y(base[j] + share), fill: color}, g);
        base[j] += share;
      });
      el("text", {x: L, y: H + LINE * i + 4, "font-size": 11, fill: color}, g).textContent = b;
    });
  }
  const box = document.getElementById("timeline-plots");
  const series = (pick, dash) => timed.map((r) => ({label: r.label + (dash ? " P50" : ""),
    xs: mid(r.t), ys: pick(r.t), color: r.color, dash: dash}));
  const all = (key) => (t) => (t.groups.all || {})[key] || [];
  lines(box, "Arrival rate (requests/s sent), all requests", "", series(all("rate")));
  lines(box, "In flight (mean requests), all requests", "", series(all("inflight")));
  lines(box, "Errors (requests per window), all requests", "", series(all("errors")));
  const classes = [...new Set(timed.flatMap((r) => Object.keys(r.t.groups)))]
    .filter((g) => g !== "all").sort();
  for (const c of classes) {
    const of = (key) => (t) => (t.groups[c] || {})[key] || [];
    lines(box, `TTFT P95 (solid) and P50 (dashed), class ${c}`, " ms",
          [...series(of("p95_ttft_ms")), ...series(of("p50_ttft_ms"), "4 3")]);
    lines(box, `Mean TPOT, class ${c}`, " ms", series(of("mean_tpot_ms")));
    lines(box, `SLO attainment, class ${c}`, "%",
          series((t) => of("goodput")(t).map((v) => v === null ? null : 100 * v)));
    // per window of the replay (the run's last one, cut short, reads low)
    lines(box, `Output throughput (tokens/s), class ${c}`, "", series((t) =>
      of("out_tokens")(t).map((v) => v * t.speed / t.window_s)));
  }
  const bbox = document.getElementById("backend-plots");
  const names = [...new Set(timed.flatMap((r) => Object.keys(r.t.backends || {})))].sort();
  for (const c of classes) {
    for (const r of timed) {
      for (const [k, what] of [["requests", "requests"], ["tokens", "tokens"]]) {
        const counts = {};
        for (const b of names) {
          counts[b] = (((r.t.backends || {})[b] || {})[c] || {})[k] || r.t.starts_s.map(() => 0);
        }
        shares(bbox, `Share of class ${c} ${what} per backend, ${r.label}`, r.t, names, counts);
      }
    }
  }
})();"""
