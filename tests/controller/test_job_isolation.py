"""Jobs cannot read the control plane's secrets (issue 37, item 2): each job of the local
provider runs as its own unprivileged user (``coadapt_common.jobexec``), sees its checkpoint
folder through a mount of its own, and gets a permission error on ``tokens.json``, the store
and every agent's credentials; what it owns (checkpoints, home, report credential) it may use.
The end-to-end test runs a real ``coadapt up`` (root only: this machine and CI run as root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autoscaler.controller.service import ServiceError, job_isolation
from coadapt_common.jobexec import (
    JOB_UID_BASE,
    JOB_UID_SPAN,
    job_uid,
    probe,
    unreachable_by_others,
)

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
PROBE = "tests/controller/jobs/probe_secrets.py"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="jobs get users of their own as root")


def test_each_job_name_has_its_own_uid_in_a_range_no_account_uses() -> None:
    uids = {job_uid(f"job-{i}") for i in range(1000)}
    assert len(uids) == 1000
    assert all(JOB_UID_BASE <= u < JOB_UID_BASE + JOB_UID_SPAN < 2**31 for u in uids)
    assert job_uid("mlp-small") == job_uid("mlp-small")  # every node, every relaunch


def test_what_other_users_cannot_reach_is_named(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    script = open_dir / "train.py"
    script.write_text("")
    os.chmod(tmp_path, 0o755)
    os.chmod(open_dir, 0o755)
    os.chmod(script, 0o644)
    blocked = [p for p in tmp_path.parents if not p.stat().st_mode & stat.S_IXOTH]
    expected = blocked[-1] if blocked else None  # the outermost closed parent is met first
    assert unreachable_by_others(script) == expected
    os.chmod(open_dir, 0o750)
    assert unreachable_by_others(script) == (expected or open_dir)
    os.chmod(open_dir, 0o755)
    os.chmod(script, 0o600)
    assert unreachable_by_others(script) == (expected or script)


def test_the_isolation_is_chosen_and_said_in_one_line() -> None:
    def works() -> None:
        return None

    iso = job_isolation("auto", euid=0, probe=works)
    assert iso.isolated and "\n" not in iso.line and "out of its reach" in iso.line
    user = job_isolation("auto", euid=1000, probe=works)
    assert not user.isolated and "can read its state folder" in user.line
    assert "only root" in user.line
    with pytest.raises(ServiceError, match="--job-isolation user: only root"):
        job_isolation("user", euid=1000, probe=works)
    assert not job_isolation("none", euid=0, probe=works).isolated
    # root in a container that allows no mount namespace: said, or refused when required
    denied = "coadapt jobexec: cannot run the job as uid 1900000000: unshare: not permitted"
    boxed = job_isolation("auto", euid=0, probe=lambda: denied)
    assert not boxed.isolated and boxed.line.endswith(denied)
    with pytest.raises(ServiceError, match="failed here: coadapt jobexec"):
        job_isolation("user", euid=0, probe=lambda: denied)


@needs_root
def test_isolation_works_on_this_machine() -> None:
    assert probe() is None  # CI and this machine run as root with mount namespaces


@needs_root
def test_jobexec_drops_to_the_jobs_user_and_mounts_only_its_folder(tmp_path: Path) -> None:
    open_dir = Path(tempfile.mkdtemp())  # a folder open to all: only the file's mode guards it
    os.chmod(open_dir, 0o755)
    secret = open_dir / "secret"
    secret.write_text("admin token")
    os.chmod(secret, 0o600)
    own = tmp_path / "own"  # behind a closed parent (pytest's 0700 base folder)
    own.mkdir()
    uid = job_uid("jobexec-test")
    os.chown(own, uid, uid)
    target = Path(os.environ.get("TMPDIR", "/tmp")) / f"coadapt-test-mount-{os.getpid()}"
    target.mkdir()
    try:
        probe = (
            "import os, sys\n"
            "print(os.getuid(), os.getgid(), os.getgroups())\n"
            "open(os.path.join(sys.argv[2], 'ckpt'), 'w').write('x')\n"
            "try:\n    open(sys.argv[1]).read(); print('read')\n"
            "except PermissionError:\n    print('denied')\n"
            "try:\n    os.setuid(0); print('root again')\n"
            "except PermissionError:\n    print('no way back')\n"
        )
        out = subprocess.run(
            [sys.executable, "-m", "coadapt_common.jobexec", "--uid", str(uid), "--gid",
             str(uid), "--bind", str(own), str(target), "--expose", sys.base_prefix,
                 "--", sys.executable, "-c", probe,
             str(secret), str(target)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:3] == [f"{uid} {uid} []", "denied", "no way back"]
        assert (own / "ckpt").stat().st_uid == uid  # written through the mount, as the job
        assert not (target / "ckpt").exists()  # the mount was the job's alone
    finally:
        target.rmdir()
        shutil.rmtree(open_dir)
    refused = subprocess.run(
        [sys.executable, "-m", "coadapt_common.jobexec", "--uid", "0", "--gid", "0", "--",
         "true"], capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert refused.returncode == 2 and "not root" in refused.stderr


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@needs_root
@pytest.mark.skipif(unreachable_by_others(ROOT) is not None, reason="the repo is closed to others")
def test_a_job_gets_permission_errors_on_the_clusters_secrets(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    spec = tmp_path / "probe.yaml"
    spec.write_text(
        f"name: probe\ncommand: [{ROOT / PROBE}, {state}]\ngpus: {{min: 1, max: 1}}\n"
        "batch_size: {initial: 32, max: 32}\nlocal_batch_size: {max: 32}\n"
    )
    up = subprocess.Popen(
        [*COADAPT, "up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "1",
         "--job-isolation", "user"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    logs = ""
    try:
        deadline = time.monotonic() + 60
        while not (state / "up.json").exists() and time.monotonic() < deadline:
            assert up.poll() is None, up.stdout.read() if up.stdout else ""
            time.sleep(0.1)
        submitted = _run("submit", str(spec), "--state-dir", str(state))
        assert submitted.returncode == 0, submitted.stderr
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and "probe own-files" not in logs:
            time.sleep(1)
            logs = _run("logs", "probe", "--state-dir", str(state)).stdout
        down = _run("down", "--state-dir", str(state))
        assert down.returncode == 0, down.stderr
        assert up.wait(timeout=120) == 0
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(timeout=120)
    output = up.stdout.read() if up.stdout else ""
    assert "coadapt: each job runs as its own unprivileged user" in output, output
    found = dict(re.findall(r"^probe ([\w-]+): (.*)$", logs, re.M))
    assert found == {
        "tokens": "denied",
        "store": "denied",
        "agent-token": "denied",
        "job-credentials": "denied",
        "state-listing": "denied",
        "own-credential": "read",
        "own-files": f"written as uid {job_uid('probe')}",
    }, logs
    written = state / "checkpoints" / "probe" / "probe.txt"
    assert written.read_text() == "written by the job\n"
    assert written.stat().st_uid == job_uid("probe")
    assert json.loads((state / "tokens.json").read_text())  # still there, still root's
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    agent_logs = "".join(p.read_text() for p in (state / "local").rglob("agent.log"))
    left = list(Path("/tmp").glob("coadapt-job-probe-*"))
    assert not left, f"{left}\n{output}\n{agent_logs[-4000:]}"  # its own folder is gone
