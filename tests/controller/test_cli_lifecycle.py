"""A cluster can always be brought down, as a user runs it (real processes, slow): `coadapt
down` after its `coadapt up` was SIGKILLed releases every instance and stops the local agents
and their jobs; `down` twice exits 0; `up` on a brought-down folder relaunches nothing without
`--resume`; `up -d` runs in the background and `down` stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.service import BroughtDownError, UpConfig, run_up
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import SystemClock
from coadapt_common.procfs import PROC_ROOT
from providers.local import LocalProvider

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
CLUSTER = "coadapt-local"

pytestmark = pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc")


def _run(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _long_job(tmp_path: Path) -> Path:
    """mlp-wide made long (it runs until the test brings the cluster down) and light."""
    text = (ROOT / "examples/jobs/mlp-wide.yaml").read_text()
    text = text.replace("../elastic_mlp.py", str(ROOT / "examples/elastic_mlp.py"))  # a copy
    text = text.replace("--epochs 1 ", "--epochs 200 ").replace("--hidden 512", "--hidden 16")
    text = text.replace("--initial-batch-size", "--sample-delay-s 0.002 --initial-batch-size")
    assert all(a in text for a in ("--hidden 16", "--epochs 200", "--sample-delay-s 0.002"))
    spec = tmp_path / "mlp-wide.yaml"
    spec.write_text(text)
    return spec


def _marked(instance_ids: set[str]) -> list[int]:
    """Every process on this machine that belongs to one of these local instances: the
    provider's marker (COADAPT_LOCAL_INSTANCE=<id>) is in its environment, inherited by the
    agent, the launcher and the job's workers."""
    found = []
    for entry in PROC_ROOT.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(e.startswith(b"COADAPT_LOCAL_INSTANCE=") and e.split(b"=", 1)[1].decode()
               in instance_ids for e in env):  # fmt: skip
            found.append(int(entry.name))
    return found


def _wait_running(state: Path, job: str, timeout_s: float = 180) -> dict:
    """The status document once ``job`` runs on an instance whose agent has started it."""
    deadline = time.monotonic() + timeout_s
    doc: dict = {}
    while time.monotonic() < deadline:
        out = _run("status", "--json", "--state-dir", str(state))
        if out.returncode == 0:
            doc = json.loads(out.stdout)
            jobs = {j["name"]: j for j in doc["jobs"]}
            if jobs.get(job, {}).get("status") == "running" and jobs[job].get("report"):
                return doc
        time.sleep(2)
    raise AssertionError(f"{job} did not run: {doc}")


