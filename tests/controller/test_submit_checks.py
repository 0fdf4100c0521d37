"""A user's first hour (issue 41): submit checks the script where the spec says it is, and a
failure is told truly. Real processes throughout: the `coadapt` CLI, the launcher under
torchrun (gloo), `coadapt up` on the local provider, SQLite stores.

* a spec's script is its folder's: submitted from any folder, it runs; a missing one is
  refused at submit, with the fix;
* a launcher usage error (exit status 2) is not retried: one attempt, the reason says it is
  deterministic; `coadapt retry` is an event;
* a script that raised in its training loop is reported so, with its own exception line;
* `coadapt logs` shows a repeated torchrun traceback as one line, the script's output whole.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.controller.agent import deterministic_reason, failure_cause
from autoscaler.controller.store import Store
from coadapt_common.clock import SystemClock
from tests.trainer.harness import Cluster, base_env

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]
ENV = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PYTHONPATH": str(ROOT)}

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc")


def _run(*args: str, cwd: Path = ROOT, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COADAPT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, env=ENV
    )


SPEC = """\
name: {name}
command: [{script}, --epochs, 1]
gpus: {{min: 1, max: 1}}
batch_size: {{initial: 32, max: 32}}
local_batch_size: {{max: 32}}
"""


def test_a_missing_script_is_refused_at_submit_with_the_fix(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "job.yaml").write_text(SPEC.format(name="job", script="train.py"))
    (tmp_path / "train.py").write_text("print('not the spec folder's')\n")  # the cwd's: not it
    out = _run("submit", str(specs / "job.yaml"), "--state-dir", str(tmp_path / "c"), cwd=tmp_path)
    assert out.returncode == 2, out
    (line,) = out.stderr.splitlines()
    assert line == (
        f"coadapt: {specs / 'job.yaml'}:2 [command[0]]: train.py: no such file "
        f"({specs / 'train.py'}); give its path relative to the spec's folder ({specs}) or an "
        "absolute one"
    )
    (specs / "lib").mkdir()
    (specs / "job.yaml").write_text(SPEC.format(name="job", script="lib"))
    out = _run("submit", str(specs / "job.yaml"), "--state-dir", str(tmp_path / "c"), cwd=tmp_path)
    assert out.returncode == 2 and "lib: is a folder, not a script" in out.stderr, out


def test_the_script_is_the_spec_folders_whatever_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoscaler.controller.jobspec import load_job_spec

    monkeypatch.chdir(tmp_path)  # not the checkout
    spec = load_job_spec(ROOT / "examples/jobs/mlp-small.yaml")
    assert spec.command[0] == str(ROOT / "examples/elastic_mlp.py")
    assert spec.command[1:4] == ("--epochs", "16", "--num-samples")  # as written


def test_a_usage_error_or_a_missing_module_is_deterministic(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(
        "[rank0]: ValueError: an older try's exception\n"
        "coadapt-launch: failed: script: /nowhere/train.py: no such file\n"
    )
    cause = failure_cause(log, 2)
    assert cause == (
        "exit status 2: script: /nowhere/train.py: no such file (deterministic: "
        "the launcher refused the job's command (exit status 2); not retried)"
    )
    assert deterministic_reason(2, cause) is not None
    log.write_text(
        "[rank0]: ModuleNotFoundError: No module named 'transformerz'\n"
        "torch.distributed.elastic.rendezvous.api.RendezvousClosedError\n"
        "coadapt-launch: failed: the script failed before trainer.init (no exit marker)\n"
    )
    cause = failure_cause(log, 1)
    assert cause.startswith(
        "exit status 1: the script failed before trainer.init (no exit marker): "
        "ModuleNotFoundError: No module named 'transformerz' (deterministic: "
    ), cause
    assert deterministic_reason(1, "exit status 1: ValueError: bad batch") is None


# Two tries of a job as the launcher logs them (trimmed from a real run: torchrun 2.13 under
# the preload server): the script's own traceback, then torchrun's ChildFailedError traceback
# and its summary, each time.
def _try(n: int) -> str:
    return f"""\
[rank0]: Traceback (most recent call last):
[rank0]:   File "train.py", line 11, in <module>
[rank0]:     raise ValueError("bad value in batch {n}")
[rank0]: ValueError: bad value in batch {n}
E1207 05:57:24.972000 24785 torch/distributed/elastic/multiprocessing/api.py:1002] failed
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1019, in run
    elastic_launch(
  File "/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in f
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:{" "}
============================================================
trainer.preload FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 2479{n})
============================================================
2026-12-07 05:57:26,216 coadapt-launch WARNING worker failure {n} of 3 allowed; relaunching
"""


def test_logs_show_a_repeated_torchrun_traceback_as_one_line(tmp_path: Path) -> None:
    state = tmp_path / "cluster"
    state.mkdir()
    from autoscaler.controller.jobbook import JobSubmission

    job = JobSubmission("broken", 32, 32, 32, command=("train.py",))
    with Store.create(state / "store.db", "c1", SystemClock()) as store:
        store.add_job(job.name, job.to_json())
    (state / "logs" / "broken").mkdir(parents=True)
    log = _try(1) + _try(2) + _try(3)
    (state / "logs" / "broken" / "i-0.log").write_text(log)
    out = _run("logs", "broken", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert out.stdout.startswith(_try(1))  # the first try whole
    for n in (1, 2, 3):  # the script's own traceback whole, every time
        assert f"[rank0]: ValueError: bad value in batch {n}" in lines
        assert f'[rank0]:     raise ValueError("bad value in batch {n}")' in lines
    note = (
        "[coadapt logs: torchrun's ChildFailedError traceback again, as above: 13 lines left "
        "out; --raw shows them]"
    )
    assert lines.count(note) == 2
    assert out.stdout.count("Root Cause") == 1
    assert len(lines) == len(log.splitlines()) - 2 * 12
    raw = _run("logs", "broken", "--raw", "--state-dir", str(state))
    assert raw.stdout == log


LOOP_CRASH = """\
import torch
import trainer

