"""Acceptance tests with real ``coadapt-launch`` → ``torchrun`` → gloo workers on CPU.

Each launch costs ~5-6 s of imports, so the scenarios are combined: 2+1+3 launches for the
exact-resume test, 3 for gradient noise, 2 for corruption, non-finite gradients and reports.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.trainer.harness import (
    EXAMPLE,
    Cluster,
    ReportServer,
    iter_micro_records,
    load_example,
    max_step,
    read_jsonl,
    serving,
    wait_until,
)
from trainer.data import epoch_order
from trainer.launch import ExitCode
from trainer.report import BatchConfig, ReportReply
from trainer.reporter import read_reports

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT_S = 120


# --------------------------------------------------------------------------------------------
# 2 processes -> SIGTERM -> 1 process -> SIGTERM -> 3 processes: exact resumption.


def test_resume_across_world_sizes_sees_each_sample_once_and_matches_uninterrupted(
    cluster: Cluster, tmp_path: Path
) -> None:
    n, batch, epochs, seed = 250, 24, 3, 7  # 10 full steps + a 10-sample tail per epoch
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    p0, p1 = tmp_path / "initial.pt", tmp_path / "final.pt"
    script = [
        str(EXAMPLE), "--epochs", str(epochs), "--num-samples", str(n), "--dim", "8",
        "--hidden", "16", "--dtype", "float64", "--initial-batch-size", str(batch),
        "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--weight-decay", "0.001",
        "--lr-step", "20", "--gns-every", "2", "--seed", str(seed), "--log-dir", str(logs),
        "--initial-params", str(p0), "--final-params", str(p1), "--step-delay-s", "0.03",
        "--control-interval-s", "0",  # exchange stop flags every step: stops land mid-epoch
    ]  # fmt: skip
    reports = tmp_path / "reports.jsonl"
    common = ["--job-id", "resume", "--checkpoint-uri", str(ckpt), "--report-file", str(reports),
              "--batch-size", str(batch)]  # fmt: skip

    # Phase 1: two processes, no accumulation; stop mid-epoch 0.
    first = cluster.launch("p1", [*common, "--nproc-per-node", "2", "--accum-steps", "1", *script])
    wait_until(lambda: max_step(logs) >= 4, LAUNCH_TIMEOUT_S, "step 4", first)
    first.terminate()
    assert first.wait(60) == ExitCode.STOPPED, first.text()[-3000:]
    stop1 = max_step(logs)

    # Phase 2: one process, two accumulation micro-steps; stop mid-epoch 1.
    second = cluster.launch("p2", [*common, "--nproc-per-node", "1", "--accum-steps", "2", *script])
    wait_until(lambda: max_step(logs) >= 14, LAUNCH_TIMEOUT_S, "step 14", second)
    second.terminate()
    assert second.wait(60) == ExitCode.STOPPED, second.text()[-3000:]
    stop2 = max_step(logs)

    # Phase 3: three processes, accumulation 2 (uneven splits at each epoch's tail); finish.
    third = cluster.launch("p3", [*common, "--nproc-per-node", "3", "--accum-steps", "2", *script])
    assert third.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, third.text()[-3000:]

    events = [r for r in read_jsonl(logs) if "event" in r]
    restores = [e for e in events if e["event"] == "restored"]
    # Phase 2 (one rank) resumed where phase 1 stopped, phase 3 (three ranks) where phase 2
    # stopped: both mid-epoch (11 steps per epoch).
    assert sorted((e["step"], e["epoch"], e["position"]) for e in restores) == [
        (stop1 + 1, 0, (stop1 + 1) * batch),
        (stop2 + 1, 1, (stop2 + 1 - 11) * batch),
        (stop2 + 1, 1, (stop2 + 1 - 11) * batch),
        (stop2 + 1, 1, (stop2 + 1 - 11) * batch),
    ], restores
    assert stop1 + 1 < 11 and 11 < stop2 + 1 < 22, (stop1, stop2)

    # Every sample of every epoch exactly once; each step's global batch is the documented
    # chunk of the documented order, whatever the world size.
    by_step: dict[int, list[int]] = defaultdict(list)
    epoch_of: dict[int, int] = {}
    seen_by_epoch: dict[int, list[int]] = defaultdict(list)
    world_sizes = set()
    for r in iter_micro_records(logs):
        if r["ids"]:
            assert r["ids"] == r["data_ids"]  # what the dataset returned is what was planned
        by_step[r["step"]].extend(r["ids"])
        epoch_of[r["step"]] = r["epoch"]
        seen_by_epoch[r["epoch"]].extend(r["ids"])
        world_sizes.add(r["world_size"])
    assert world_sizes == {1, 2, 3}
    for epoch in range(epochs):
        assert sorted(seen_by_epoch[epoch]) == list(range(n)), f"epoch {epoch}"
    steps = sorted(by_step)
    assert steps == list(range(epochs * 11))
    for epoch in range(epochs):
        order = epoch_order(n, seed, epoch)
        epoch_steps = [s for s in steps if epoch_of[s] == epoch]
        position = 0
        for s in epoch_steps:
            expected = order[position : position + batch]
            assert sorted(by_step[s]) == sorted(expected.tolist()), f"step {s}"
            position += len(expected)

    # Uninterrupted reference with plain torch over the same global batches.
    ex = load_example(EXAMPLE)
    dataset = ex.SyntheticRegression(n, 8, noise_std=0.5, seed=seed + 1, dtype=torch.float64)
    model = ex.build_model(8, 16, seed, torch.float64)
    model.load_state_dict(torch.load(p0))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.001)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.5)
    for s in steps:
        ids = torch.tensor(by_step[s])
        opt.zero_grad()
        ex.loss_fn(model(dataset.x[ids]), dataset.y[ids]).backward()
        opt.step()
        sched.step()
    final = torch.load(p1)
    # float64: the runs differ from the reference only in summation order (all-reduce over 1, 2
    # or 3 ranks, accumulation splits): ~1e-16 relative per step over 33 steps.
    for name, ref in model.state_dict().items():
        torch.testing.assert_close(final[name], ref, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Gradient noise on linear regression with known noise, for 1, 2 and 4 processes.


def _exact_gradient_stats(
    w0: torch.Tensor, dataset, initial_batch_size: int
) -> tuple[float, float]:
    """|G|^2 and tr(Sigma)/M0 of the per-sample gradients x (x.w - y) over the whole dataset."""
    g = dataset.x * (dataset.x @ w0.reshape(-1, 1) - dataset.y)
    mean = g.mean(0)
    sigma2 = ((g - mean) ** 2).sum(1).mean().item()
    return float((mean**2).sum()), sigma2 / initial_batch_size


@pytest.mark.parametrize(
    ("nproc", "accum", "schedule", "epochs", "check_epochs"),
    [
        (1, 1, "2:64x4", 4, (1, 3)),  # split measurement, then 4 accumulation micro-steps
        (2, 2, "", 2, (1,)),  # local vs all-reduced gradient, with accumulation
        (4, 1, "", 2, (1,)),
    ],
    ids=["1proc-then-accum4", "2proc-accum2", "4proc"],
)
def test_gradient_noise_matches_the_analytic_value(
    cluster: Cluster, tmp_path: Path, nproc: int, accum: int, schedule: str, epochs: int,
    check_epochs: tuple[int, ...],
) -> None:  # fmt: skip
    n, dim, m0, seed = 4096, 32, 64, 3
    logs, p0 = tmp_path / "logs", tmp_path / "p0.pt"
    launch = cluster.launch(
        "gns",
        ["--job-id", "gns", "--checkpoint-uri", str(tmp_path / "ckpt"),
         "--report-file", str(tmp_path / "r.jsonl"), "--nproc-per-node", str(nproc),
         "--batch-size", str(m0), "--accum-steps", str(accum),
         str(EXAMPLE), "--epochs", str(epochs), "--num-samples", str(n), "--dim", str(dim),
         "--hidden", "0", "--noise-std", "0.5", "--dtype", "float64",
         "--initial-batch-size", str(m0), "--optimizer", "sgd", "--lr", "0", "--momentum", "0",
         "--gns-every", "1", "--gns-smoothing", "0.98", "--seed", str(seed),
         "--log-dir", str(logs), "--initial-params", str(p0), "--batch-schedule", schedule],
    )  # fmt: skip
    assert launch.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, launch.text()[-3000:]

    ex = load_example(EXAMPLE)
    dataset = ex.SyntheticRegression(n, dim, noise_std=0.5, seed=seed + 1, dtype=torch.float64)
    # lr = 0: the parameters stay at w0, so the true statistics are fixed and exactly known
    # for this finite dataset (batches are drawn without replacement from it).
    true_sqr, true_var = _exact_gradient_stats(torch.load(p0)["weight"], dataset, m0)
    # Every rank logs the same (agreed) statistics at each epoch end.
    ends = {r["epoch"]: r for r in read_jsonl(logs) if r.get("event") == "epoch_end"}
    micro = list(iter_micro_records(logs))
    assert {r["world_size"] for r in micro} == {nproc}
    for epoch in check_epochs:
        end = ends[epoch]
        assert end["measurements"] >= 100, end
        assert end["grad_sqr"] == pytest.approx(true_sqr, rel=0.15), (epoch, end, true_sqr)
        assert end["grad_var"] == pytest.approx(true_var, rel=0.15), (epoch, end, true_var)
    if schedule:
        assert {r["accum"] for r in micro if r["epoch"] >= 2} == {4}
        assert {len({r["micro"] for r in micro if r["step"] == s}) for s in range(128, 256)} == {4}


# --------------------------------------------------------------------------------------------
# Reports over HTTP (and a controller reply), a non-finite step, then a corrupt checkpoint and a
# standalone relaunch that falls back to the previous checkpoint and reports to a file.


@pytest.fixture
def controller() -> Iterator[ReportServer]:
    reply = ReportReply(batch=BatchConfig(48, 1))
    with serving(ReportServer(lambda _report, _index: reply)) as server:
        yield server


def test_reports_nonfinite_step_and_corrupt_checkpoint_fallback(
    cluster: Cluster, tmp_path: Path, controller: ReportServer
) -> None:
    n, batch, bad_step = 512, 32, 6
    logs, ckpt, report_file = tmp_path / "logs", tmp_path / "ckpt", tmp_path / "reports.jsonl"
    script = [
        str(EXAMPLE), "--num-samples", str(n), "--dim", "16", "--hidden", "32",
        "--initial-batch-size", str(batch), "--optimizer", "adamw", "--lr", "0.001",
        "--gns-every", "1", "--checkpoint-every-steps", "5", "--log-dir", str(logs),
        "--inject-nonfinite-step", str(bad_step), "--step-delay-s", "0.03",
    ]  # fmt: skip
    common = ["--job-id", "rep", "--checkpoint-uri", str(ckpt)]
    first = cluster.launch(
        "controlled",
        [*common, "--nproc-per-node", "2", "--controller-url", controller.url,
         "--report-interval-s", "0.3", *script, "--epochs", "2"],
    )  # fmt: skip
    assert first.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, first.text()[-3000:]

    # Reports arrived over HTTP, in the schema, with profiles and gradient statistics.
    assert controller.reports, "no report arrived"
    assert set(controller.paths) == {"/v1/jobs/rep/reports"}
    last = controller.reports[-1]
    assert (last.job_id, last.world_size, last.standalone) == ("rep", 2, False)
    assert last.gradient is not None and last.gradient.preconditioned
    assert last.gradient.measurements > 10
    assert any(p.num_replicas == 2 and p.step_s > 0 for p in last.profiles)
    assert last.skipped_steps == 1
    assert last.hints.scaling_rule == "sqrt"
    # The controller's reply (batch 48) took effect mid-run without a restart (the launcher
    # returned DONE once), from some step on (trainer.stepping, "Batch changes").
    micro = list(iter_micro_records(logs))
    first48 = min(r["step"] for r in micro if r["batch"] == 48)
    assert {r["batch"] for r in micro if r["step"] < first48} == {batch}
    assert {r["batch"] for r in micro if r["step"] >= first48} == {48}
    for epoch in (0, 1):
        assert sorted(i for r in micro if r["epoch"] == epoch for i in r["ids"]) == list(range(n))

    # The non-finite step was skipped: estimates and parameters unchanged, training went on.
    events = [r for r in read_jsonl(logs) if "event" in r]
    before = next(e for e in events if e["event"] == "before_nonfinite")
    after = next(e for e in events if e["event"] == "after_nonfinite")
    assert after["skipped"] == before["skipped"] + 1
    assert after["gns_state"] == before["gns_state"]
    assert after["param_sum"] == before["param_sum"]
    assert max(r["step"] for r in micro) > bad_step + 5

    # Corrupt the newest checkpoint; a standalone relaunch resumes from the previous one.
    names = sorted(p.name for p in ckpt.glob("ckpt-*.ckpt"))
    assert len(names) == 3, names  # keep_last
    newest = ckpt / names[-1]
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    second = cluster.launch(
        "standalone",
        [*common, "--nproc-per-node", "1", "--report-file", str(report_file),
         *script, "--epochs", "3"],
    )  # fmt: skip
    assert second.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, second.text()[-3000:]
    output = second.text()
    assert f"checkpoint {names[-1]} is unusable" in output, output[-3000:]
    assert f"resuming from checkpoint {names[-2]}" in output
    restored = [e for e in events_of(logs) if e["event"] == "restored"]
    assert [(e["checkpoint"], e["skipped"]) for e in restored] == [(names[-2], [names[-1]])]
    reports = read_reports(report_file)
    assert reports and all(r.standalone and r.job_id == "rep" for r in reports)
    assert reports[-1].epoch == 3 and reports[-1].world_size == 1


def events_of(log_dir: Path) -> list[dict]:
    return [r for r in read_jsonl(log_dir) if "event" in r]
