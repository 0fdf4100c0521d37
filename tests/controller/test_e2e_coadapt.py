"""The running cluster carries out the whole plan, from what its trainers declare (issue 25).

A real ``coadapt up`` (``run_up``) on the local provider, agents, real torchrun jobs (gloo):

* ``noisy``: linear regression on noisy labels (its gradient noise scale rises as it
  converges), ``gpus.max: 1``. The policy re-batches it while its GPU count stays 1: the
  planned batch reaches the trainer in a report reply, the trainer adopts it without a
  relaunch (its launch's start time and attempt never change), its reports show the new batch,
  and the learning rate is scaled by AdaScale (the factor it applied lies in ``(1, r]``).
  It never runs on 2 GPUs (the store's assignment history says so).
* ``elastic`` (``gpus: {min: 1, max: 2}``) is rescaled across GPU counts and resumes at its
  exact sample: every sample of every epoch is trained exactly once, over both world sizes.
* ``fixed-two``: ``adaptive: false`` with ``gpus.min: 2`` and no ``batch_size.max`` or
  ``local_batch_size.max`` (their defaults for a fixed job) starts on 2 GPUs at its batch, one
  micro-batch a step; it declares no
  length: ``status --json`` shows ``target_progress`` null for it, and the declared one and
  its falling remaining work for the others, and an ETA (``eta_s``) by their fitted models
  while they run, none for it.
* ``too-big``: ``gpus: {min: 64, max: 128}`` is refused, with the reason, within a few rounds.

Every finished job stays finished (no launch after it reported done) and the fleet is gone at
the end.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from autoscaler.controller.api import ApiClient, load_tokens
from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.service import UpConfig, UpReport, run_up
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import PROC_ROOT
from tests.trainer.harness import iter_micro_records, read_jsonl
from trainer.report import TrainerReport

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc"),
]

# About a minute and a half of work on one slot, nearly all of it per-sample (a sleep per
# sample, as an accelerator's work: a second replica halves it, and the host's CPU stays free
# for the rest of the suite): what the goodput model fits from one GPU predicts a second one
# nearly doubles it, and when that fit exists (~15 s in) the job has the time left that a
# rescale needs to be worth its restart (10 s on this provider): more than ~40 s on one GPU.
ELASTIC_SAMPLES, ELASTIC_EPOCHS = 2048, 60
ELASTIC_SAMPLE_DELAY_S = 90.0 / (ELASTIC_SAMPLES * ELASTIC_EPOCHS)


def _spec(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _specs(folder: Path, logs: Path) -> dict[str, Path]:
    script = ROOT / "examples" / "elastic_mlp.py"
    return {
        "noisy": _spec(
            folder,
            "noisy",
            f"""name: noisy
command: [{script}, --epochs, 60, --num-samples, 1024, --hidden, 0, --dim, 8,
  --noise-std, 2.0, --initial-batch-size, 16, --lr, 0.02, --gns-every, 4,
  --step-delay-s, 0.02, --log-dir, {logs / "noisy"}]
gpus: {{min: 1, max: 1}}
batch_size: {{initial: 16, max: 512}}
local_batch_size: {{max: 512}}
""",
        ),
        "elastic": _spec(
            folder,
            "elastic",
            f"""name: elastic
command: [{script}, --epochs, {ELASTIC_EPOCHS}, --num-samples, {ELASTIC_SAMPLES},
  --initial-batch-size, 64, --dim, 16, --hidden, 32,
  --sample-delay-s, {ELASTIC_SAMPLE_DELAY_S:.6f}, --log-dir, {logs / "elastic"}]
gpus: {{min: 1, max: 2}}
batch_size: {{initial: 64, max: 64}}
local_batch_size: {{max: 64}}
""",
        ),
        "fixed-two": _spec(
            folder,
            "fixed-two",
            f"""name: fixed-two
command: [{script}, --epochs, 1, --num-samples, 1024, --initial-batch-size, 64, --no-declare]
gpus: {{min: 2}}
batch_size: {{initial: 64}}
adaptive: false
""",
        ),
        "too-big": _spec(
            folder,
            "too-big",
            f"""name: too-big
