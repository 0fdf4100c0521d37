"""The read commands on a cluster whose store is PostgreSQL (real processes, a real server):
``coadapt up --store URL`` records the database in ``cluster.json`` without its password, and
``events``, ``logs``, ``cost report --state-dir``, ``status`` and ``describe`` of a cluster that
is not up, ``down`` with no ``up`` running and ``up``'s question about a cluster brought down
read that database, as they read ``store.db`` of an embedded cluster; ``--store URL`` (or
``COADAPT_STORE_URL``) names it where the folder does not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock
from coadapt_common.procfs import PROC_ROOT
from providers.local import LocalProvider

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
CLUSTER = "coadapt-local"
SECRET = "s3cret-not-to-be-kept"

pytestmark = pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COADAPT_STORE_URL", "PGPASSWORD")}
    return {**env, **extra}


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL, env=env or _env(),
    )  # fmt: skip


def _with_password(url: str) -> str:
    """``url`` carrying a password (the tests' server trusts its local user, so any works)."""
    parts = urlsplit(url)
    user, host = parts.netloc.split("@", 1)
    return urlunsplit(parts._replace(netloc=f"{user}:{SECRET}@{host}"))


def _long_job(tmp_path: Path) -> Path:
    """mlp-wide made long (it runs until the test brings the cluster down) and light."""
    text = (ROOT / "examples/jobs/mlp-wide.yaml").read_text()
    text = text.replace("../elastic_mlp.py", str(ROOT / "examples/elastic_mlp.py"))
    text = text.replace("--epochs 1 ", "--epochs 200 ").replace("--hidden 512", "--hidden 16")
    text = text.replace("--initial-batch-size", "--sample-delay-s 0.002 --initial-batch-size")
    assert all(a in text for a in ("--hidden 16", "--epochs 200", "--sample-delay-s 0.002"))
    spec = tmp_path / "mlp-wide.yaml"
    spec.write_text(text)
    return spec


def _wait_running(state: Path, job: str, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    doc: dict[str, Any] = {}
    while time.monotonic() < deadline:
        out = _run("status", "--json", "--state-dir", str(state))
        if out.returncode == 0:
            doc = json.loads(out.stdout)
            jobs = {j["name"]: j for j in doc["jobs"]}
            if jobs.get(job, {}).get("status") == "running" and jobs[job].get("report"):
                return doc
        time.sleep(2)
    raise AssertionError(f"{job} did not run: {doc}")


@pytest.mark.slow
def test_read_commands_down_and_up_find_the_postgres_store_the_folder_records(
    tmp_path: Path, postgres_url: str
) -> None:
    state = tmp_path / "cluster"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=_env(COADAPT_STORE_URL=_with_password(postgres_url)), text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        recorded = json.loads((state / "cluster.json").read_text())
        assert recorded["store"] == postgres_url  # the URL, its password removed
        assert not any(SECRET.encode() in p.read_bytes() for p in state.rglob("*.json"))
        submitted = _run("submit", str(_long_job(tmp_path)), "--state-dir", str(state))
        assert submitted.returncode == 0, submitted.stderr
        _wait_running(state, "mlp-wide")
        up.send_signal(signal.SIGKILL)  # down from here, reading the database
        up.wait()
        down = _run("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        assert "is gone" in down.stdout and "no instance left" in down.stdout, down.stdout
        assert LocalProvider(state / "local").list_instances(CLUSTER) == []
        assert not (state / "store.db").exists()  # every read below is the database's
        with Store.open_read_only(postgres_url, SystemClock()) as store:
            assert store.down_at_s() is not None

        events = _run("events", "--state-dir", str(state))
        assert events.returncode == 0, events.stderr
        assert "mlp-wide" in events.stdout and "released" in events.stdout, events.stdout
        cost = _run("cost", "report", "--state-dir", str(state), "--format", "json")
        assert cost.returncode == 0, cost.stderr
        assert CLUSTER in cost.stdout and "mlp-wide" in cost.stdout, cost.stdout
        status = _run("status", "--state-dir", str(state), "--json")
        assert status.returncode == 0, status.stderr
        assert "as its store last recorded" in status.stderr, status.stderr
        (job,) = json.loads(status.stdout)["jobs"]
        assert job["name"] == "mlp-wide" and job["status"] in ("queued", "running"), job
        describe = _run("describe", "mlp-wide", "--state-dir", str(state), "--json")
        assert describe.returncode == 0, describe.stderr
        doc = json.loads(describe.stdout)
        assert doc["name"] == "mlp-wide" and doc["history"]["events"], doc
        assert doc["cost_usd"] is not None
        logs = _run("logs", "mlp-wide", "--state-dir", str(state))
        assert logs.returncode == 0, logs.stderr
        again = _run("down", "--state-dir", str(state))
        assert again.returncode == 0 and "already down" in again.stdout, again.stdout + again.stderr
        # up asks (here, with no terminal, refuses) before it relaunches what down left queued
        refused = _run("up", "--state-dir", str(state), "--interval-s", "1")
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "mlp-wide" in refused.stderr and "--resume" in refused.stderr, refused.stderr
        assert not (state / "store.db").exists() and not (state / "up.json").exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        LocalProvider(state / "local").down(CLUSTER)


def test_store_url_names_the_database_where_the_folder_records_none(
    tmp_path: Path, postgres_url: str
) -> None:
    """A folder with no record of the store (another machine, a fresh checkout): --store URL
    or COADAPT_STORE_URL names it; without either the commands say how to name it."""
    clock = SystemClock()
    with Store.create(postgres_url, CLUSTER, clock) as store:
        store.add_job("bert", JobSubmission("bert", 64, 512, 64, command=("t.py",)).to_json())
        store.add_events([(clock.now_s(), "start", "bert", "placed on i-1 (2 GPUs)")])
    state = tmp_path / "elsewhere"
    state.mkdir()
    missing = _run("events", "--state-dir", str(state))
    assert missing.returncode == 1 and "--store" in missing.stderr, missing.stderr
    events = _run("events", "--state-dir", str(state), "--store", postgres_url)
    assert events.returncode == 0, events.stderr
    assert "placed on i-1 (2 GPUs)" in events.stdout
    by_env = _env(COADAPT_STORE_URL=_with_password(postgres_url))
    status = _run("status", "--state-dir", str(state), "--json", env=by_env)
    assert status.returncode == 0, status.stderr
    (job,) = json.loads(status.stdout)["jobs"]
    assert (job["name"], job["status"]) == ("bert", "queued")
    assert SECRET not in status.stdout + status.stderr
    cost = _run("cost", "report", "--state-dir", str(state), env=by_env)
    assert cost.returncode == 0, cost.stderr
    assert CLUSTER in cost.stdout
    alone = _run("cost", "report", "--store", postgres_url)  # no state folder at all
    assert alone.returncode == 0, alone.stderr
    assert CLUSTER in alone.stdout
    bad = _run("events", "--state-dir", str(state), "--store", "/tmp/store.db")
    assert bad.returncode == 2 and "postgresql://" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
