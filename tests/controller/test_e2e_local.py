"""The whole loop on the local provider: the controller service, agents on local instances,
real torchrun jobs, an injected spot preemption, and nothing left behind.

Two small real PyTorch jobs (``examples/jobs/mlp-*.yaml``) are submitted through the API. Once
the second has reported progress, its instance gets a 30 s spot notice (the local provider's
``preempt``, from another process as a cloud would): its agent stops the job with a checkpoint,
the controller drains the instance and places the job again, and it resumes from the
checkpoint. Both jobs must finish, the preempted one having resumed from a step > 0 (its log
says so), and after the service stops no instance and no process of its agents is left.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from autoscaler.controller.api import ApiClient, load_tokens
from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.loop import DownReport
from autoscaler.controller.service import UpConfig, run_up
from autoscaler.controller.store import Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import PROC_ROOT, read_proc_strings

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc"),
]


def _agent_processes(keys: set[str]) -> list[int]:
    out = []
    for entry in PROC_ROOT.iterdir():
        if entry.name.isdigit():
            env = read_proc_strings(int(entry.name), "environ", settle=False)
            if any(f"COADAPT_AGENT_ID={k}".encode() in env for k in keys):
                out.append(int(entry.name))
    return out


def test_two_jobs_and_a_spot_preemption_on_the_local_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from providers.local import LocalProvider

    monkeypatch.chdir(ROOT)  # the job specs name examples/elastic_mlp.py from the repo root
    state = tmp_path / "state"
    stop, ready = threading.Event(), list[str]()
    result: dict[str, DownReport] = {}
    cfg = UpConfig(state, interval_s=2.0, max_instances=3, max_gpu_slots=4)
    thread = threading.Thread(
        target=lambda: result.setdefault("down", run_up(cfg, stop, on_ready=ready.append))
    )
    thread.start()
    keys: set[str] = set()
    try:
        deadline = time.monotonic() + 30
        while not ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready, "the service did not come up"
        user = ApiClient(ready[0], load_tokens(state / "tokens.json").user, timeout_s=10)
        small = load_job_spec(ROOT / "examples/jobs/mlp-small.yaml").submission()
        medium = load_job_spec(ROOT / "examples/jobs/mlp-medium.yaml").submission()
        user.submit_job(small)
        user.submit_job(medium)
        preempted: str | None = None
        seen_before: dict[str, int] = {}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            jobs = {j.name: j for j in user.list_jobs()}
            keys |= {k for j in jobs.values() for k in j.assignment}
            target = jobs[medium.name]
            if (
                preempted is None
                and target.progress is not None
                and target.progress.progress > 0
                and target.assignment
            ):
                victim = sorted(target.assignment)[0]
                row = next(r for r in user.list_instances() if r.instance_key == victim)
                assert row.provider_instance_id is not None
                seen_before = {k: user.job_logs(medium.name, instance=k).next_offset for k in keys}
                LocalProvider(state / "local").preempt(row.provider_instance_id, notice_s=30.0)
                preempted = victim
            if all(str(j.status) in ("completed", "failed") for j in jobs.values()):
                break
            time.sleep(1.0)
        statuses = {j.name: str(j.status) for j in user.list_jobs()}
        assert statuses == {small.name: "completed", medium.name: "completed"}, statuses
        assert preempted is not None, "the job finished before it could be preempted"
        # It went on elsewhere after the notice, from the checkpoint it wrote then.
        elsewhere = "".join(
            user.job_logs(medium.name, seen_before.get(key, 0), instance=key).text
            for key in sorted(keys - {preempted})
        )
        resumed = [int(n) for n in re.findall(r"coadapt: resumed from step (\d+)", elsewhere)]
        assert resumed and max(resumed) > 0, elsewhere[-2000:]
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert result["down"].clean
    assert LocalProvider(state / "local").list_instances("coadapt-local") == []
    deadline = time.monotonic() + 10
    while _agent_processes(keys) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _agent_processes(keys) == []
    with Store.open(state / "store.db", FakeClock()) as store:
        reasons = [h.reason for h in store.history(preempted)]
    assert "spot interruption notice" in reasons, reasons  # drained for the notice
