"""The HTML of `reslice ui`: one page shell whose script fetches the JSON endpoints of
launcher/ui/server.py and draws them (the tables as DOM, the charts with plotly.js, served from the
`plotly` package's own copy: no CDN). A run's page polls its endpoint every POLL_MS, so a running run
updates without a reload. Called by launcher/ui/server.py."""

from __future__ import annotations

import html
import json

POLL_MS = 1500

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.3em;margin:.2em 0} h2{font-size:1.05em;margin:1.2em 0 .4em}
table{border-collapse:collapse;font-size:.85em} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f3f3f3} .error{color:#a00;font-weight:bold} .muted{color:#777}
.state-running{color:#06c} .state-finished{color:#080} .state-failed{color:#a00}
.grid{display:flex;flex-wrap:wrap;gap:1.5em} .chart{width:760px;height:380px}
"""

# The script: tiny helpers, then one renderer per page. Everything is built with textContent (no
# innerHTML of data): run names and reasons come from the cluster.
SCRIPT = r"""
const POLL_MS = __POLL__;
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(k ?? ""));
  return e;
}
function table(id, cols, rows) {
  const t = el("table", {id});
  t.append(el("thead", {}, el("tr", {}, ...cols.map(c => el("th", {}, c)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, ...r.map(c => el("td", {}, c))));
  t.append(body);
  return t;
}
const pct = x => x == null ? "-" : (100 * x).toFixed(1) + "%";
// A time as the command line writes it (launcher/report/view.py `_clock`): 24-hour HH:MM:SS in the
// local time zone, never the browser's own 12-hour format.
const hms = d => [d.getHours(), d.getMinutes(), d.getSeconds()].map(n => String(n).padStart(2, "0")).join(":");
const clock = t => t ? hms(new Date(t * 1000)) : "-";
function age(s) {
  if (s == null) return "-";
  if (s < 120) return Math.round(s) + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return (s / 3600).toFixed(1) + "h";
}
const restarts = r => Object.entries(r || {}).map(([k, v]) => k.replaceAll("_", " ") + " " + v).join(", ") || "none";
async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  const body = await r.json().catch(() => ({error: "HTTP " + r.status}));
  return body;
}
function show(id, node) { document.getElementById(id).replaceChildren(node); }
function problem(msg) {
  document.getElementById("problem").textContent = msg || "";
  // When the data came: a page that stopped updating says so by its clock.
  if (!msg) document.getElementById("updated").textContent = " · updated " + hms(new Date());
}

async function runsPage() {
  const d = await getJSON("api/runs");
  if (d.error) { problem(d.error); return; }
  problem("");
  document.getElementById("title").textContent = "runs in " + d.namespace;
  const rows = d.runs.map(r => [
    el("a", {href: "run/" + encodeURIComponent(r.run)}, r.run),
    el("span", {class: "state-" + r.state.toLowerCase()}, r.state), r.shape, r.requested, String(r.segments),
    r.step == null ? "-" : r.step + (r.total_steps ? " / " + r.total_steps : ""),
    pct(r.goodput), restarts(r.restarts), age(r.age_s),
    r.error ? el("span", {class: "error"}, r.error) : r.reason]);
  show("runs", table("runs-table", ["run", "state", "shape now", "requested", "segments", "step",
    "goodput", "restarts by cause", "age", "reason"], rows));
  const sweeps = el("p", {}, d.sweeps.length ? "sweeps: " : "");
  d.sweeps.forEach((name, k) => sweeps.append(k ? ", " : "", el("a", {href: "sweep/" + encodeURIComponent(name)}, name)));
  show("sweeps", sweeps);
}

async function sweepPage(name) {
  const d = await getJSON("api/sweep/" + encodeURIComponent(name));
  if (d.error) { problem(d.error); return; }
  problem("");
  document.getElementById("title").textContent = `ragged-buffer sweep ${d.sweep}: ${d.title}`;
  document.getElementById("summary").textContent = d.recommendation.message;
  const num = (x, f) => x == null ? "-" : f(x);
  const rows = d.rows.map(r => [r.label, num(r.required_factor_max ?? r.buffer_rows, String),
    num(r.dropped_fraction, x => (100 * x).toFixed(3) + "%"), num(r.worst_layer_dropped_fraction, x => (100 * x).toFixed(3) + "%"),
    num(r.max_load_mean, x => x.toFixed(3)), num(r.step_time_median_s, x => (1e3 * x).toFixed(1)),
    num(r.tokens_per_sec, x => Math.round(x).toLocaleString()), num(r.loss_final, x => x.toFixed(4)),
    r.recommended ? "◀ recommended" : (r.finished ? "" : `${r.state}: ${r.reason}`)]);
  show("sweep", table("sweep-table", ["factor", "buffer rows / required f", "dropped", "worst layer",
    "load/bal mean", "step ms", "tokens/s", "loss final", ""], rows));
  // The factors as categories: few, unevenly spaced, and dropless has no number (as sweep.png).
  const x = d.rows.map(r => r.label);
  Plotly.react("sweep-chart", [
    {x, y: d.rows.map(r => r.dropped_fraction == null ? null : 100 * r.dropped_fraction), name: "dropped %", mode: "lines+markers"},
    {x, y: d.rows.map(r => r.worst_layer_dropped_fraction == null ? null : 100 * r.worst_layer_dropped_fraction), name: "worst layer dropped %", mode: "lines+markers"},
    {x, y: d.rows.map(r => r.step_time_median_s == null ? null : 1e3 * r.step_time_median_s), name: "step ms", mode: "lines+markers", yaxis: "y2"},
  ], {xaxis: {title: {text: "buffer factor"}, type: "category"}, yaxis: {title: {text: "dropped %"}},
      yaxis2: {title: {text: "step ms"}, overlaying: "y", side: "right"}, margin: {t: 20},
      legend: {x: 1.12}}, {displayModeBar: false});
}

const COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"];
function lossChart(d) {
  const traces = [], shapes = [];
  d.loss.forEach((s, k) => {
    const c = COLOURS[s.segment % COLOURS.length];
    const seg = d.segments.find(x => x.index === s.segment);
    const label = seg ? `seg ${s.segment}: ${seg.shape}, ${seg.devices} dev, ${seg.micro_batch}×${seg.grad_accum}` : `seg ${s.segment}`;
    traces.push({x: s.loss.map(p => p[0]), y: s.loss.map(p => p[1]), name: label, mode: "lines+markers",
                 marker: {size: 4, color: c}, line: {color: c, width: 1}});
    for (const [split, pts] of Object.entries(s.eval))
      traces.push({x: pts.map(p => p[0]), y: pts.map(p => p[1]), name: `eval ${split} (seg ${s.segment})`,
                   mode: "markers", marker: {size: 9, symbol: "diamond", color: c}});
    const steps = s.loss.map(p => p[0]);
    if (steps.length) shapes.push({type: "rect", xref: "x", yref: "paper", y0: 0, y1: 1,
      x0: Math.min(...steps) - 0.5, x1: Math.max(...steps) + 0.5, fillcolor: c, opacity: 0.08, line: {width: 0}});
  });
  Plotly.react("loss", traces, {title: {text: "loss across segments (one step axis)"}, shapes,
    xaxis: {title: {text: "step"}}, yaxis: {title: {text: "loss"}}, margin: {t: 40, r: 10},
    legend: {font: {size: 10}}}, {displayModeBar: false, staticPlot: false});
}
// The colours of `reslice report`'s timeline.png (launcher/report/plots.py), category by category.
const BADPUT_COLOURS = {productive: "#2ca02c", scheduling: "#ff7f0e", startup: "#7f7f7f", compilation: "#8c564b",
  restore: "#17becf", data_loading: "#bcbd22", recomputed: "#d62728", checkpointing: "#9467bd", evaluation: "#e377c2"};
function badputChart(d) {
  const traces = d.badput.map(b => ({type: "bar", orientation: "h", name: b.label, y: ["run"],
    x: [b.seconds], marker: {color: BADPUT_COLOURS[b.name] || "#999"}}));
  Plotly.react("goodput-chart", traces, {barmode: "stack", height: 240, margin: {t: 30, l: 40, r: 10, b: 30},
    title: {text: `goodput ${pct(d.goodput)} of ${d.wall_s.toFixed(0)} s`},
    legend: {orientation: "h", font: {size: 9}, traceorder: "normal"}}, {displayModeBar: false});
}
async function runPage(name) {
  const d = await getJSON("api/run/" + encodeURIComponent(name));
  if (d.error) { problem(d.error); return; }
  problem("");
  document.getElementById("title").textContent = `${d.run}: ${d.state}`;
  const committed = d.latest_committed_step == null ? "no committed checkpoint yet" : "latest committed step " + d.latest_committed_step;
  document.getElementById("summary").textContent =
    `${d.reason} — step ${d.latest_step ?? "-"} of ${d.total_steps ?? "?"}; ${committed}; global batch ${d.global_batch}; ` +
    `restarts: ${restarts(d.restarts)}` + (d.waiting ? `; waiting (${d.waiting.wait}): ${d.waiting.reason}` : "");
  show("segments", table("segments-table",
    ["#", "shape", "devices", "micro-batch × accum", "steps", "start", "end", "goodput", "state source",
     "steps recomputed", "started because", "ended because"],
    d.segments.map(s => [String(s.index), s.shape, String(s.devices), `${s.micro_batch} × ${s.grad_accum}`,
      s.steps[0] == null ? "-" : `${s.steps[0]}–${s.steps[1]}`, clock(s.start), s.live ? "-" : clock(s.end),
      pct(s.goodput), s.state_source ?? "-", String(s.recomputed_steps), s.started_because ?? "",
      s.end_reason ?? (s.live ? "live" : "")])));
  lossChart(d);
  badputChart(d);
  show("goodput", table("goodput-table", ["time", "seconds", "share"],
    d.badput.map(b => [b.label, b.seconds.toFixed(1), d.wall_s ? pct(b.seconds / d.wall_s) : "-"])));
  show("timeline", table("timeline-table", ["time", "kind", "what"],
    d.timeline.map(e => [clock(e.time), e.action && e.action !== e.kind ? `${e.kind} ${e.action}` : e.kind, e.text])));
  const w = d.world;
  const facts = el("p", {}, `segment ${w.segment ?? "-"} on ${w.shape ?? "-"} (${w.restart_mode}); ` +
    `slices: ${w.slices.join(", ") || "-"}; node pools: ${w.nodepools.join(", ") || w.pool || "-"}` +
    (w.joining.length ? `; joining: ${w.joining.join(", ")}` : "") + (w.lost.length ? `; lost: ${w.lost.join(", ")}` : ""));
  const pods = table("pods-table", ["pod", "node", "phase", "created", "restarts"],
    w.pods.map(p => [p.name, p.node ?? "-", p.phase ?? "-", p.created ? clock(Date.parse(p.created) / 1000) : "-", String(p.restarts)]));
  const src = table("state-source-table", ["segment", "state source", "resumed at step"],
    w.state_source.map(s => [String(s.segment), s.state_source ?? "-", s.start_step == null ? "-" : String(s.start_step)]));
  const box = el("div", {}, facts, pods, el("p", {}), src);
  show("world", box);
  document.body.dataset.updated = String(d.now);
}
async function poll(fn) {
  try { await fn(); } catch (e) { problem("the server cannot be reached: " + e); }
  setTimeout(() => poll(fn), POLL_MS);
}
"""


def _shell(title: str, body: str, start: str, base: str, charts: bool) -> str:
    # Only a run's page draws charts: the runs page does without plotly.js (its size:
    # docs/measurements.md, "The web page at 50 runs").
    plotly = f'<script src="{base}static/plotly.min.js"></script>' if charts else ""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)} · reslice</title>
<base href="{base}"><style>{STYLE}</style>
{plotly}
<script>{SCRIPT.replace("__POLL__", str(POLL_MS))}</script></head>
<body><p class="muted"><a href="{base}">runs</a> · reslice ui (read-only)<span id="updated"></span></p>
<h1 id="title">{html.escape(title)}</h1><p id="problem" class="error"></p>
{body}
<script>poll(() => {start});</script></body></html>"""


def runs_html() -> str:
    return _shell("runs", '<div id="runs"></div><div id="sweeps"></div>', "runsPage()", "/", charts=False)


def run_html(name: str) -> str:
    body = """<p id="summary"></p>
<h2>segments</h2><div id="segments"></div>
<div class="grid"><div><h2>loss</h2><div id="loss" class="chart"></div></div>
<div><h2>goodput</h2><div id="goodput-chart" style="width:520px"></div><div id="goodput"></div></div></div>
<h2>the current world</h2><div id="world"></div>
<h2>disruptions and decisions</h2><div id="timeline"></div>"""
    # json.dumps: the name as a JS string literal; the </ escape keeps it from closing the script.
    literal = json.dumps(name).replace("</", "<\\/")
    return _shell(name, body, f"runPage({literal})", "/", charts=True)


def sweep_html(name: str) -> str:
    body = """<p id="summary"></p><div id="sweep"></div><div id="sweep-chart" class="chart"></div>"""
    literal = json.dumps(name).replace("</", "<\\/")
    return _shell(name, body, f"sweepPage({literal})", "/", charts=True)
