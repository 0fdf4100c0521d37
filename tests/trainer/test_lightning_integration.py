"""The PyTorch Lightning integration (``trainer.integrations.lightning``) with real Lightning,
real ``coadapt-launch`` -> ``torchrun`` -> gloo workers on CPU, and no mocks of our code.

The launches run ``examples/lightning_classifier.py`` (float64, so that runs that differ only in
summation order agree to ~1e-12). Each launch costs several seconds of imports (torch and
Lightning), so the scenarios are combined: 3 launches for stop/resume at new world sizes, 2 for
the comparison with coadapt's own loop.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from tests.trainer.harness import (
    ROOT,
    Cluster,
    iter_micro_records,
    load_example,
    max_step,
    read_jsonl,
    wait_until,
)
from trainer.checkpoint import CheckpointManager
from trainer.data import epoch_order
from trainer.launch import ExitCode
from trainer.reporter import read_reports
from trainer.storage import open_store

EXAMPLE = ROOT / "examples" / "lightning_classifier.py"
LAUNCH_TIMEOUT_S = 180


# --------------------------------------------------------------------------------------------
# The core stays light: only trainer.integrations.lightning imports Lightning.


@pytest.mark.slow
def test_importing_the_trainer_does_not_import_lightning() -> None:
    code = (
        "import sys, trainer, trainer.api, trainer.launch, trainer.integrations\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('lightning', "
        "'pytorch_lightning')], 'lightning imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


# --------------------------------------------------------------------------------------------
# The declared length, from the Trainer's own limits, in initial-batch-size iterations.


@pytest.mark.slow
def test_declared_length_comes_from_max_steps_and_max_epochs() -> None:
    # Imported here, not at collection (Lightning takes seconds to import, and every
    # pytest-xdist worker collects this file).
    from trainer.integrations.lightning import declared_length

    # max_steps optimizer steps at the initial batch are max_steps iterations.
    assert (
        declared_length(max_steps=40, max_epochs=None, num_samples=1000, initial_batch_size=32)
        == 40.0
    )
    # max_epochs epochs are max_epochs x samples / M0 iterations (as ElasticJob.epochs).
    assert declared_length(
        max_steps=-1, max_epochs=3, num_samples=1000, initial_batch_size=32
    ) == pytest.approx(3 * 1000 / 32)
    # Lightning stops at whichever limit comes first: the smaller one is the length.
    assert (
        declared_length(max_steps=50, max_epochs=3, num_samples=1000, initial_batch_size=32) == 50.0
    )
    assert declared_length(
        max_steps=500, max_epochs=3, num_samples=1000, initial_batch_size=32
    ) == pytest.approx(93.75)
    # Neither set: nothing declared.
    assert (
        declared_length(max_steps=-1, max_epochs=None, num_samples=1000, initial_batch_size=32)
        is None
    )


# --------------------------------------------------------------------------------------------
# 2 processes -> SIGTERM -> 1 process (accumulation 2) -> notice -> 2 processes (accumulation 2)


@pytest.mark.slow
def test_stop_and_resume_at_new_world_sizes_is_exact(cluster: Cluster, tmp_path: Path) -> None:
    n, batch, epochs, seed = 250, 24, 3, 5  # 10 full steps + a 10-sample tail per epoch
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    p0, p1 = tmp_path / "initial.pt", tmp_path / "final.pt"
    notice = tmp_path / "notice"
    script = [
        str(EXAMPLE), "--epochs", str(epochs), "--num-samples", str(n), "--dtype", "float64",
        "--initial-batch-size", str(batch), "--lr", "0.05", "--lr-step", "7", "--gns-every", "2",
        "--seed", str(seed), "--log-dir", str(logs), "--initial-params", str(p0),
        "--final-params", str(p1), "--sample-delay-s", "0.004",
        "--control-interval-s", "0",  # exchange stop flags every step: stops land mid-epoch
    ]  # fmt: skip
    reports = tmp_path / "reports.jsonl"
    common = ["--job-id", "lit", "--checkpoint-uri", str(ckpt), "--report-file", str(reports),
              "--report-interval-s", "0.5", "--batch-size", str(batch)]  # fmt: skip

    # Phase 1: two processes, no accumulation; SIGTERM mid-epoch 0.
    first = cluster.launch("p1", [*common, "--nproc-per-node", "2", "--accum-steps", "1", *script])
    wait_until(lambda: max_step(logs) >= 4, LAUNCH_TIMEOUT_S, "step 4", first)
    first.terminate()
    assert first.wait(60) == ExitCode.STOPPED, first.text()[-3000:]
    stop1 = max_step(logs)

    # Phase 2: one process, two accumulation micro-steps; a preemption notice mid-epoch 1.
    second = cluster.launch(
        "p2",
        [*common, "--nproc-per-node", "1", "--accum-steps", "2", "--stop-file", str(notice),
         *script],
    )  # fmt: skip
    wait_until(lambda: max_step(logs) >= 13, LAUNCH_TIMEOUT_S, "step 13", second)
    notice.write_text("spot interruption\n")
    assert second.wait(60) == ExitCode.STOPPED, second.text()[-3000:]
    notice.unlink()
    stop2 = max_step(logs)

    # Phase 3: two processes, accumulation 2 (uneven splits at each epoch's tail); finish.
    third = cluster.launch("p3", [*common, "--nproc-per-node", "2", "--accum-steps", "2", *script])
    assert third.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, third.text()[-3000:]

    assert stop1 + 1 < 11 and 11 < stop2 + 1 < 22, (stop1, stop2)
    events = [r for r in read_jsonl(logs) if "event" in r]
    stopped = sorted(e["step"] for e in events if e["event"] == "stopped")
    assert stopped == [stop1 + 1, stop1 + 1, stop2 + 1], events  # ranks agreed on the step
    assert "coadapt: resumed from step" in second.text()
    assert "coadapt: resumed from step" in third.text()

    # The stop checkpoints are Lightning's own (model, optimizer, schedulers, loops, callbacks).
    manager = CheckpointManager(open_store(str(ckpt)))
    payload, _ = manager.read(f"ckpt-{stop2 + 1:012d}.ckpt")
    assert {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks"} <= set(payload)
    assert payload["global_step"] == stop2 + 1

    # Every sample of every epoch exactly once; each step's global batch is the documented
    # chunk of the documented order, whatever the world size; Lightning's global_step is the
    # job's optimizer step.
    by_step: dict[int, list[int]] = defaultdict(list)
    epoch_of: dict[int, int] = {}
    seen_by_epoch: dict[int, list[int]] = defaultdict(list)
    world_sizes = set()
    for r in iter_micro_records(logs):
        if r["ids"]:
            assert r["ids"] == r["data_ids"]  # what the dataset returned is what was planned
        assert r["global_step"] == r["step"]
        by_step[r["step"]].extend(r["ids"])
        epoch_of[r["step"]] = r["epoch"]
        seen_by_epoch[r["epoch"]].extend(r["ids"])
        world_sizes.add((r["world_size"], r["accum"]))
    assert world_sizes == {(2, 1), (1, 2), (2, 2)}
    for epoch in range(epochs):
        assert sorted(seen_by_epoch[epoch]) == list(range(n)), f"epoch {epoch}"
    steps = sorted(by_step)
    assert steps == list(range(epochs * 11))
    for epoch in range(epochs):
        order = epoch_order(n, seed, epoch)
        position = 0
        for s in (s for s in steps if epoch_of[s] == epoch):
            expected = order[position : position + batch]
            assert sorted(by_step[s]) == sorted(expected.tolist()), f"step {s}"
            position += len(expected)

    # Reports: the job's schema, the declared length (3 epochs at M0 = 24), gradient noise and
    # profiles, remaining work falling to zero.
    sent = read_reports(reports)
    assert sent and all(r.target_progress == pytest.approx(epochs * n / batch) for r in sent)
    assert any(r.gradient is not None and r.gradient.measurements > 0 for r in sent)
    assert any(r.profiles for r in sent)
    assert {r.world_size for r in sent} == {1, 2}
    assert sent[-1].done and sent[-1].progress == pytest.approx(epochs * n / batch)

    # Uninterrupted reference with plain torch over the same global batches (the batch is the
    # initial one throughout: the scaling rule's factor is 1).
    ex = load_example(EXAMPLE)
    args = ex.parse_args(["--num-samples", str(n), "--seed", str(seed), "--dtype", "float64",
                          "--lr", "0.05", "--lr-step", "7"])  # fmt: skip
    dataset, model = ex.build(args)
    model.load_state_dict(torch.load(p0))
    configured = model.configure_optimizers()
    opt, sched = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    for s in steps:
        ids = torch.tensor(by_step[s])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(dataset.x[ids]), dataset.y[ids]).backward()
        opt.step()
        sched.step()
    final = torch.load(p1)
    # float64: the runs differ from the reference only in summation order (all-reduce over 1
    # or 2 ranks, accumulation splits): ~1e-16 relative per step over 33 steps.
    for name, ref in model.state_dict().items():
        torch.testing.assert_close(final[name], ref, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Batch changes mid-epoch, without a restart; one agreed before a stop is in force after it.


@pytest.mark.slow
def test_batch_changes_land_mid_epoch_and_an_agreed_one_survives_a_stop(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 0 asks for 40 x 2 when step 1 begins and, when step 7 begins, for 16 x 1 and a stop.
    With an exchange every step, each request is read by every rank at the end of the step
    after it; Lightning has then already fetched the next step's first micro-batch, so the
    change is in force from the step after that: 40 x 2 from step 4 (mid-epoch 0, position 64
    of 160, no restart: one start per rank), 16 x 1 from step 10 (epoch 1 is steps 7 to 10).
    The stop, read with it, comes at the safe point after step 8: the checkpoint at step 9
    carries the agreed 16 x 1, and the relaunch (1 process, no batch given) trains step 9 at
    40 x 2 and step 10 on at 16 x 1. Every sample of every epoch once, each step the
    documented chunk; the final weights equal a plain-torch AdamW loop over the same global
    batches with the square-root LR factor."""
    n, m0, seed, lr = 160, 16, 4, 0.01
    logs, p0, p1 = tmp_path / "logs", tmp_path / "initial.pt", tmp_path / "final.pt"
    script = [
        str(EXAMPLE), "--epochs", "2", "--num-samples", str(n), "--dtype", "float64",
        "--initial-batch-size", str(m0), "--optimizer", "adamw", "--lr", str(lr),
        "--gns-every", "2", "--seed", str(seed), "--control-interval-s", "0",
        "--batch-at-step", "1:40x2,7:16x1", "--stop-at-step", "7", "--log-dir", str(logs),
        "--initial-params", str(p0), "--final-params", str(p1),
    ]  # fmt: skip
    common = ["--job-id", "litbatch", "--checkpoint-uri", str(tmp_path / "ckpt")]
    first = cluster.launch("p1", [*common, "--nproc-per-node", "2", *script])
    assert first.wait(LAUNCH_TIMEOUT_S) == ExitCode.STOPPED, first.text()[-3000:]
    second = cluster.launch("p2", [*common, "--nproc-per-node", "1", *script])
    assert second.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, second.text()[-3000:]

    events = [r for r in read_jsonl(logs) if "event" in r]
    assert sorted(e["step"] for e in events if e["event"] == "stopped") == [9, 9]
    assert sum(1 for e in events if e["event"] == "start") == 3  # 2 ranks, then 1
    by_step: dict[int, list[int]] = defaultdict(list)
    config: dict[int, tuple[int, int, int]] = {}
    epoch_of: dict[int, int] = {}
    for r in iter_micro_records(logs):
        by_step[r["step"]].extend(r["ids"])
        config[r["step"]] = (r["batch"], r["accum"], r["world_size"])
        epoch_of[r["step"]] = r["epoch"]
    steps = sorted(by_step)
    assert steps == list(range(len(steps)))
    assert [config[s][:2] for s in range(11)] == [(16, 1)] * 4 + [(40, 2)] * 6 + [(16, 1)]
    assert config[8][2] == 2 and config[9][2] == 1  # step 9: after the relaunch
    assert all(config[s][:2] == (16, 1) for s in steps if s >= 10)
    position: dict[int, int] = defaultdict(int)
    for s in steps:
        epoch = epoch_of[s]
        order = epoch_order(n, seed, epoch).tolist()
        start = position[epoch]
        if s == 4:
            assert (epoch, start) == (0, 64)  # mid-epoch
        assert sorted(by_step[s]) == sorted(order[start : start + config[s][0]]), s
        position[epoch] += len(by_step[s])
    assert all(position[e] == n for e in position if e < max(position))

    ex = load_example(EXAMPLE)
    args = ex.parse_args(["--num-samples", str(n), "--seed", str(seed), "--dtype", "float64",
                          "--optimizer", "adamw", "--lr", str(lr)])  # fmt: skip
    dataset, model = ex.build(args)
    model.load_state_dict(torch.load(p0))
    opt = model.configure_optimizers()
    for s in steps:
        ids = torch.tensor(by_step[s])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(dataset.x[ids]), dataset.y[ids]).backward()
        factor = (config[s][0] / m0) ** 0.5
        for group in opt.param_groups:
            group["lr"] = lr * factor
        opt.step()
    final = torch.load(p1)
    for name, ref in model.state_dict().items():
        torch.testing.assert_close(final[name], ref, rtol=1e-9, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Same model, data and batch schedule: Lightning under coadapt vs coadapt's own loop.


@pytest.mark.slow
def test_matches_our_own_loop_gradient_noise_batch_change_and_weights(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The integration drives the same step loop over the same global batches as our own loop,
    so the two runs compute the same gradients in a different summation order only: gradient
    statistics, progress and weights agree to float64 rounding (rtol 1e-9), far tighter than
    the estimator's own noise (its per-measurement spread is tens of percent). The batch change
    at epoch 1 (24 -> 48, accumulation 2) is applied without a restart (one launch, one start
    per rank), with the AdaScale learning-rate factor, in both."""
    n, epochs = 250, 3
    script = [
        str(EXAMPLE), "--epochs", str(epochs), "--num-samples", str(n), "--dtype", "float64",
        "--initial-batch-size", "24", "--lr-step", "5", "--gns-every", "2",
        "--batch-schedule", "1:48x2", "--control-interval-s", "0",
    ]  # fmt: skip
    runs = {}
    for name, extra in (("lightning", []), ("own", ["--own-loop"])):
        logs = tmp_path / f"logs-{name}"
        launch = cluster.launch(
            name,
            ["--job-id", name, "--checkpoint-uri", str(tmp_path / f"ckpt-{name}"),
             "--report-file", str(tmp_path / f"{name}.jsonl"), "--nproc-per-node", "2",
             *script, *extra, "--log-dir", str(logs),
             "--final-params", str(tmp_path / f"{name}.pt")],
        )  # fmt: skip
        assert launch.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, launch.text()[-3000:]
        records = read_jsonl(logs)
        runs[name] = (
            [r for r in records if r.get("event") == "done"],
            sorted((r["step"], r["batch"], r["accum"]) for r in records if "event" not in r),
        )
        if name == "lightning":
            assert sum(1 for r in records if r.get("event") == "start") == 2  # no restart
    (lit_done, lit_steps), (own_done, own_steps) = runs["lightning"], runs["own"]
    assert lit_steps == own_steps
    configs = {(b, a) for _, b, a in lit_steps}
    assert configs == {(24, 1), (48, 2)}
    for a, b in zip(lit_done, own_done, strict=True):
        assert a["step"] == b["step"]
        for key in ("grad_sqr", "grad_var", "progress", "target_progress"):
            assert a[key] == pytest.approx(b[key], rel=1e-9), key
    lit, own = torch.load(tmp_path / "lightning.pt"), torch.load(tmp_path / "own.pt")
    for name, ref in own.items():
        torch.testing.assert_close(lit[name], ref, rtol=1e-9, atol=1e-11)
    # The AdaScale factor was applied after the change (SGD): above 1, at most the ratio 2.
    scales = [r.lr_scale for r in read_reports(tmp_path / "lightning.jsonl") if r.lr_scale]
    assert scales and max(scales) > 1.0 and max(scales) <= 2.0


# --------------------------------------------------------------------------------------------
# RNG: a model with dropout, stopped and resumed, ends where an uninterrupted run ends.


@pytest.mark.slow
def test_resume_restores_every_ranks_rng_exactly(cluster: Cluster, tmp_path: Path) -> None:
    """Dropout draws from each rank's global torch RNG: the stop checkpoint carries every
    rank's RNG state and the resumed run draws the same masks as an uninterrupted one, so the
    final weights are equal (same world size and summation order: to float64 rounding). A
    resume that lost or shifted any rank's RNG stream would train on other masks."""
    script = [
        str(EXAMPLE), "--epochs", "2", "--num-samples", "192", "--dtype", "float64",
        "--initial-batch-size", "16", "--dropout", "0.3", "--accumulate", "2",
        "--sample-delay-s", "0.004", "--control-interval-s", "0",
    ]  # fmt: skip

    def launch(name: str, ckpt: Path, logs: Path, final: Path):
        return cluster.launch(
            name,
            ["--job-id", "rng", "--checkpoint-uri", str(ckpt), "--report-file",
             str(tmp_path / f"{name}.jsonl"), "--nproc-per-node", "2", *script,
             "--log-dir", str(logs), "--final-params", str(final)],
        )  # fmt: skip

    whole = launch("whole", tmp_path / "ckpt-whole", tmp_path / "logs-whole", tmp_path / "a.pt")
    assert whole.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, whole.text()[-3000:]
    logs, ckpt = tmp_path / "logs-split", tmp_path / "ckpt-split"
    first = launch("first", ckpt, logs, tmp_path / "b.pt")
    wait_until(lambda: max_step(logs) >= 5, LAUNCH_TIMEOUT_S, "step 5", first)
    first.terminate()
    assert first.wait(60) == ExitCode.STOPPED, first.text()[-3000:]
    stopped_at = max_step(logs)
    assert stopped_at < 23  # 12 steps per epoch: it stopped before the end
    second = launch("second", ckpt, logs, tmp_path / "b.pt")
    assert second.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, second.text()[-3000:]
    assert "coadapt: resumed from step" in second.text()
    # The accumulation position too: Lightning initialised it from accumulate_grad_batches=2.
    assert {r["accum"] for r in iter_micro_records(logs)} == {2}
    a, b = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    for name, ref in a.items():
        torch.testing.assert_close(b[name], ref, rtol=1e-12, atol=1e-14)
