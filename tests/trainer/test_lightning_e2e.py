"""A Lightning job on the running local cluster, co-adapted like our own loop (issue 38).

A real ``coadapt up`` (``run_up``) on the local provider (one 2-slot spot instance, held as a
fixed fleet), agents, real torchrun jobs (gloo), both jobs ``examples/lightning_classifier.py``
(a ``LightningModule`` trained by ``lightning.Trainer`` through
``trainer.integrations.lightning``):

* ``lit`` (``examples/jobs/lightning-classifier.yaml``, longer, its batch held at 64): runs on
  2 processes; when ``rebatch`` arrives it is rescaled to 1, and back to 2 when ``rebatch`` is
  done; then its instance gets a spot notice and it resumes on the next one. Every sample of
  every epoch is trained exactly once, and its final weights equal an uninterrupted plain-torch
  run over the same global batches (float64). ``coadapt status --json`` shows its declared
  ``target_progress``, remaining work that falls, its batch size and its restarts.
* ``rebatch`` (``gpus.max: 1``, noisy labels, a fixed cost per step): the policy re-batches it
  while its GPU count stays 1; the trainer adopts the planned batch from its next agreed
  optimizer step without a relaunch (the same launch start and launcher attempt before and after),
  with AdaScale's learning-rate factor in ``(1, r]``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from autoscaler.controller.api import ApiClient, load_tokens
from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.service import UpConfig, UpReport, run_up
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import PROC_ROOT
from tests.trainer.harness import ROOT, iter_micro_records, read_jsonl
from trainer.report import TrainerReport

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc"),
]

EXAMPLE = ROOT / "examples" / "lightning_classifier.py"
# lit: 160 steps of 64 samples with a sleep per sample (as an accelerator's work: a second
# replica halves it, and the host's CPU stays free), ~0.94 s per step on one slot: time for a
# rescale down, up, and a spot notice, each with its restart, on a loaded 2-core host (in the
# run that settled these figures the notice came at step 65).
LIT_SAMPLES, LIT_EPOCHS, LIT_SEED = 1024, 10, 3
LIT_SAMPLE_DELAY_S = 240.0 / (LIT_SAMPLES * 16)


def _coadapt(*args: str, state: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "autoscaler.cli", *args, "--state-dir", str(state)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_a_lightning_job_is_rescaled_preempted_and_rebatched_on_the_local_cluster(
    tmp_path: Path, jobs_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from providers.local import LocalProvider

    monkeypatch.chdir(ROOT)  # the specs name examples/lightning_classifier.py from the root
    # The jobs write their sample logs and weights where their own users may write.
    state, logs = tmp_path / "state", jobs_tmp_path / "trainer-logs"
    p0, p1 = jobs_tmp_path / "initial.pt", jobs_tmp_path / "final.pt"
    logs.mkdir(mode=0o1777)  # each job (its own user) makes its folder in it
    logs.chmod(0o1777)  # whatever the umask
    lit = load_job_spec(ROOT / "examples/jobs/lightning-classifier.yaml").submission()
    lit_command = (
        "examples/lightning_classifier.py", "--epochs", str(LIT_EPOCHS), "--num-samples",
        str(LIT_SAMPLES), "--initial-batch-size", "64", "--dtype", "float64",
        "--seed", str(LIT_SEED), "--sample-delay-s", f"{LIT_SAMPLE_DELAY_S:.6f}",
        "--log-dir", str(logs / "lit"), "--initial-params", str(p0), "--final-params", str(p1),
    )  # fmt: skip
    # held at its initial batch (max 64): the plain-torch reference applies
    lit = dataclasses.replace(lit, name="lit", max_batch_size=64, command=lit_command)
    rebatch_command = (
        "examples/lightning_classifier.py", "--epochs", "40", "--num-samples", "512",
        "--initial-batch-size", "16", "--label-noise", "0.6", "--step-delay-s", "0.03",
        "--gns-every", "2", "--log-dir", str(logs / "rebatch"),
    )  # fmt: skip
    rebatch = dataclasses.replace(
        lit,
        name="rebatch",
        init_batch_size=16,
        max_batch_size=512,
        max_local_bsz=512,
        max_gpus=1,
        command=rebatch_command,
    )
    stop, ready = threading.Event(), list[str]()
    result: dict[str, UpReport] = {}
    cfg = UpConfig(
        state,
        interval_s=2.0,
        max_gpu_slots=2,
        report_interval_s=2.0,
        fixed_fleet=(("local/local-2gpu/local-a/spot", 1),),
        release_on_stop=True,
    )
    thread = threading.Thread(
        target=lambda: result.setdefault("down", run_up(cfg, stop, on_ready=ready.append))
    )
    thread.start()
    remaining: list[float] = []
    world_sizes: list[int] = []  # lit's, as its reports say, in order
    docs: list[dict] = []
    preempted: str | None = None
    try:
        deadline = time.monotonic() + 30
        while not ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready, "the service did not come up"
        user = ApiClient(ready[0], load_tokens(state / "tokens.json").user, timeout_s=10)
        user.submit_job(lit)
        submitted_rebatch = False
        deadline = time.monotonic() + 720
        while time.monotonic() < deadline:
            jobs = {j.name: j for j in user.list_jobs()}
            job = jobs["lit"]
            doc = job.to_dict()
            if doc["remaining_progress"] is not None:
                remaining.append(doc["remaining_progress"])
            if job.report is not None and (
                not world_sizes or world_sizes[-1] != job.report.world_size
            ):
                world_sizes.append(job.report.world_size)
            if not submitted_rebatch and world_sizes[-1:] == [2]:
                user.submit_job(rebatch)  # it needs a slot: lit goes 2 -> 1
                submitted_rebatch = True
            back_to_two = (
                submitted_rebatch
                and jobs.get("rebatch") is not None
                and jobs["rebatch"].status is JobStatus.COMPLETED
                and world_sizes[-3:] == [2, 1, 2]
            )
            if preempted is None and back_to_two and job.assignment:
                docs.append(json.loads(_coadapt("status", "--json", state=state)))
                listed = {r.instance_key: r for r in user.list_instances()}
                running = [k for k in sorted(job.assignment) if k in listed]
                if running:
                    pid = listed[running[0]].provider_instance_id
                    assert pid is not None
                    LocalProvider(state / "local").preempt(pid, notice_s=30.0)
                    preempted = running[0]
            if all(j.status in (JobStatus.COMPLETED, JobStatus.FAILED) for j in jobs.values()):
                break
            time.sleep(1.0)
        docs.append(json.loads(_coadapt("status", "--json", state=state)))
        final = {j.name: j for j in user.list_jobs()}
        statuses = {name: str(j.status) for name, j in final.items()}
        assert statuses == {"lit": "completed", "rebatch": "completed"}, (statuses, world_sizes)
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert result["down"].clean
    assert preempted is not None, f"never back on 2 after the rescale: {world_sizes}"

    # lit went 2 -> 1 -> 2 and then through a spot notice (its store history says so).
    assert "2,1,2" in ",".join(map(str, world_sizes)), world_sizes
    with Store.open(state / "store.db", FakeClock()) as store:
        _, raw = store.reports_after(0)
        reasons = [h.reason for h in store.history(preempted)]
    assert "spot interruption notice" in reasons, reasons
    reports: dict[str, list[TrainerReport]] = defaultdict(list)
    for name, payload in raw:
        reports[name].append(TrainerReport.from_json(payload))

    # status --json: the declared length, falling remaining work, batch size and restarts.
    mid = next(j for j in docs[0]["jobs"] if j["name"] == "lit")
    assert mid["target_progress"] == pytest.approx(LIT_EPOCHS * LIT_SAMPLES / 64)
    assert mid["batch_size"] == 64 and mid["restarts"] >= 2, mid
    assert remaining[0] > mid["remaining_progress"] > remaining[-1] == 0.0
    end = next(j for j in docs[-1]["jobs"] if j["name"] == "lit")
    assert end["status"] == "completed" and end["restarts"] >= 3, end

    # Every sample of every epoch exactly once, over both world sizes; the final weights equal
    # a plain-torch run over the same global batches (float64; batch held at 64: factor 1).
    by_step: dict[int, list[int]] = defaultdict(list)
    seen: dict[int, list[int]] = defaultdict(list)
    sizes = set()
    for r in iter_micro_records(logs / "lit"):
        by_step[r["step"]].extend(r["ids"])
        seen[r["epoch"]].extend(r["ids"])
        sizes.add(r["world_size"])
    assert sizes == {1, 2}
    assert sorted(seen) == list(range(LIT_EPOCHS))
    for epoch, ids in seen.items():
        assert sorted(ids) == list(range(LIT_SAMPLES)), f"epoch {epoch}"
    stops = [e for e in read_jsonl(logs / "lit") if e.get("event") == "stopped"]
    assert len({e["step"] for e in stops}) >= 3, stops  # down, up, notice
    spec = importlib.util.spec_from_file_location("lit_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    args = ex.parse_args(["--num-samples", str(LIT_SAMPLES), "--seed", str(LIT_SEED),
                          "--dtype", "float64"])  # fmt: skip
    dataset, model = ex.build(args)
    model.load_state_dict(torch.load(p0))
    opt = model.configure_optimizers()
    for s in sorted(by_step):
        ids = torch.tensor(by_step[s])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(dataset.x[ids]), dataset.y[ids]).backward()
        opt.step()
    trained = torch.load(p1)
    for name, ref in model.state_dict().items():
        torch.testing.assert_close(trained[name], ref, rtol=1e-9, atol=1e-11)

    # rebatch: re-batched within one launch (same start and attempt), AdaScale factor in (1, r].
    launches: dict[tuple[float, int], list[int]] = defaultdict(list)
    for r in reports["rebatch"]:
        launches[(r.started_at_s, r.attempt)].append(r.batch.global_batch_size)
    rebatched = [b for b in launches.values() if b[0] == 16 and max(b) > 16]
    assert rebatched, f"no launch re-batched without a relaunch: {dict(launches)}"
    for r in reports["rebatch"]:
        if r.batch.global_batch_size > 16 and r.lr_scale is not None:
            assert 1.0 < r.lr_scale <= r.batch.global_batch_size / 16 + 1e-9, r
