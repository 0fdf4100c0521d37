"""The Hugging Face ``transformers.Trainer`` integration (``trainer.integrations.hf``), for real:
real transformers (a 2-layer BERT built from a config), real ``coadapt-launch`` -> ``torchrun``
-> gloo workers for the multi-process tests (``examples/hf_classifier.py``).

The slow test combines its scenarios into one job's life (each launch costs ~10 s of imports
here): 2 processes stopped by SIGTERM, 1 process (accumulation 2) stopped by a spot notice, 2
processes re-batched by the controller's reply without a restart and then stopped by the
controller's word, 1 process to the end; every sample of every epoch once, the final weights
those of a plain loop over the same global batches with the same optimizer, scheduler,
clipping and learning-rate scaling.
"""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.trainer.harness import (
    ROOT,
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
from trainer.errors import TrainerConfigError
from trainer.launch import ExitCode
from trainer.report import BatchConfig, ReportReply, is_done
from trainer.reporter import read_reports

if importlib.util.find_spec("transformers") is None:
    pytest.skip("needs transformers", allow_module_level=True)
# transformers and trainer.integrations.hf (seconds of imports) are imported in the tests that
# use them, not at collection: every pytest-xdist worker collects this file, one runs it.

HF_EXAMPLE = ROOT / "examples" / "hf_classifier.py"
LAUNCH_TIMEOUT_S = 180


# --------------------------------------------------------------------------------------------
# The declared length, in the unit of the one "done" rule.


@pytest.mark.slow
def test_length_is_declared_from_max_steps_or_num_train_epochs() -> None:
    from trainer.integrations.hf import declared_length

    # max_steps wins: a step at the initial batch size is one initial-batch iteration.
    by_steps = declared_length(
        max_steps=30, num_train_epochs=3.0, num_samples=100, initial_batch_size=32
    )
    assert (by_steps.target_progress, by_steps.schedule_steps, by_steps.epochs) == (30.0, 30, 8)
    # Epochs (fractional too): epochs x samples / M0, the progress they make at M0.
    by_epochs = declared_length(
        max_steps=-1, num_train_epochs=2.5, num_samples=100, initial_batch_size=32
    )
    assert by_epochs.target_progress == pytest.approx(2.5 * 100 / 32)
    assert (by_epochs.schedule_steps, by_epochs.epochs) == (10, 3)  # 4 steps per epoch at M0
    with pytest.raises(TrainerConfigError):
        declared_length(max_steps=-1, num_train_epochs=0, num_samples=100, initial_batch_size=32)
    with pytest.raises(TrainerConfigError):
        declared_length(max_steps=5, num_train_epochs=1, num_samples=0, initial_batch_size=32)


@pytest.mark.slow
def test_importing_trainer_does_not_import_transformers() -> None:
    code = (
        "import sys, trainer, trainer.api, trainer.integrations, trainer.launch\n"
        "bad = sorted(m for m in ('transformers', 'accelerate', 'lightning') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]


# --------------------------------------------------------------------------------------------
# In process, alone: the Trainer's max_steps declares the length, the Trainer's own
# accumulation is the batch configuration, reports carry profiles and gradient statistics.


@pytest.mark.slow
def test_standalone_trainer_declares_its_length_and_reports_like_our_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    from trainer.integrations.hf import CoadaptTrainer

    for name in [n for n in list(__import__("os").environ) if n.startswith("COADAPT_")]:
        monkeypatch.delenv(name)
    reports_file = tmp_path / "reports.jsonl"
    monkeypatch.setenv("COADAPT_REPORT_FILE", str(reports_file))
    monkeypatch.setenv("COADAPT_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    monkeypatch.setenv("COADAPT_JOB_ID", "hf-inprocess")
    ex = load_example(HF_EXAMPLE)
    dataset = ex.SyntheticText(96, 12, seed=1)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=2,
        disable_tqdm=True,
    )
    hf = CoadaptTrainer(
        model=ex.build_model(0, torch.float32),
        args=args,
        train_dataset=dataset,
        job_options={"gns_every_steps": 1},
    )
    result = hf.train()
    assert result.global_step == 6 and hf.state.global_step == 6
    assert [h["step"] for h in hf.state.log_history if "loss" in h] == [2, 4, 6]
    reports = read_reports(reports_file)
    last = reports[-1]
    # Declared from max_steps at M0 = 8 x 2: 6 initial-batch iterations, reached (the one rule).
    assert last.target_progress == 6.0 and last.done and is_done(last.progress, 6.0)
    assert last.batch == BatchConfig(16, 2)  # alone: the Trainer's own accumulation
    assert last.hints.initial_batch_size == 16 and last.hints.scaling_rule == "sqrt"
    assert last.gradient is not None and last.gradient.measurements >= 4
    assert last.gradient.preconditioned  # AdamW from the Trainer's create_optimizer
    profiles = last.profiles
    assert any(p.accum_steps == 2 and p.local_batch_size == 8 and p.steps > 0 for p in profiles)
    # The coadapt checkpoint holds the Trainer's state beside the model, optimizer, scheduler.
    assert list((tmp_path / "ckpt").glob("ckpt-*"))


@pytest.mark.slow
def test_trainer_keeps_given_optimizer_declares_fractional_epochs_and_evaluates_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An optimizer given to the Trainer (``optimizers=``) is the one stepped (SGD: the AdaScale
    rule); ``num_train_epochs=1.5`` declares 1.5 epochs' progress; ``evaluate()`` works after
    ``train()`` (the Trainer wraps the model again, not the closed job's DDP)."""
    import transformers

    from trainer.integrations.hf import CoadaptTrainer

    for name in [n for n in list(__import__("os").environ) if n.startswith("COADAPT_")]:
        monkeypatch.delenv(name)
    reports_file = tmp_path / "reports.jsonl"
    monkeypatch.setenv("COADAPT_REPORT_FILE", str(reports_file))
    monkeypatch.setenv("COADAPT_CHECKPOINT_URI", str(tmp_path / "ckpt"))
    ex = load_example(HF_EXAMPLE)
    dataset = ex.SyntheticText(96, 12, seed=1)
    model = ex.build_model(0, torch.float32)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=1.5,
        per_device_train_batch_size=16,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    hf = CoadaptTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
        optimizers=(sgd, None),
        job_options={"gns_every_steps": 1},
    )
    result = hf.train()
    assert hf.optimizer is sgd and sgd.state  # stepped: momentum buffers exist
    last = read_reports(reports_file)[-1]
    assert last.hints.scaling_rule == "adascale"
    assert last.target_progress == pytest.approx(1.5 * 96 / 16) and last.done
    assert result.global_step == 9  # 6 steps per epoch at 16, then 3 of the second
    metrics = hf.evaluate()
    assert math.isfinite(metrics["eval_loss"])


# --------------------------------------------------------------------------------------------
# Real launches: stop (SIGTERM, notice, controller), exact resume at other world sizes, a
# batch change without restart, the LR rule, final weights against a plain loop.


@pytest.fixture
def controller() -> Iterator[ReportServer]:
    reply = ReportReply(batch=BatchConfig(45, 1))
    with serving(ReportServer(lambda _report, _index: reply)) as server:
        yield server


def _steps_of(logs: Path) -> dict[int, dict]:
    """Per global step: its epoch, its batch configuration and its sample ids (all ranks)."""
    steps: dict[int, dict] = {}
    for r in iter_micro_records(logs):
        s = steps.setdefault(
            r["step"], {"epoch": r["epoch"], "batch": r["batch"], "ids": [], "sizes": set()}
        )
        s["ids"].extend(r["ids"])
        s["sizes"].add(r["world_size"])
    return steps


def _assert_documented_chunks(steps: dict[int, dict], n: int, seed: int) -> dict[int, int]:
    """Every sample of every epoch exactly once: each step's global batch is the documented
    chunk of the documented order, whatever the world size, accumulation and batch (each step
    at its own batch). Returns each step's epoch position at its start."""
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for s in sorted(steps):
        by_epoch[steps[s]["epoch"]].append(s)
    last_epoch = max(by_epoch)
    starts = {}
    for epoch, epoch_steps in by_epoch.items():
        order = epoch_order(n, seed, epoch).tolist()
        position = 0
        for s in epoch_steps:
            starts[s] = position
            size = min(steps[s]["batch"], n - position)
            assert sorted(steps[s]["ids"]) == sorted(order[position : position + size]), s
            position += size
        if epoch != last_epoch:  # the last epoch ends at the step that reaches the target
            assert position == n, epoch
    return starts


def _reference_weights(
    ex,
    n: int,
    seq_len: int,
    seed: int,
    lr: float,
    m0: int,
    schedule_steps: int,
    steps: dict[int, dict],
) -> dict[str, torch.Tensor]:
    """A plain loop over the logged global batches: the Trainer's own optimizer and scheduler
    (its create_optimizer_and_scheduler), clipping at 1.0, the square-root LR rule."""
    import transformers

    dataset = ex.SyntheticText(n, seq_len, seed + 1)
    model = ex.build_model(seed, torch.float64)
    plain = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir="/tmp/unused-hf-ref", learning_rate=lr, use_cpu=True, report_to=[]
        ),
    )
    plain.create_optimizer_and_scheduler(num_training_steps=schedule_steps)
    opt, sched = plain.optimizer, plain.lr_scheduler
    for s in sorted(steps):
        ids = torch.tensor(steps[s]["ids"])
        batch = {
            "input_ids": dataset.input_ids[ids],
            "attention_mask": dataset.attention_mask[ids],
            "labels": dataset.labels[ids],
        }
        opt.zero_grad()
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        factor = math.sqrt(steps[s]["batch"] / m0)
        saved = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] *= factor
        opt.step()
        for g, value in zip(opt.param_groups, saved, strict=True):
            g["lr"] = value
        sched.step()
    return model.state_dict()


