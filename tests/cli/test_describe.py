"""A job's whole story from the store of a cluster that is not up, as a user runs the
commands (real processes on a real SQLite store): ``status`` with its times and absolute
deadline, ``describe``, and tables at 80 columns that keep every key whole."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
LONG_OFFERING = "local/local-a/local-4gpu-spot-extra-long-offering"


def _run(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env
    )


def _stopped_cluster(state: Path) -> float:
    """A store as a stopped cluster leaves it: ``bert`` (deadline 15 minutes after its
    submission) ran 2 GPUs of an instance with a long offering key and completed; the
    instance was billed and released, all in the last two hours. Returns bert's submission
    time."""
    clock = FakeClock(time.time() - 7200.0)
    with Store.create(state / "store.db", "coadapt-local", clock) as store:
        spec = JobSubmission("bert", 64, 512, 64, command=("t.py",))
        job = store.add_job("bert", spec.to_json(), deadline_after_s=900.0)
        row = store.add_instance(
            instance_key="i-long-offering-0",
            request_id="r-1",
            offering_key=LONG_OFFERING,
            provider="local",
            instance_type="local-4gpu",
            zone="local-a",
            market="spot",
            gpu_type="local-gpu",
            gpus=4,
            price_usd_per_hour=1.5,
        )
        key = row.instance_key
        row = store.transition(key, row.version, InstanceStatus.REQUESTED, reason="requested")
        row = store.transition(
            key, row.version, InstanceStatus.RUNNING, reason="up", provider_instance_id="local-1"
        )
        start = clock.now_s()
        store.set_assignments("bert", {row.instance_key: 2})
        store.add_events([(start, "start", "bert", "placed on i-long-offering-0 (2 GPUs)")])
        clock.advance(1800.0)
        store.set_assignments("bert", {})
        job = store.update_job("bert", job.version, status=JobStatus.COMPLETED)
        row = store.transition(
            row.instance_key, row.version, InstanceStatus.TERMINATING, reason="released"
        )
        clock.advance(1800.0)
        store.transition(row.instance_key, row.version, InstanceStatus.TERMINATED, reason="gone")
        store.add_cost_record(row.instance_key, start, start + 3600.0, 1.5)
        return job.submitted_at_s


def test_status_of_a_stopped_cluster_shows_times_and_the_absolute_deadline(
    tmp_path: Path,
) -> None:
    submitted = _stopped_cluster(tmp_path)
    out = _run("status", "--state-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert "no cluster is up" in out.stderr and "as its store last recorded" in out.stderr
    (job,) = json.loads(out.stdout)["jobs"]
    assert job["deadline_s"] == submitted + 900.0  # fixed at submission, not "15m"
    when = datetime.datetime.fromtimestamp(submitted + 900.0, datetime.UTC)
    assert job["deadline_utc"] == when.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert job["started_at_s"] is not None and job["started_at_s"] >= submitted
    table = _run("status", "--state-dir", str(tmp_path), "--wide", columns=200).stdout
    header = next(x for x in table.splitlines() if re.match(r"\s*job\s", x))
    for column in ("submitted", "started", "elapsed", "deadline"):
        assert column in header, table
    stamp = datetime.datetime.fromtimestamp(submitted + 900.0).strftime("%H:%M:%S")
    assert stamp in table, table


def test_describe_reads_a_stopped_clusters_store(tmp_path: Path) -> None:
    _stopped_cluster(tmp_path)
    out = _run("describe", "bert", "--state-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "no cluster is up" in out.stderr
    text = out.stdout
    assert re.search(r"^status: +completed$", text, re.M), text
    assert re.search(r"^deadline: +\S+ \(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\)$", text, re.M), text
    assert "2 GPU(s) on i-long-offering-0" in text  # the placement history
    assert "placed on i-long-offering-0 (2 GPUs)" in text  # its events
    assert re.search(r"^cost \(USD\): +\d+\.\d{4}$", text, re.M), text
    assert 'command: ["t.py"]' in text  # the spec
    doc = json.loads(_run("describe", "bert", "--state-dir", str(tmp_path), "--json").stdout)
    assert doc["history"]["placements"][0]["gpus"] == 2
    assert doc["history"]["gpu_s"] == 2 * 1800.0
    assert abs(doc["cost_usd"] - 2 / 4 * 1.5 * 0.5) < 1e-6  # half of 4 GPUs for half an hour
    unknown = _run("describe", "nope", "--state-dir", str(tmp_path))
    assert unknown.returncode == 1 and "no job 'nope'" in unknown.stderr


def test_cost_report_at_80_columns_keeps_each_offering_key_whole(tmp_path: Path) -> None:
    _stopped_cluster(tmp_path)
    out = _run("cost", "report", "--state-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80, out.stdout
    assert any(LONG_OFFERING in x for x in lines), out.stdout  # on one line, whole
    assert any(re.search(r"\bspot\b", x) for x in lines), out.stdout  # the market whole


def test_the_demos_cost_report_at_80_columns_keeps_each_offering_key_whole(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """``COLUMNS=80 coadapt demo``: the report it ends with (printed, not to a terminal) is
    as wide as COLUMNS says, not a fixed 120."""
    from autoscaler.cli.cluster import _demo_cost_report

    _stopped_cluster(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    _demo_cost_report(tmp_path)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(x) for x in lines) <= 80, "\n".join(lines)
    assert any(LONG_OFFERING in x for x in lines), lines


def test_status_at_80_columns_keeps_job_and_offering_keys_whole(capsys) -> None:
    from autoscaler.cli.cluster import _render_status

    job = {"name": "a-job-with-a-rather-long-name-0123456789", "status": "running"}
    instance = {
        "instance_key": "i-0a1b2c3d",
        "status": "running",
        "offering_key": "aws/us-east-1a/g5.12xlarge/spot",
        "gpus": 4,
        "gpu_type": "local-gpu",
        "price_usd_per_hour": 1.5,
    }
    os.environ["COLUMNS"] = "80"
    try:
        _render_status({"jobs": [job], "instances": [instance]})
    finally:
        del os.environ["COLUMNS"]
    lines = capsys.readouterr().out.splitlines()
    assert max(len(x) for x in lines) <= 80
    assert any(job["name"] in x for x in lines), lines
    assert any("aws/us-east-1a/g5.12xlarge/spot" in x for x in lines), lines


def _stopped_mid_run(state: Path) -> float:
    """A store as a cluster stopped while ``gpt`` ran leaves it: its last round recorded an
    ETA 20 minutes on. Returns that ETA."""
    clock = FakeClock(time.time() - 600.0)
    with Store.create(state / "store.db", "coadapt-local", clock) as store:
        spec = JobSubmission("gpt", 64, 512, 64, command=("t.py",))
        job = store.add_job("gpt", spec.to_json())
        store.update_job("gpt", job.version, status=JobStatus.RUNNING)
        eta_s = clock.now_s() + 1800.0
        store.record_etas({"gpt": eta_s})
        return eta_s


def test_a_stopped_clusters_status_and_describe_show_no_eta(tmp_path: Path) -> None:
    """A stopped cluster makes no progress: its store's last ETA is not shown as one."""
    _stopped_mid_run(tmp_path)
    out = _run("status", "--state-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    (job,) = json.loads(out.stdout)["jobs"]
    assert job["status"] == "running"
    assert (job["eta_s"], job["eta_utc"]) == (None, None)
    table = _run("status", "--state-dir", str(tmp_path), "--wide", columns=200).stdout
    lines = table.splitlines()
    header = next(x for x in lines if re.match(r"\s*job\s", x))
    assert "ETA" in header, table
    row = next(x for x in lines if x.lstrip().startswith("gpt"))
    at = header.index("ETA")
    assert row[at - 6 : at + 3].split()[-1] == "-", table  # the ETA cell, right-aligned
    text = _run("describe", "gpt", "--state-dir", str(tmp_path)).stdout
    assert re.search(r"^ETA: +-$", text, re.M), text


def test_status_and_describe_show_a_running_jobs_eta_relative_to_now(capsys) -> None:
    """The ETA column says how long until the model's estimate (``in 3m05s``), ``-`` for a
    job without one; describe says it with the UTC time."""
    from autoscaler.cli.cluster import _render_describe, _render_status, eta_text

    now = time.time()
    assert eta_text(None, now) == "-"
    assert eta_text(now + 185.4, now) == "in 3m05s"
    assert eta_text(now + 2 * 3600 + 120, now) == "in 2h02m"
    assert eta_text(now - 30.0, now) == "now"  # due by the estimate, still running
    jobs = [
        {"name": "bert", "status": "running", "eta_s": now + 3600 + 185},
        {"name": "gpt", "status": "running", "eta_s": None},
    ]
    os.environ["COLUMNS"] = "200"
    try:
        _render_status({"jobs": jobs, "instances": []}, wide=True)
    finally:
        del os.environ["COLUMNS"]
    lines = capsys.readouterr().out.splitlines()
    header = next(x for x in lines if re.match(r"\s*job\s", x))
    assert "ETA" in header
    bert = next(x for x in lines if x.lstrip().startswith("bert"))
    assert re.search(r"\bin 1h0[23]m\b", bert), lines
    gpt = next(x for x in lines if x.lstrip().startswith("gpt"))
    assert "in " not in gpt
    doc = {
        "name": "bert",
        "status": "running",
        "eta_s": now + 185.4,
        "eta_utc": "2030-01-02T03:04:05Z",
        "history": {"placements": [], "events": [], "gpu_s": 0.0},
    }
    _render_describe(doc)
    text = capsys.readouterr().out
    assert re.search(
        r"^ETA: +in 3m0[45]s \(2030-01-02T03:04:05Z, by its fitted model\)$", text, re.M
    )
