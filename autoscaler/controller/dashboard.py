"""The read-only dashboard page ``coadapt up`` serves at ``/dashboard``.

The page itself holds no data and no secret: open it as ``/dashboard#token=<user token>`` (the
fragment never leaves the browser, so the token is in no server log). Its script reads the
token from the fragment and calls the API with it like any client (``GET /v1/jobs``, page
after page, ``/v1/instances``, ``/v1/costs``, bearer authentication, user role), renders the
jobs, the
fleet and cost over time (an inline SVG line of the cumulative cost), and refreshes every
``REFRESH_S`` seconds. Without a valid token it shows the API's refusal and nothing else.
"""

from __future__ import annotations

from typing import Final

REFRESH_S: Final = 5

PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>coadapt</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.8em; text-align: left; }
th { background: #f4f4f4; }
#error { color: #b00; font-weight: bold; }
#updated { color: #777; }
</style>
</head>
<body>
<h1>coadapt</h1>
<p id="error"></p>
<p id="updated"></p>
<h2>Jobs</h2>
<table id="jobs"><thead><tr><th>job</th><th>status</th><th>GPUs</th><th>instances</th>
<th>progress</th><th>retries</th></tr></thead><tbody></tbody></table>
<h2>Fleet</h2>
<table id="fleet"><thead><tr><th>instance</th><th>status</th><th>offering</th><th>GPUs</th>
<th>$/h</th></tr></thead><tbody></tbody></table>
<h2>Cost</h2>
<p id="cost"></p>
<svg id="cost-plot" width="640" height="160" role="img" aria-label="cumulative cost"></svg>
<script>
"use strict";
const token = new URLSearchParams(location.hash.slice(1)).get("token") || "";
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
function plot(points) {
  const svg = document.getElementById("cost-plot");
  svg.replaceChildren();
  if (points.length < 2) { return; }
  const t0 = points[0][0], t1 = points[points.length - 1][0] || t0 + 1;
  const top = Math.max(...points.map((p) => p[1])) || 1;
  const xy = points.map((p) => [
    10 + 620 * (p[0] - t0) / Math.max(t1 - t0, 1e-9), 150 - 140 * p[1] / top,
  ]);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", xy.map((p) => p.join(",")).join(" "));
  line.setAttribute("fill", "none");
  line.setAttribute("stroke", "#2a6");
  line.setAttribute("stroke-width", "2");
  svg.appendChild(line);
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
    const [jobs, fleet, cost] = await Promise.all(
      [allJobs(), get("/v1/instances"), get("/v1/costs")]);
    fill("jobs", jobs.map((j) => [
      j.name, j.status, Object.values(j.assignment).reduce((a, b) => a + b, 0),
      Object.keys(j.assignment).join(" ") || "-",
      j.progress !== null && j.progress !== undefined ? Math.round(j.progress) : "-",
      j.retries]));
    fill("fleet", fleet.instances
      .filter((i) => i.status !== "terminated" && i.status !== "allocation_failed")
      .map((i) => [i.instance_key, i.status, i.offering_key, i.gpus + " x " + i.gpu_type,
        i.price_usd_per_hour.toFixed(4)]));
    document.getElementById("cost").textContent =
      "total $" + cost.total_usd.toFixed(4) + ", now $" + cost.usd_per_hour.toFixed(4) + "/h";
    plot(cost.points);
    document.getElementById("error").textContent = "";
    document.getElementById("updated").textContent = "updated " + new Date().toISOString();
  } catch (e) {
    document.getElementById("error").textContent = e.message;
  }
}
refresh();
setInterval(refresh, REFRESH_MS);
</script>
</body>
</html>
""".replace("REFRESH_MS", str(REFRESH_S * 1000))
