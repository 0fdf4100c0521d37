"""What a person sees (issue 28, item 3): the dashboard (served by a real API server over a
controller's store, at the address `coadapt dashboard` prints) and the cluster's HTML cost
report, opened in headless Chromium at 1280x800 and at a 390x844 phone viewport. Each page is
loaded (its DOM dumped and checked: the data is there, the dashboard's cost chart has a title,
both axes with their units, tick labels and the line; the page fits the viewport's width) and
screenshotted into a folder a person can open: ``$COADAPT_SCREENSHOTS``, else
``coadapt-reports/screenshots/`` in the checkout (git-ignored). Skipped only where no Chromium
binary exists."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscaler.accounting.billing import cost_record_from_store
from autoscaler.accounting.report.html import write_html
from autoscaler.cli.main import app as app_cli
from autoscaler.controller.api import ApiClient, generate_tokens, make_app, serve
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus
from emulators.reports import synthetic_report
from tests.accounting.report.test_html_chromium import FLAGS, PROBE, _chromium
from tests.controller.fakes import fake_controller

ROOT = Path(__file__).resolve().parents[2]
VIEWPORTS = ((1280, 800), (390, 844))

LAYOUT_PROBE = """
<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "layout";
  out.textContent = `fits:${document.documentElement.scrollWidth <= window.innerWidth}`;
  document.body.appendChild(out);
});
</script>
"""


def _folder() -> Path:
    folder = Path(os.environ.get("COADAPT_SCREENSHOTS") or ROOT / "coadapt-reports" / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _chrome(url: str, profile: Path, size: tuple[int, int], *extra: str) -> str:
    out = subprocess.run(
        [
            _chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={size[0]},{size[1]}",
            "--hide-scrollbars",
            "--virtual-time-budget=8000",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _screenshot(url: str, profile: Path, size: tuple[int, int], png: Path) -> None:
    png.unlink(missing_ok=True)
    _chrome(url, profile, size, f"--screenshot={png}")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert struct.unpack(">II", data[16:24]) == size
    assert len(data) > 10_000, f"{png} looks blank ({len(data)} bytes)"


def _store_with_a_story(tmp_path: Path):  # type: ignore[no-untyped-def]
    store, cloud, clock, ctl = fake_controller(tmp_path, "shots", jobs=2, max_instances=4)
    for r in range(8):
        ctl.run_round()
        placed: dict[str, int] = {}
        for (job, _key), gpus in store.list_assignments().items():
            placed[job] = placed.get(job, 0) + gpus
        for job, gpus in sorted(placed.items()):
            report = synthetic_report(
                job, gpus=gpus, nodes=1, local_bsz=32, step_s=0.1, sync_s=0.0,
                progress=10.0 * (r + 1), now_s=clock.now_s(), init_batch_size=128,
                max_batch_size=1024,
            )  # fmt: skip
            store.add_report(job, report.to_json())
        clock.advance(120.0)
        if r == 2:
            running = store.list_instances(statuses=(InstanceStatus.RUNNING,))
            assert running[0].provider_instance_id is not None
            cloud.preempt(running[0].provider_instance_id, notice_s=30.0)
        if r == 5:
            job = store.get_job("job-0")
            store.update_job("job-0", job.version, status=JobStatus.COMPLETED)
    return store, clock


@pytest.mark.slow
def test_the_dashboard_and_the_cluster_report_in_chromium_at_desktop_and_phone_sizes(
    tmp_path: Path,
) -> None:
    _chromium()  # skips here when there is none
    store, clock = _store_with_a_story(tmp_path)
    folder = _folder()
    tokens = generate_tokens(tmp_path / "tokens.json")
    app = make_app(
        tmp_path / "store.db",
        tokens,
        clock,
        logs_dir=tmp_path / "logs",
        on_job_exit=lambda name, *, failed: JobStatus.COMPLETED,
    )
    server = serve(app)
    try:
        assert len(ApiClient(server.url, tokens.user).costs()["points"]) >= 3
        # the address as a user gets it: `coadapt dashboard` (the real token, no placeholder)
        (tmp_path / "up.json").write_text(json.dumps({"url": server.url}))
        printed = CliRunner().invoke(app_cli, ["dashboard", "--state-dir", str(tmp_path)])
        assert printed.exit_code == 0, printed.output
        url = printed.output.strip()
        assert url == f"{server.url}/dashboard#token={tokens.user}" and "<" not in url
        for width, height in VIEWPORTS:
            dom = _chrome(url, tmp_path / f"profile-d{width}", (width, height), "--dump-dom")
            assert "job-1" in dom and "i-" in dom, dom[-2000:]
            assert 'data-fits="yes"' in dom, f"the dashboard overflows {width} px"
            chart = dom.split('id="cost-plot"', 1)[1].split("</svg>", 1)[0]
            assert "Cumulative cost (USD) over time" in chart
            assert 'class="axis x-axis"' in chart and 'class="axis y-axis"' in chart
            assert (
                "time since the first instance started (minutes)" in chart and "cost (USD)" in chart
            )
            assert len(re.findall(r'class="tick-label x-label"', chart)) >= 3
            assert len(re.findall(r'class="tick-label y-label"', chart)) >= 3
            assert re.search(r'<polyline points="[\d.,\s-]+"', chart)
            _screenshot(url, tmp_path / f"profile-s{width}", (width, height),
                        folder / f"dashboard-{width}x{height}.png")  # fmt: skip
    finally:
        server.shutdown()
        app.close()
    record = cost_record_from_store(store, clock.now_s())
    store.close()
    page = folder / "cluster-report.html"
    write_html(page, [("cluster shots", record)], title="coadapt cost report: cluster shots")
    probe = tmp_path / "probe.html"
    probe.write_text(
        page.read_text().replace("</body>", PROBE + LAYOUT_PROBE + "</body>"), encoding="utf-8"
    )
    for width, height in VIEWPORTS:
        dom = _chrome(probe.as_uri(), tmp_path / f"profile-r{width}", (width, height), "--dump-dom")
        decoded = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
        assert decoded is not None
        plots = decoded.group(1).split("\n")
        assert len(plots) == 3 and all(":true:" in p and ":0x0" not in p for p in plots), plots
        assert "fits:true" in dom, f"the cluster report overflows {width} px"
        assert "instances preempted" in dom and "job-0" in dom
        _screenshot(page.as_uri(), tmp_path / f"profile-p{width}", (width, height),
                    folder / f"cluster-report-{width}x{height}.png")  # fmt: skip
    print(f"screenshots in {folder}")
