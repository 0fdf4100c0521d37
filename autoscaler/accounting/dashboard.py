"""The read-only dashboard page ``coadapt up`` serves at ``/dashboard``.

The page itself holds no data and no secret: open it as ``/dashboard#token=<user token>`` (the
fragment never leaves the browser, so the token is in no server log). Its script reads the
token from the fragment, then drops the fragment from the address and from the session
history (``history.replaceState``: the token stays in the page's memory only, so a reload
needs the address ``coadapt dashboard`` prints again; what the browser recorded of the address
before the page ran, such as its own note of what was typed, is beyond a page's reach: a
private window keeps nothing), and calls the API with it like any client (``GET /v1/jobs``,
page after page, ``/v1/instances``, ``/v1/costs``, bearer authentication, user role), renders
the jobs (status, why, GPUs, batch, progress in samples and as a share of the declared
length, restarts), the fleet, the last events (``GET /v1/events``, newest first) and cost
over time, and refreshes every ``REFRESH_S`` seconds. Without a
valid token it shows the API's refusal and nothing else.

The cost chart is an inline SVG: a title, an x axis of the time since the first instance
started (minutes, or hours past two; the series is
:func:`~autoscaler.accounting.costs.cost_series_usd`), a y axis of the cumulative cost in
USD, both with round ticks and grid lines, and the line. The page scales to its viewport
(the chart by its ``viewBox``, wide tables scroll sideways in their box): readable at
1280x800 and on a 390 px phone.
After each refresh the page records on its ``<html>`` element whether it fits its
viewport's width (``data-fits="yes"``; what the browser tests read). ``coadapt dashboard``
prints the page's address with the token. The server sends the page with ``frame-ancestors
'none'`` and ``X-Frame-Options: DENY``: no other page may frame it (``tests/controller/
test_dashboard.py`` checks both in Chromium).
"""

from __future__ import annotations

from typing import Final

REFRESH_S: Final = 5
EVENTS_SHOWN: Final = 50
"""The dashboard's events table: the cluster's last this many events, newest first."""

PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>coadapt</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 1em auto; padding: 0 1em; color: #222;
       max-width: 1200px; }
h1 { font-size: 1.5em; margin: 0.2em 0; }
h2 { font-size: 1.15em; margin: 1em 0 0.3em; }
.scroll { overflow-x: auto; -webkit-overflow-scrolling: touch; }
table { border-collapse: collapse; margin: 0.3em 0 1em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left;
         white-space: nowrap; }
th { background: #f4f4f4; }
#error { color: #b00; font-weight: bold; }
#updated { color: #777; font-size: 0.9em; }
#cost-plot { width: 100%; max-width: 760px; height: auto; display: block; }
#cost-plot text { font: 12px system-ui, sans-serif; fill: #333; }
#cost-plot .title { font-size: 14px; font-weight: bold; }
#cost-plot .axis { stroke: #333; stroke-width: 1; }
#cost-plot .grid { stroke: #e4e4e4; stroke-width: 1; }
@media (max-width: 600px) {  /* the chart is drawn smaller: its text stays readable */
  #cost-plot text { font-size: 19px; }
  #cost-plot .title { font-size: 21px; }
}
</style>
</head>
<body>
<h1>coadapt</h1>
<p id="error"></p>
<p id="updated"></p>
<h2>Jobs</h2>
<div class="scroll"><table id="jobs"><thead><tr><th>job</th><th>status</th><th>why</th>
<th>GPUs</th><th>instances</th><th>batch</th><th>progress (samples)</th><th>done</th>
<th>restarts</th><th>retries</th></tr></thead><tbody></tbody></table></div>
<h2>Fleet</h2>
<div class="scroll"><table id="fleet"><thead><tr><th>instance</th><th>status</th>
<th>offering</th><th>GPUs</th><th>$/h</th></tr></thead><tbody></tbody></table></div>
<h2>Events</h2>
<div class="scroll"><table id="events"><thead><tr><th>time</th><th>event</th><th>about</th>
<th>what and why</th></tr></thead><tbody></tbody></table></div>
<h2>Cost</h2>
<p id="cost"></p>
<svg id="cost-plot" viewBox="0 0 640 280" preserveAspectRatio="xMidYMid meet" role="img"
     aria-labelledby="cost-plot-title"><title id="cost-plot-title">cumulative cost (USD) over
time</title></svg>
<script>
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
// The token stays in this page's memory only: out of the address bar and the history.
if (location.hash) { history.replaceState(null, "", location.pathname + location.search); }
function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
}
function fill(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  for (const values of rows) {
    const tr = document.createElement("tr");
    values.forEach((v) => cell(tr, String(v)));
    body.appendChild(tr);
  }
}
async function get(path) {
  const answer = await fetch(path, { headers: { Authorization: "Bearer " + token } });
  const data = await answer.json();
  if (!answer.ok) { throw new Error(answer.status + ": " + (data.error || "refused")); }
  return data;
}
const SVG_NS = "http://www.w3.org/2000/svg";
function svgEl(svg, name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) { el.setAttribute(k, String(v)); }
  if (text !== undefined) { el.textContent = text; }
  svg.appendChild(el);
  return el;
}
function niceStep(span, count) {
  const raw = Math.max(span, 1e-12) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}