@pytest.mark.slow
def test_hf_job_stops_resumes_exactly_and_takes_the_controllers_batch(
    cluster: Cluster, tmp_path: Path, controller
) -> None:
    from trainer.integrations.hf import declared_length

    n, seq_len, m0, epochs, seed, lr = 205, 12, 25, 6, 5, 1e-3  # 9 steps per epoch at 25
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    final = tmp_path / "final.pt"
    notice = tmp_path / "notice"
    script = [
        str(HF_EXAMPLE), "--epochs", str(epochs), "--num-samples", str(n), "--seq-len",
        str(seq_len), "--per-device-batch", str(m0), "--lr", str(lr), "--seed", str(seed),
        "--dtype", "float64", "--gns-every", "2", "--control-interval-s", "0",
        "--sample-delay-s", "0.004", "--log-dir", str(logs), "--final-params", str(final),
        "--output-dir", str(tmp_path / "out"),
    ]  # fmt: skip
    common = ["--job-id", "hfjob", "--checkpoint-uri", str(ckpt), "--batch-size", str(m0)]
    reports_file = ["--report-file", str(tmp_path / "reports.jsonl")]

    # 1. Two processes; SIGTERM (a rescale) mid-epoch 0.
    p1 = cluster.launch("p1", [*common, *reports_file, "--nproc-per-node", "2", *script])
    wait_until(lambda: max_step(logs) >= 3, LAUNCH_TIMEOUT_S, "step 3", p1)
    p1.terminate()
    assert p1.wait(90) == ExitCode.STOPPED, p1.text()[-3000:]

    # 2. One process, two accumulation micro-steps; a spot notice (the stop file) in epoch 1.
    p2 = cluster.launch(
        "p2",
        [*common, *reports_file, "--nproc-per-node", "1", "--accum-steps", "2",
         "--stop-file", str(notice), *script],
    )  # fmt: skip
    wait_until(lambda: max_step(logs) >= 10, LAUNCH_TIMEOUT_S, "step 10", p2)
    notice.write_text("spot interruption\n")
    assert p2.wait(90) == ExitCode.STOPPED, p2.text()[-3000:]
    notice.unlink()

    # 3. Two processes reporting to a controller that plans batch 45: taken at the next
    # epoch boundary without a restart; then the controller says stop.
    p3 = cluster.launch(
        "p3",
        [*common, "--nproc-per-node", "2", "--controller-url", controller.url,
         "--report-interval-s", "0.3", *script],
    )  # fmt: skip
    wait_until(
        lambda: any(r["batch"] == 45 for r in iter_micro_records(logs)),
        LAUNCH_TIMEOUT_S,
        "a step at batch 45",
        p3,
    )
    stop = ReportReply(stop=True)
    controller.reply = lambda _report, _index: stop
    assert p3.wait(90) == ExitCode.STOPPED, p3.text()[-3000:]

    # 4. One process to the end (the batch of the checkpoint: 45).
    p4 = cluster.launch("p4", [*common, *reports_file, "--nproc-per-node", "1", *script])
    assert p4.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, p4.text()[-3000:]

    events = [r for r in read_jsonl(logs) if "event" in r]
    stops = sorted(e["step"] for e in events if e["event"] == "stopped")
    assert len(stops) == 2 + 1 + 2, stops  # p1 (2 ranks), p2 (1), p3 (2)
    steps = _steps_of(logs)
    assert sorted(steps) == list(range(len(steps)))
    assert {size for s in steps.values() for size in s["sizes"]} == {1, 2}
    _assert_documented_chunks(steps, n, seed)
    assert max(s["epoch"] for s in steps.values()) >= epochs - 1
    # The controller's batch: taken within one launch (no restart: the reports at 25 and at 45
    # share their launch's start and attempt).
    launches = defaultdict(set)
    for r in controller.reports:
        launches[(r.started_at_s, r.attempt)].add(r.batch.global_batch_size)
    assert {25, 45} in launches.values(), dict(launches)
    assert any(r.lr_scale == pytest.approx(math.sqrt(45 / 25)) for r in controller.reports)
    # The done rule: the declared length in the final report, reached.
    final_report = read_reports(tmp_path / "reports.jsonl")[-1]
    assert final_report.target_progress == pytest.approx(epochs * n / m0)
    assert final_report.done and is_done(final_report.progress, final_report.target_progress)

    ex = load_example(HF_EXAMPLE)
    reference = _reference_weights(
        ex, n, seq_len, seed, lr, m0, declared_length(
            max_steps=-1, num_train_epochs=epochs, num_samples=n, initial_batch_size=m0
        ).schedule_steps, steps,
    )  # fmt: skip
    got = torch.load(final)
    # Batches of 25 and 45 split unevenly over 2 ranks (13/12, 23/22) and over 2 micro-steps:
    # without the per-micro-batch weights (or with them applied twice) the update is not the
    # global mean and this fails. float64: the runs differ from the reference only in summation
    # order, ~1e-16 relative per step; Adam's normalisation keeps that relative over ~50 steps.
    for name, ref in reference.items():
        torch.testing.assert_close(got[name], ref, rtol=1e-7, atol=1e-10, msg=name)


