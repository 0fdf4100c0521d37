"""A real ``coadapt up`` whose store is a PostgreSQL database (``COADAPT_STORE_URL``, as a
team would keep the URL out of ``ps``), on the local provider: a small job runs to completion,
every table is in PostgreSQL and no SQLite file is made."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from coadapt_common.procfs import PROC_ROOT
from providers.local import LocalProvider

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_up_with_a_postgresql_store_runs_a_job_to_completion(
    tmp_path: Path, postgres_url: str
) -> None:
    state = tmp_path / "cluster"
    log = (tmp_path / "up.log").open("w")
    # A password (the test server trusts the loopback, so it is not checked): never shown.
    secret_url = postgres_url.replace("postgres@", "postgres:s3cret@")
    env = {**os.environ, "COADAPT_STORE_URL": secret_url}
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, text=True,
        env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            assert up.poll() is None, (tmp_path / "up.log").read_text()
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        assert "s3cret" not in Path(f"/proc/{up.pid}/cmdline").read_text()
        submitted = _run("submit", str(ROOT / "examples/jobs/mlp-small.yaml"), "--state-dir",
                         str(state))  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 240
        status = ""
        while time.monotonic() < deadline:
            out = _run("status", "--json", "--state-dir", str(state))
            if out.returncode == 0:
                jobs = {j["name"]: j["status"] for j in json.loads(out.stdout)["jobs"]}
                status = jobs.get("mlp-small", "")
                if status in ("completed", "failed"):
                    break
            time.sleep(2)
        assert status == "completed", (tmp_path / "up.log").read_text()[-3000:]
        assert not list(state.glob("store.db*"))  # no SQLite store beside
        with psycopg.connect(postgres_url) as pg:
            (job_status,) = pg.execute(
                "SELECT status FROM jobs WHERE name = 'mlp-small'"
            ).fetchone()
            instances = pg.execute("SELECT count(*) FROM instances").fetchone()[0]
            reports = pg.execute("SELECT count(*) FROM assignment_history").fetchone()[0]
        assert job_status == "completed" and instances >= 1 and reports >= 1
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(60)
            except subprocess.TimeoutExpired:
                up.kill()
                up.wait()
        log.close()
        LocalProvider(state / "local").down("coadapt-local")
    assert "s3cret" not in (tmp_path / "up.log").read_text()
