"""``/metrics`` of a LIVE cluster (issue 39, item 3): a real ``coadapt up`` on the local
provider runs mlp-small; scraped over HTTP with the scrape token ``coadapt tokens scrape``
issues and parsed with the Prometheus client's own parser, every family is there and moves
as the job runs (an instance appears, the job holds GPUs with a batch, spend grows, rounds
and requests are counted); an unauthenticated scrape is 401, the scrape token is 403 on the
users' endpoints; ``coadapt up`` said that it leads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.controller.metrics import FAMILIES

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


def _get(url: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _scrape(url: str, token: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    status, text = _get(f"{url}/metrics", token)
    assert status == 200, text
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def _one(families: dict, sample: str, **labels: str) -> float:
    family = sample.removesuffix("_total").removesuffix("_count")
    hits = [
        v for name, got, v in families[family] if name == sample and labels.items() <= got.items()
    ]
    return sum(hits)


def test_metrics_of_a_live_cluster_move_as_a_job_runs(tmp_path: Path) -> None:
    env = {**os.environ, "COADAPT_HOME": str(tmp_path), "COLUMNS": "100"}
    state = tmp_path / "cluster"
    argv = ["up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"]
    log_path = tmp_path / "up.log"
    log = log_path.open("w")
    up = subprocess.Popen([*COADAPT, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                          text=True, env=env)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists():
            assert up.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        url = json.loads((state / "up.json").read_text())["url"].rstrip("/")
        token_file = tmp_path / "scrape.token"
        _run("tokens", "scrape", "--state-dir", str(state), "--out", str(token_file), env=env)
        assert token_file.stat().st_mode & 0o077 == 0
        token = token_file.read_text()

        assert _get(f"{url}/metrics", None)[0] == 401
        assert _get(f"{url}/v1/jobs", token)[0] == 403
        before = _scrape(url, token)
        assert set(FAMILIES) <= set(before), set(FAMILIES) - set(before)
        assert _one(before, "coadapt_leader") == 1
        assert _one(before, "coadapt_leader_epoch") >= 1  # the lease it took

        _run("submit", str(ROOT / "examples/jobs/mlp-small.yaml"), "--state-dir", str(state),
             env=env)  # fmt: skip
        deadline = time.monotonic() + 150
        during = before
        while time.monotonic() < deadline:
            during = _scrape(url, token)
            if _one(during, "coadapt_job_gpus", job="mlp-small") > 0 and _one(
                during, "coadapt_job_batch_size", job="mlp-small"
            ):
                break
            time.sleep(1.0)
        assert _one(during, "coadapt_job_gpus", job="mlp-small") > 0, during["coadapt_job_gpus"]
        assert _one(during, "coadapt_job_batch_size", job="mlp-small") > 0
        assert _one(during, "coadapt_jobs", status="running") == 1
        assert _one(during, "coadapt_instances", state="running") >= 1
        assert _one(during, "coadapt_fleet_cost_usd_per_hour") > 0
        time.sleep(3.0)
        later = _scrape(url, token)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=120)
        finally:
            log.close()

    assert _one(later, "coadapt_spend_usd_total") > _one(during, "coadapt_spend_usd_total") > 0
    assert _one(before, "coadapt_spend_usd_total") == 0
    rounds = "coadapt_round_duration_seconds_count"
    assert _one(later, rounds, phase="observe") > _one(before, rounds, phase="observe") > 0
    assert _one(later, rounds, phase="act") > _one(before, rounds, phase="act")
    requests = "coadapt_api_request_duration_seconds_count"
    scrapes = _one(later, requests, method="GET", route="/metrics")
    assert scrapes > _one(before, requests, method="GET", route="/metrics")
    # the agent's calls are counted under their route templates, never their raw paths
    routes = {labels["route"] for _, labels, _ in later["coadapt_api_request_duration_seconds"]}
    assert "/v1/agents/<instance_key>/heartbeat" in routes, routes
    assert not any(r.startswith("/v1/agents/i-") for r in routes), routes
    assert "this controller leads (epoch " in log_path.read_text()