command: [{script}, --epochs, 1]
gpus: {{min: 64, max: 128}}
batch_size: {{initial: 64, max: 8192}}
local_batch_size: {{max: 64}}
""",
        ),
    }


def test_the_cluster_carries_out_the_whole_plan(
    tmp_path: Path, jobs_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the specs name examples/elastic_mlp.py from the repo root
    # the trainers' own logs: where the jobs, each run as its own user, may write
    state, logs = tmp_path / "state", jobs_tmp_path
    specs = _specs(tmp_path, logs)
    stop, ready = threading.Event(), list[str]()
    result: dict[str, UpReport] = {}
    cfg = UpConfig(  # one 4-slot instance, held whatever the jobs: a static cluster
        state,
        interval_s=2.0,
        max_gpu_slots=4,
        report_interval_s=2.0,
        fixed_fleet=(("local/local-4gpu/local-a/on-demand", 1),),
        release_on_stop=True,  # its fleet goes with it (as the demo's)
    )
    thread = threading.Thread(
        target=lambda: result.setdefault("down", run_up(cfg, stop, on_ready=ready.append))
    )
    thread.start()
    seen: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + 30
        while not ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready, "the service did not come up"
        user = ApiClient(ready[0], load_tokens(state / "tokens.json").user, timeout_s=10)
        for path in specs.values():
            user.submit_job(load_job_spec(path).submission())
        submitted = time.monotonic()
        refused_after: float | None = None
        deadline = submitted + 420
        while time.monotonic() < deadline:
            jobs = {j.name: j for j in user.list_jobs()}
            for name, job in jobs.items():
                seen.setdefault(name, {})
                doc = job.to_dict()
                if doc["remaining_progress"] is not None:
                    seen[name].setdefault("remaining", []).append(doc["remaining_progress"])
                if doc["target_progress"] is not None:
                    seen[name]["target"] = doc["target_progress"]
                if doc["eta_s"] is not None:
                    seen[name].setdefault("eta", []).append(doc["eta_s"] - doc["eta_at_s"])
            if refused_after is None and jobs["too-big"].status is JobStatus.REFUSED:
                refused_after = time.monotonic() - submitted
            if all(
                j.status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.REFUSED)
                for j in jobs.values()
            ):
                break
            time.sleep(1.0)
        final = {j.name: j for j in user.list_jobs()}
        statuses = {name: str(j.status) for name, j in final.items()}
        assert statuses == {
            "noisy": "completed",
            "elastic": "completed",
            "fixed-two": "completed",
            "too-big": "refused",
        }, statuses
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert result["down"].clean

    # Refused within a few rounds (2 s each), with the policy's reason in status.
    assert refused_after is not None and refused_after < 20, refused_after
    reason = final["too-big"].reason or ""
    assert "needs at least 64 GPUs" in reason and "holds 4" in reason, reason

    # Declared lengths: the target, and remaining work that falls to 0; none undeclared.
    assert "target" not in seen["fixed-two"] and "remaining" not in seen["fixed-two"]
    assert final["fixed-two"].to_dict()["target_progress"] is None
    assert final["fixed-two"].report is not None, "it reported, declaring nothing"
    for name in ("noisy", "elastic"):
        remaining = seen[name]["remaining"]
        assert seen[name]["target"] > 0 and remaining[0] > remaining[-1], (name, remaining)
    # ETAs by the fitted model, for a job that declared its length only (seconds left).
    assert "eta" not in seen["fixed-two"], seen["fixed-two"]
    etas = [left for name in ("noisy", "elastic") for left in seen[name].get("eta", [])]
    assert etas and all(0 <= left < 30 * 86_400 for left in etas), seen
    with Store.open(state / "store.db", FakeClock()) as store:
        _, raw = store.reports_after(0)
        spans = store.assignment_history()
    reports: dict[str, list[TrainerReport]] = defaultdict(list)
    for job, payload in raw:
        reports[job].append(TrainerReport.from_json(payload))
    gpus_by_start: dict[str, dict[float, int]] = defaultdict(lambda: defaultdict(int))
    for span in spans:
        gpus_by_start[span.job_name][span.from_s] += span.gpus

    # noisy: re-batched on one GPU within one launch (the same launch start and attempt
    # before and after: no relaunch), the learning rate scaled by AdaScale; never 2 GPUs.
    noisy = reports["noisy"]
    assert set(gpus_by_start["noisy"].values()) == {1}  # gpus.max: 1
    assert {r.world_size for r in noisy} == {1}
    launches: dict[tuple[float, int], list[int]] = defaultdict(list)
    for r in noisy:
        launches[(r.started_at_s, r.attempt)].append(r.batch.global_batch_size)
    rebatched = [b for b in launches.values() if b[0] == 16 and max(b) > 16]
    assert rebatched, f"no launch re-batched without a relaunch: {dict(launches)}"
    grown = [r for r in noisy if r.batch.global_batch_size > 16 and r.lr_scale is not None]
    for r in grown:
        ratio = r.batch.global_batch_size / 16
        assert r.lr_scale is not None and 1.0 < r.lr_scale <= ratio + 1e-9, (r.lr_scale, ratio)
    assert noisy[-1].done and noisy[-1].progress >= (noisy[-1].target_progress or 0)

    # elastic: rescaled across GPU counts (it trained on 1 and on 2: its own step logs say
    # so), every sample of every epoch trained exactly once.
    by_epoch: dict[int, list[int]] = defaultdict(list)
    sizes: set[int] = set()
    for record in iter_micro_records(logs / "elastic"):
        by_epoch[record["epoch"]].extend(record["ids"])
        sizes.add(record["world_size"])
    assert sizes >= {1, 2}, sizes
    assert sorted(by_epoch) == list(range(ELASTIC_EPOCHS))
    for epoch, ids in by_epoch.items():
        assert sorted(ids) == list(range(ELASTIC_SAMPLES)), f"epoch {epoch}"
    events = [r for r in read_jsonl(logs / "elastic") if "event" in r]
    stops = {e["step"] for e in events if e["event"] == "stopped"}
    restores = [e for e in events if e["event"] == "restored"]
    assert restores and all(e["step"] - 1 in stops or e["step"] in stops for e in restores)

    # fixed-two: started on exactly its 2 GPUs, never on other counts; its spec gives neither
    # batch_size.max nor local_batch_size.max, and it ran with their stated defaults
    # (docs/jobspec.md: batch_size.initial for both), at its batch, one micro-batch a step.
    assert set(gpus_by_start["fixed-two"].values()) == {2}
    fixed = final["fixed-two"].submission
    assert (fixed.max_batch_size, fixed.max_local_bsz) == (64, 64)
    assert {
        (r.world_size, r.batch.global_batch_size, r.batch.accum_steps) for r in reports["fixed-two"]
    } == {(2, 64, 1)}

    # A finished job stays finished: no launch after its trainer said done.
    for name in ("noisy", "elastic", "fixed-two"):
        done_at = min(r.sent_at_s for r in reports[name] if r.done)
        later = [r for r in reports[name] if r.started_at_s > done_at]
        assert not later, f"{name} was launched again after it finished"
