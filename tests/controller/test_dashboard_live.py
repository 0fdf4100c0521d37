"""The dashboard on a LIVE cluster (issue 41, item 6): a real `coadapt up` on the local
provider runs mlp-medium, and the page `coadapt dashboard` prints, loaded in headless
Chromium some 20 s after the first instance started, draws the cost from that start (a time
axis that spans those seconds, not a vertical line at 0: `/v1/costs` started its series at
"now" while no instance had ended), and shows the events, the job's reason, its batch, its
restarts and its progress in samples as a share of the declared length."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.accounting.report.test_html_chromium import FLAGS, _chromium

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]


def _run(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def test_the_dashboard_of_a_live_cluster_draws_cost_from_the_first_launch(tmp_path: Path) -> None:
    browser = _chromium()  # skip before anything starts where there is no Chromium
    env = {**os.environ, "COADAPT_HOME": str(tmp_path), "COLUMNS": "100"}
    state = tmp_path / "cluster"
    argv = ["up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"]
    log = (tmp_path / "up.log").open("w")
    up = subprocess.Popen([*COADAPT, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists():
            assert up.poll() is None and time.monotonic() < deadline, tmp_path / "up.log"
            time.sleep(0.2)
        _run("submit", str(ROOT / "examples/jobs/mlp-medium.yaml"), "--state-dir", str(state),
             env=env)  # fmt: skip
        # running with a progress report, and 20 s after the first instance started
        deadline = time.monotonic() + 150
        job: dict = {}
        while time.monotonic() < deadline:
            doc = json.loads(_run("status", "--json", "--state-dir", str(state), env=env))
            job = next(j for j in doc["jobs"] if j["name"] == "mlp-medium")
            if job.get("progress_samples") and job["status"] == "running":
                break
            time.sleep(1.0)
        assert job.get("progress_samples"), job
        time.sleep(max(0.0, 20.0 - (time.monotonic() - (deadline - 150))))
        url = _run("dashboard", "--state-dir", str(state), env=env).strip()
        out = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=8000", "--window-size=1280,900", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        dom = out.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=120)
        finally:
            log.close()
    chart = dom.split('id="cost-plot"', 1)[1].split("</svg>", 1)[0]
    labels = [float(v) for v in re.findall(r'class="tick-label x-label"[^>]*>([\d.]+)<', chart)]
    assert len(labels) >= 3 and labels[-1] >= 0.2, labels  # minutes: >= 12 s of axis
    line = re.search(r'<polyline points="([\d.,\s-]+)"', chart)
    assert line, chart[-2000:]
    xs = [float(p.split(",")[0]) for p in line.group(1).split()]
    assert max(xs) - min(xs) > 300, xs  # across most of the 640-wide plot, not one x
    assert "no cost yet" not in chart
    jobs = dom.split('id="jobs"', 1)[1].split("</table>", 1)[0]
    row = next(r for r in jobs.split("<tr>") if "mlp-medium" in r)
    cells = re.findall(r"<td>(.*?)</td>", row)
    # job, status, why, GPUs, instances, batch, progress (samples), done, restarts, retries
    assert cells[1] == "running" and cells[2], cells
    assert re.fullmatch(r"\d+ \(\d+/GPU x \d+\)", cells[5]), cells
    assert re.fullmatch(r"\d+ of 122880", cells[6]), cells  # 3 epochs of 40960 samples
    assert re.fullmatch(r"\d+ %", cells[7]) and int(cells[7].split()[0]) <= 100, cells
    # restarts: 0, or 1 once the policy scales it 1 -> 2 GPUs (GPU-bound: it pays); no failure
    assert cells[8] in ("0", "1") and cells[9] == "0", cells
    events = dom.split('id="events"', 1)[1].split("</table>", 1)[0]
    kinds = re.findall(r"<tr><td>[\d:]+</td><td>([\w-]+)</td>", events)
    assert {"submit", "launch", "ready", "start"} <= set(kinds), kinds
    assert "mlp-medium" in events and "placed on 1 GPU" in events
