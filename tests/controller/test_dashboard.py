"""The dashboard `coadapt up` serves, loaded in headless Chromium against a real API server:
with the user token (in the URL fragment) it shows the jobs, the fleet and the cost; without
it, the API's refusal and no data. Skipped only where no Chromium binary exists."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autoscaler.controller.api import MAX_JOBS_PAGE, ApiClient, generate_tokens, make_app, serve
from autoscaler.controller.jobs import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from tests.report.test_html_chromium import FLAGS, _chromium


def _dom(url: str) -> str:
    out = subprocess.run(
        [_chromium(), *FLAGS, "--virtual-time-budget=8000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_dashboard_shows_jobs_fleet_and_cost_only_with_the_token(tmp_path: Path) -> None:
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    row = store.add_instance(
        instance_key="i-dash1",
        request_id="c1-i-dash1",
        offering_key="local/local-a/local-2gpu/spot",
        provider="local",
        instance_type="local-2gpu",
        zone="local-a",
        market="spot",
        gpu_type="cpu-slot",
        gpus=2,
        price_usd_per_hour=0.2,
    )
    row = store.transition("i-dash1", row.version, InstanceStatus.REQUESTED, reason="launch")
    store.transition(
        "i-dash1", row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="p1"
    )
    store.add_job(
        "job-on-dashboard",
        JobSubmission("job-on-dashboard", 64, 512, 64, command=("train.py",)).to_json(),
    )
    store.set_assignments("job-on-dashboard", {"i-dash1": 2})
    job = store.get_job("job-on-dashboard")
    store.update_job(job.name, job.version, status=JobStatus.RUNNING)
    for i in range(MAX_JOBS_PAGE):  # the dashboard reads every page, not only the first
        store.add_job(
            f"queued-{i:03d}",
            JobSubmission(f"queued-{i:03d}", 64, 512, 64, command=("t.py",)).to_json(),
        )
    clock.advance(3600.0)  # an hour of the running instance: $0.20 accrued
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
        costs = ApiClient(server.url, tokens.user).costs()
        assert costs["total_usd"] == pytest.approx(0.2) and costs["usd_per_hour"] == 0.2
        dom = _dom(f"{server.url}/dashboard#token={tokens.user}")
        assert "job-on-dashboard" in dom and "i-dash1" in dom and "2 x cpu-slot" in dom
        assert f"queued-{MAX_JOBS_PAGE - 1:03d}" in dom  # on the second page
        assert "total $0.2000, now $0.2000/h" in dom
        assert "<polyline" in dom  # the cost-over-time line was drawn
        refused = _dom(f"{server.url}/dashboard#token=not-a-token")
        assert "401" in refused and "job-on-dashboard" not in refused
        agent_token = _dom(f"{server.url}/dashboard#token={tokens.agent_credential('i-1')}")
        assert "403" in agent_token and "job-on-dashboard" not in agent_token
    finally:
        server.shutdown()
        app.close()
        store.close()