@pytest.mark.slow
def test_a_batch_change_lands_mid_epoch_at_the_next_step_without_a_restart(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Rank 0 asks for 40 x 2 when step 1 begins (as a controller's reply would). With an
    exchange every step (``control_interval_s=0``) rank 0 offers it at the end of step 1, every
    rank reads it at the end of step 2, and it is in force from the next optimizer step, 3:
    mid-epoch 0 (position 48 of 96), in the same launch (one start per rank, one launcher
    attempt in the reports). The rest of the epoch is re-planned at 40 (every sample once), and
    the weights are those of a plain loop over the same global batches with the Trainer's AdamW,
    scheduler and clipping and the square-root LR rule at each step's own batch."""
    from trainer.integrations.hf import declared_length

    n, seq_len, m0, seed, lr = 96, 8, 16, 3, 1e-3
    logs, final, reports = tmp_path / "logs", tmp_path / "final.pt", tmp_path / "reports.jsonl"
    launch = cluster.launch(
        "p",
        ["--job-id", "hfbatch", "--checkpoint-uri", str(tmp_path / "ckpt"), "--report-file",
         str(reports), "--report-interval-s", "0.2", "--nproc-per-node", "2", str(HF_EXAMPLE),
         "--epochs", "1", "--num-samples", str(n), "--seq-len", str(seq_len),
         "--per-device-batch", str(m0), "--lr", str(lr), "--seed", str(seed), "--dtype",
         "float64", "--gns-every", "2", "--control-interval-s", "0", "--batch-at-step",
         "1:40x2", "--log-dir", str(logs), "--final-params", str(final), "--output-dir",
         str(tmp_path / "out")],
    )  # fmt: skip
    assert launch.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, launch.text()[-3000:]
    steps = _steps_of(logs)
    assert sorted(steps) == list(range(len(steps)))
    starts = _assert_documented_chunks(steps, n, seed)
    assert [steps[s]["batch"] for s in range(4)] == [16, 16, 16, 40]
    assert all(steps[s]["batch"] == 40 for s in steps if s >= 3)
    assert (steps[3]["epoch"], starts[3]) == (0, 48)  # mid-epoch
    events = [r for r in read_jsonl(logs) if "event" in r]
    assert [e["step"] for e in events if e["event"] == "batch_request"] == [1]
    assert sum(1 for e in events if e["event"] == "start") == 2  # no restart
    sent = read_reports(reports)
    assert len({(r.started_at_s, r.attempt) for r in sent}) == 1
    assert {r.batch for r in sent} <= {BatchConfig(16, 1), BatchConfig(40, 2)}
    assert sent[-1].batch == BatchConfig(40, 2) and sent[-1].done
    assert sent[-1].lr_scale == pytest.approx(math.sqrt(40 / 16))
    ex = load_example(HF_EXAMPLE)
    schedule_steps = declared_length(
        max_steps=-1, num_train_epochs=1, num_samples=n, initial_batch_size=m0
    ).schedule_steps
    reference = _reference_weights(ex, n, seq_len, seed, lr, m0, schedule_steps, steps)
    got = torch.load(final)
    for name, ref in reference.items():
        torch.testing.assert_close(got[name], ref, rtol=1e-7, atol=1e-10, msg=name)


# --------------------------------------------------------------------------------------------
# Gradient noise: the HF integration and coadapt's own loop, same model, data and order.


@pytest.mark.slow
def test_gradient_noise_agrees_with_our_own_loop(cluster: Cluster, tmp_path: Path) -> None:
    """Two launches of 2 processes, learning rate 0 (the parameters, hence the true gradient
    statistics, stay fixed), a measurement every step: the Trainer's ``train()`` and
    ``trainer.init``'s loop over the same model, data and order. Both feed the same
    estimator (:mod:`trainer.gns`) with the same per-replica gradients (the Trainer's
    ``compute_loss`` is the model's own mean loss, the same as the loop's) and the same Adam
    preconditioner (AdamW either way, same moments at lr 0); they differ only in float
    summation order, so they must agree to 1e-6 relative, far inside the estimator's own
    (sampling) noise, which a looser, noise-sized tolerance would have to allow for two
    different samplings; a wrong weighting, preconditioning or local/global split changes the
    estimates themselves."""
    stats = {}
    for mode in ("coadapt", "loop"):
        logs = tmp_path / f"logs-{mode}"
        launch = cluster.launch(
            mode,
            ["--job-id", f"gns-{mode}", "--checkpoint-uri", str(tmp_path / f"ckpt-{mode}"),
             "--report-file", str(tmp_path / f"r-{mode}.jsonl"), "--nproc-per-node", "2",
             str(HF_EXAMPLE), "--mode", mode, "--epochs", "2", "--num-samples", "512",
             "--per-device-batch", "32", "--lr", "0", "--gns-every", "1", "--dtype", "float64",
             "--log-dir", str(logs), "--output-dir", str(tmp_path / "out")],
        )  # fmt: skip
        assert launch.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, launch.text()[-3000:]
        ends = [r for r in read_jsonl(logs) if r.get("event") == "epoch_end"]
        stats[mode] = {(e["epoch"], "sqr"): e["grad_sqr"] for e in ends} | {
            (e["epoch"], "var"): e["grad_var"] for e in ends
        }
        assert all(e["measurements"] >= 14 for e in ends), ends
    assert set(stats["coadapt"]) == set(stats["loop"]) == {
        (0, "sqr"), (0, "var"), (1, "sqr"), (1, "var")
    }  # fmt: skip
    for key, value in stats["loop"].items():
        assert value != 0 and stats["coadapt"][key] == pytest.approx(value, rel=1e-6), key


# --------------------------------------------------------------------------------------------
# The example job spec.


@pytest.mark.slow
def test_the_hf_example_spec_runs_the_hf_example_under_the_launcher() -> None:
    """``examples/jobs/hf-classifier.yaml`` loads; the argv the node agent builds from it is a
    valid launcher command for examples/hf_classifier.py, whose arguments the script accepts,
    with the Trainer's per-device batch x accumulation (the job's initial batch) equal to the
    spec's initial batch size."""
    from autoscaler.controller.agent import JobAssignment, launch_argv
    from autoscaler.controller.jobspec import load_job_spec
    from trainer import launch

    spec = load_job_spec(ROOT / "examples" / "jobs" / "hf-classifier.yaml")
    assert spec.name == "hf-classifier" and (spec.min_gpus, spec.max_gpus) == (1, 2)
    assignment = JobAssignment(
        job=spec.name,
        gpus=spec.min_gpus,
        nodes=(("i-0", spec.min_gpus),),
        rendezvous="127.0.0.1:29500",
        command=spec.command,
    )
    config = launch.parse_args(launch_argv(assignment, controller_url=None)[3:])
    assert config.script == str(ROOT / "examples/hf_classifier.py")  # the spec folder's ../
    launch.preflight(config, cwd="/")
    args = load_example(HF_EXAMPLE).parse_args(list(config.script_args))
    assert args.per_device_batch * args.accum == spec.init_batch_size