function decimals(step) { return Math.max(0, -Math.floor(Math.log10(step) + 1e-9)); }
function plot(points) {
  const svg = document.getElementById("cost-plot");
  const title = document.getElementById("cost-plot-title");
  svg.replaceChildren(title);
  const W = 640, H = 280, L = 70, R = 18, T = 36, B = 50;
  svg_text(svg, W / 2, 20, "Cumulative cost (USD) over time", "title");
  const t0 = points.length ? points[0][0] : 0;
  const spanS = points.length ? Math.max(points[points.length - 1][0] - t0, 1) : 600;
  const hours = spanS >= 7200;
  const unit = hours ? 3600 : 60;
  const xMax = spanS / unit;
  const yMaxData = points.length ? Math.max(...points.map((p) => p[1])) : 0;
  const yStep = niceStep(yMaxData > 0 ? yMaxData : 0.01, 4);
  const yTop = Math.max(yStep, Math.ceil(yMaxData / yStep - 1e-9) * yStep);
  const xStep = niceStep(xMax, 6);
  const x = (v) => L + (W - L - R) * v / xMax;
  const y = (v) => H - B - (H - B - T) * v / yTop;
  for (let v = 0; v <= yTop + yStep / 1e6; v += yStep) {
    svgEl(svg, "line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid" });
    svgEl(svg, "line", { x1: L - 5, x2: L, y1: y(v), y2: y(v), class: "axis tick y-tick" });
    svg_text(svg, L - 8, y(v) + 4, v.toFixed(decimals(yStep)), "tick-label y-label", "end");
  }
  for (let v = 0; v <= xMax + xStep / 1e6; v += xStep) {
    svgEl(svg, "line", { x1: x(v), x2: x(v), y1: H - B, y2: H - B + 5, class: "axis tick x-tick" });
    svg_text(svg, x(v), H - B + 19, v.toFixed(decimals(xStep)), "tick-label x-label", "middle");
  }
  svgEl(svg, "line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axis x-axis" });
  svgEl(svg, "line", { x1: L, x2: L, y1: T, y2: H - B, class: "axis y-axis" });
  svg_text(svg, (L + W - R) / 2, H - 10,
    "time since the first instance started (" + (hours ? "hours" : "minutes") + ")",
    "axis-title", "middle");
  const yTitle = svg_text(svg, 16, (T + H - B) / 2, "cost (USD)", "axis-title", "middle");
  yTitle.setAttribute("transform", "rotate(-90 16 " + (T + H - B) / 2 + ")");
  if (points.length < 2) {
    svg_text(svg, (L + W - R) / 2, (T + H - B) / 2, "no cost yet", "empty", "middle");
    return;
  }
  svgEl(svg, "polyline", {
    points: points.map((p) => x((p[0] - t0) / unit) + "," + y(p[1])).join(" "),
    fill: "none", stroke: "#2a6", "stroke-width": 2.5, class: "cost-line",
  });
}
function svg_text(svg, px, py, text, cls, anchor) {
  return svgEl(svg, "text", { x: px, y: py, class: cls, "text-anchor": anchor || "middle" }, text);
}
function batchText(j) {
  if (!j.batch_size) { return "-"; }
  return j.batch_size + " (" + j.local_batch_size + "/GPU x " + j.accumulation_steps + ")";
}
function progressText(j) {
  if (j.progress_samples === null || j.progress_samples === undefined) { return "-"; }
  const of = j.target_samples ? " of " + j.target_samples : "";
  return j.progress_samples + of;
}
async function allJobs() {
  const jobs = [];
  let cursor = null;
  do {
    const page = await get("/v1/jobs?limit=500" +
      (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    jobs.push(...page.jobs);
    cursor = page.next_cursor;
  } while (cursor);
  return jobs;
}
async function refresh() {
  try {
    const [jobs, fleet, cost, story] = await Promise.all([allJobs(), get("/v1/instances"),
      get("/v1/costs"), get("/v1/events?limit=" + EVENTS_SHOWN)]);
    fill("jobs", jobs.map((j) => [
      j.name, j.status, j.reason || "-", j.gpus,
      Object.keys(j.assignment).join(" ") || "-", batchText(j), progressText(j),
      j.progress_share !== null && j.progress_share !== undefined
        ? (100 * j.progress_share).toFixed(0) + " %" : "-",
      j.restarts, j.retries]));
    fill("events", story.events.slice().reverse().map((e) => [
      new Date(e.at_s * 1000).toLocaleTimeString([], { hour12: false }), e.kind, e.subject,
      e.message]));
    fill("fleet", fleet.instances
      .filter((i) => i.status !== "terminated" && i.status !== "allocation_failed")
      .map((i) => [i.instance_key, i.status, i.offering_key, i.gpus + " x " + i.gpu_type,
        i.price_usd_per_hour.toFixed(4)]));
    document.getElementById("cost").textContent =
      "total $" + cost.total_usd.toFixed(4) + ", now $" + cost.usd_per_hour.toFixed(4) + "/h";
    plot(cost.points);
    document.getElementById("error").textContent = "";
    document.getElementById("updated").textContent = "updated " + new Date().toISOString();
    // Whether the page fits its viewport's width (wide tables scroll in their own box).
    document.documentElement.dataset.fits =
      document.documentElement.scrollWidth <= window.innerWidth ? "yes" : "no";
  } catch (e) {
    document.getElementById("error").textContent = e.message;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body>
</html>
""".replace("REFRESH_MS", str(REFRESH_S * 1000)).replace("EVENTS_SHOWN", str(EVENTS_SHOWN))
