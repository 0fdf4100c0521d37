"""The whole loop on the local provider: the controller service, agents on local instances,
real torchrun jobs, an injected spot preemption, and nothing left behind.

Two small real PyTorch jobs (``examples/jobs/mlp-*.yaml``) are submitted through the API. Once
the second has reported progress, its instance gets a 30 s spot notice (the local provider's
``preempt``, from another process as a cloud would): its agent stops the job with a checkpoint,
the controller drains the instance and places the job again, and it resumes from the
checkpoint. Both jobs must finish; the preempted one was drained for the notice and resumed from
its checkpoint (its first report after the notice is at or past the step and sample position of
its last one before: the trainer's state, not a log line); every instance that ran is billed at
its price for its life; and after the service stops no instance and no process of its agents is
left. (Rescales across GPU counts are test_e2e_coadapt.py's.)
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time
from pathlib import Path

import pytest

from autoscaler.accounting.billing import job_costs
from autoscaler.controller.api import ApiClient, load_tokens
from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.service import UpConfig, UpReport, run_up
from autoscaler.controller.store import Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import PROC_ROOT, read_proc_strings
from trainer.report import TrainerReport

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
    result: dict[str, UpReport] = {}
    cfg = UpConfig(state, interval_s=2.0, max_instances=3, max_gpu_slots=4, release_on_stop=True)
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
        command = list(medium.command)  # more epochs than the example: time to rescale first
        command[command.index("--epochs") + 1] = "6"
        # Per sample, a sleep as an accelerator's work would be: the job lasts long enough for
        # the notice to land while it trains however loaded the host is (its training was
        # done before the notice was read on a loaded machine), and a narrower MLP spares CPU.
        command[command.index("--hidden") + 1] = "64"
        command[command.index("--num-samples") + 1] = "16384"
        command += ["--sample-delay-s", "0.0005"]
        medium = dataclasses.replace(medium, command=tuple(command))
        user.submit_job(small)
        user.submit_job(medium)
        preempted: str | None = None
        preempted_at = 0.0
        seen_before: dict[str, int] = {}
        submitted = time.monotonic()
        deadline = submitted + 300
        while time.monotonic() < deadline:
            jobs = {j.name: j for j in user.list_jobs()}
            keys |= {k for j in jobs.values() for k in j.assignment}
            target = jobs[medium.name]
            if (
                preempted is None
                and target.report is not None
                and target.report.progress > 0
                and target.assignment
            ):
                # An instance of it still running (one already draining for cost may be gone
                # before its notice is read); none: tried again at the next poll.
                listed = {r.instance_key: r for r in user.list_instances()}
                running = [
                    k
                    for k in sorted(target.assignment)
                    if k in listed and str(listed[k].status) == "running"
                ]
                if running:
                    victim = running[0]
                    pid = listed[victim].provider_instance_id
                    assert pid is not None
                    seen_before = {
                        k: user.job_logs(medium.name, instance=k).next_offset for k in keys
                    }
                    LocalProvider(state / "local").preempt(pid, notice_s=30.0)
                    preempted, preempted_at = victim, time.time()
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
        if not (resumed and max(resumed) > 0):  # say what happened instead (a timing flake)
            there = user.job_logs(medium.name, instance=preempted).text
            pytest.fail(
                f"no resume elsewhere after the notice on {preempted}; keys {sorted(keys)}; "
                f"instances {[(r.instance_key, str(r.status)) for r in user.list_instances()]}; "
                f"elsewhere: {elsewhere[-1500:]!r}; on the noticed one: {there[-2500:]!r}"
            )
        # Each agent was given its own credential, in its own file, and nothing else.
        secrets = load_tokens(state / "tokens.json")
        for key in keys:
            own = json.loads((state / "agents" / key / "agent-token.json").read_text())
            assert own == {"agent": secrets.agent_credential(key)}
            assert secrets.user not in json.dumps(own)
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
        _, reports = store.reports_after(0)
        instances = store.list_instances()
        costs = store.cost_records()
        spans = store.assignment_history()
    assert "spot interruption notice" in reasons, reasons  # drained for the notice
    # Resumed from its checkpoint, from the trainer's own state: the first launch after the
    # notice starts at (or past) the step and sample position it had reached before it.
    mine = [TrainerReport.from_json(p) for job, p in reports if job == medium.name]
    before = [r for r in mine if r.started_at_s < preempted_at]
    after = [r for r in mine if r.started_at_s >= preempted_at]
    assert before and after
    last, first = before[-1], min(after, key=lambda r: (r.started_at_s, r.sent_at_s))
    assert last.step > 0 and first.step >= last.step
    assert (first.epoch, first.epoch_position) >= (last.epoch, last.epoch_position)
    # Every instance that ran is billed at its price for its life: whole seconds, at least
    # 60 (autoscaler/market/terms.py billed_seconds).
    ran = {r.instance_key: r for r in instances if r.provider_instance_id is not None}
    assert {c.instance_key for c in costs} == set(ran)
    for c in costs:
        hours = max(60.0, math.ceil(c.end_s - c.start_s)) / 3600.0
        assert c.usd == pytest.approx(ran[c.instance_key].price_usd_per_hour * hours)
    # ... and that cost, split by the GPU-time each job held, lists both jobs; the jobs and
    # the idle rest sum to the total to the cent.
    by_job = job_costs(costs, spans, {k: r.gpus for k, r in ran.items()}, time.time())
    assert by_job[small.name] > 0 and by_job[medium.name] > 0
    assert round(sum(by_job.values()), 2) == round(sum(c.usd for c in costs), 2)