@pytest.fixture
def up_process(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """A real `coadapt up` on the local provider (foreground, its own process); whatever the
    test leaves is brought down at the end."""
    state = tmp_path / "cluster"
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (state / "up.json").exists(), "coadapt up did not come up"
        yield state, up
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        LocalProvider(state / "local").down(CLUSTER)


@pytest.mark.slow
def test_down_after_up_was_sigkilled_releases_every_instance_and_stops_its_jobs(
    tmp_path: Path, up_process: tuple[Path, subprocess.Popen[str]]
) -> None:
    state, up = up_process
    submitted = _run("submit", str(_long_job(tmp_path)), "--state-dir", str(state))
    assert submitted.returncode == 0, submitted.stderr
    doc = _wait_running(state, "mlp-wide")
    live = {i["provider_instance_id"] for i in doc["instances"] if i["status"] == "running"}
    assert live and _marked(live), "no agent or job process to stop"
    up.send_signal(signal.SIGKILL)
    up.wait()
    assert (state / "up.json").exists()  # left by the killed up
    down = _run("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "is gone" in down.stdout and "no instance left" in down.stdout, down.stdout
    for instance in live:
        assert instance in down.stdout, down.stdout  # it says what it released
    assert LocalProvider(state / "local").list_instances(CLUSTER) == []
    assert _marked(live) == [], "an agent or job process of a released instance runs on"
    assert not (state / "up.json").exists()
    with Store.open_read_only(state / "store.db", SystemClock()) as store:
        assert store.down_at_s() is not None
        rows = store.list_instances()
        assert all(r.status in ("terminated", "allocation_failed") for r in rows), rows
    again = _run("down", "--state-dir", str(state))  # down twice: said, and exit 0
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already down" in again.stdout, again.stdout


@pytest.mark.slow
def test_down_after_up_was_stopped_by_sigterm_releases_the_fleet(
    tmp_path: Path, up_process: tuple[Path, subprocess.Popen[str]]
) -> None:
    """SIGTERM (a `timeout`) stops up and keeps the fleet: up.json is gone, yet down
    releases what the cloud lists under the cluster's tag."""
    state, up = up_process
    assert _run("submit", str(_long_job(tmp_path)), "--state-dir", str(state)).returncode == 0
    doc = _wait_running(state, "mlp-wide")
    live = {i["provider_instance_id"] for i in doc["instances"] if i["status"] == "running"}
    up.send_signal(signal.SIGTERM)
    assert up.wait(timeout=60) == 0
    assert not (state / "up.json").exists() and _marked(live)
    down = _run("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no coadapt up runs" in down.stdout and "no instance left" in down.stdout
    assert LocalProvider(state / "local").list_instances(CLUSTER) == []
    assert _marked(live) == []


@pytest.mark.slow
def test_up_on_a_brought_down_folder_relaunches_nothing_without_resume(
    tmp_path: Path, up_process: tuple[Path, subprocess.Popen[str]]
) -> None:
    state, up = up_process
    assert _run("submit", str(_long_job(tmp_path)), "--state-dir", str(state)).returncode == 0
    _wait_running(state, "mlp-wide")
    down = _run("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stdout + down.stderr
    assert up.wait(timeout=120) == 0
    again = _run("down", "--state-dir", str(state))
    assert again.returncode == 0 and "already down" in again.stdout, again.stdout + again.stderr
    refused = _run("up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("coadapt: "), refused.stderr
    assert "mlp-wide" in lines[0] and "--resume" in lines[0], lines[0]
    assert LocalProvider(state / "local").list_instances(CLUSTER) == []
    assert not (state / "up.json").exists()
    # --resume relaunches it (in the background: up -d), and down stops that up
    resumed = _run("up", "-d", "--resume", "--state-dir", str(state), "--interval-s", "1",
                   "--max-gpu-slots", "2")  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    _wait_running(state, "mlp-wide")
    assert _run("down", "--state-dir", str(state)).returncode == 0
    assert LocalProvider(state / "local").list_instances(CLUSTER) == []


@pytest.mark.slow
def test_up_detached_serves_and_down_stops_it(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    try:
        started = _run("up", "-d", "-q", "--state-dir", str(state), "--interval-s", "1",
                       "--max-gpu-slots", "2", timeout_s=150)  # fmt: skip
        assert started.returncode == 0, started.stdout + started.stderr
        record = json.loads((state / "up.json").read_text())
        assert f"pid {record['pid']}" in started.stdout and str(state / "up.log") in started.stdout
        assert os.getpgid(record["pid"]) != os.getpgid(0)  # its own session
        assert "--quiet" in record["cmdline"] and "--detach" not in record["cmdline"]
        submitted = _run("submit", "examples/jobs/mlp-small.yaml", "--state-dir", str(state))
        assert submitted.returncode == 0, submitted.stderr  # it serves
        status = _run("status", "--json", "--state-dir", str(state))
        assert status.returncode == 0 and "mlp-small" in status.stdout, status.stderr
        down = _run("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stdout + down.stderr
        deadline = time.monotonic() + 30
        while (PROC_ROOT / str(record["pid"])).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not (PROC_ROOT / str(record["pid"])).exists() or _zombie(record["pid"])
        assert "up at http" in (state / "up.log").read_text()
        assert LocalProvider(state / "local").list_instances(CLUSTER) == []
    finally:
        up_file = state / "up.json"
        if up_file.exists():
            os.kill(json.loads(up_file.read_text())["pid"], signal.SIGKILL)
        LocalProvider(state / "local").down(CLUSTER)


def _zombie(pid: int) -> bool:
    try:
        return (PROC_ROOT / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_brought_down_store_with_unfinished_jobs_starts_only_when_resumed(
    tmp_path: Path,
) -> None:
    """The rule in the service (run_up), whatever the caller: a store marked down with a
    queued job is refused, naming the job and --resume; resumed, it starts and is no longer
    down; a store marked down with no unfinished job starts without asking."""
    state = tmp_path / "state"
    clock = SystemClock()
    with Store.create(state / "store.db", CLUSTER, clock) as store:
        store.add_job("bert", JobSubmission("bert", 64, 512, 64, command=("t.py",)).to_json())
        store.set_down(True)
    stopped = threading.Event()
    stopped.set()  # starts, serves, and stops at once
    with pytest.raises(BroughtDownError) as refused:
        run_up(UpConfig(state), stopped)
    assert refused.value.jobs == ("bert",)
    assert "bert" in str(refused.value) and "--resume" in str(refused.value)
    assert not (state / "up.json").exists()
    with Store.open_read_only(state / "store.db", clock) as store:
        assert store.down_at_s() is not None
    report = run_up(UpConfig(state, resume=True), stopped)
    assert not report.released
    with Store.open(state / "store.db", clock) as store:
        assert store.down_at_s() is None
        job = store.get_job("bert")
        store.update_job("bert", job.version, status=JobStatus.CANCELLED)
        store.set_down(True)
    assert not run_up(UpConfig(state), stopped).released  # nothing to relaunch: no question
    with Store.open_read_only(state / "store.db", clock) as store:
        assert store.down_at_s() is None