job = trainer.init(8)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ddp, optimizer = job.prepare(model, optimizer)
loader = job.data_loader(torch.utils.data.TensorDataset(torch.randn(64, 2), torch.randn(64, 1)))
job.restore()
for epoch in job.epochs(2):
    for x, y in loader:
        if job.step == 2:
            raise ValueError("a NaN in batch 2 of the data")
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
job.finish()
"""


@pytest.mark.slow
def test_a_crash_in_the_training_loop_is_told_with_its_own_exception_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "loop_crash.py").write_text(LOOP_CRASH)
    cluster = Cluster(tmp_path, base_env())
    try:
        launch = cluster.launch(
            "crash", ["--job-id", "crash", "--nproc-per-node", "1", "--max-restarts", "0",
                      "--", "loop_crash.py"],
        )  # fmt: skip
        assert launch.wait(120) == 1
    finally:
        cluster.close()
    text = launch.text()
    assert "no exit marker" not in text
    assert failure_cause(launch.output, 1) == (
        "exit status 1: the script raised in its training loop at step 2: "
        "ValueError: a NaN in batch 2 of the data"
    )


def _up_url(state: Path) -> str | None:
    try:
        return str(json.loads((state / "up.json").read_text())["url"])
    except (OSError, ValueError, KeyError):
        return None


def _jobs(state: Path) -> dict[str, dict]:
    out = _run("status", "--json", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    return {j["name"]: j for j in json.loads(out.stdout)["jobs"]}


@pytest.mark.slow
def test_submit_from_another_folder_runs_and_a_usage_error_is_not_retried(
    tmp_path: Path,
) -> None:
    from autoscaler.controller.api import ApiClient, load_tokens
    from autoscaler.controller.jobbook import JobSubmission

    state, up_dir, user_dir = tmp_path / "cluster", tmp_path / "up", tmp_path / "user"
    up_dir.mkdir()
    user_dir.mkdir()
    small = ROOT / "examples/jobs/mlp-small.yaml"
    argv = ["up", "--state-dir", str(state), "--interval-s", "1", "--max-gpu-slots", "2"]
    up = subprocess.Popen(  # from a folder that has no examples/
        [*COADAPT, *argv], cwd=up_dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=ENV,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while _up_url(state) is None and time.monotonic() < deadline:
            assert up.poll() is None
            time.sleep(0.2)
        url = _up_url(state)
        assert url is not None
        out = _run("submit", str(small), "--state-dir", str(state), cwd=user_dir)
        assert out.returncode == 0, out.stderr
        # the API takes any command: a script missing where the node runs it is the
        # launcher's usage error (exit status 2)
        user = ApiClient(url, load_tokens(state / "tokens.json").user, timeout_s=10)
        user.submit_job(JobSubmission("gone", 32, 32, 32, command=("/nowhere/train.py",)))
        deadline = time.monotonic() + 240
        jobs = _jobs(state)
        while time.monotonic() < deadline and not (
            jobs["mlp-small"]["status"] == "completed" and jobs["gone"]["status"] == "failed"
        ):
            assert jobs["mlp-small"]["status"] not in ("failed", "refused"), jobs["mlp-small"]
            time.sleep(1)
            jobs = _jobs(state)
        assert jobs["mlp-small"]["status"] == "completed", jobs["mlp-small"]
        gone = jobs["gone"]
        assert (gone["status"], gone["retries"]) == ("failed", 1), gone
        assert gone["reason"].startswith("exit status 2: script: /nowhere/train.py: no such file")
        assert "(deterministic: the launcher refused the job's command" in gone["reason"]
        out = _run("retry", "gone", "--state-dir", str(state))
        assert out.returncode == 0, out.stderr
        deadline = time.monotonic() + 30
        events = ""
        while "retry" not in events and time.monotonic() < deadline:
            time.sleep(1)
            events = _run("events", "--state-dir", str(state)).stdout
        assert "queued again by a user (it had failed: exit status 2" in events, events
    finally:
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)
            up.wait(timeout=120)


def test_a_deployed_clusters_spec_keeps_its_paths_as_written(tmp_path: Path) -> None:
    """A deployed cluster's nodes run the script from their own disks: nothing is resolved or
    checked on the submitting machine (``coadapt submit`` to a ``deploy.json`` folder)."""
    from autoscaler.controller.jobspec import load_job_spec

    (tmp_path / "job.yaml").write_text(SPEC.format(name="job", script="/opt/models/train.py"))
    assert load_job_spec(tmp_path / "job.yaml", resolve=False).command[0] == "/opt/models/train.py"
    with pytest.raises(Exception, match="no such file"):
        load_job_spec(tmp_path / "job.yaml")
