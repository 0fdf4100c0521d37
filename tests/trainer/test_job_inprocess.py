"""``ElasticJob`` in one process (a real gloo group of one, no launcher): accumulation,
learning-rate scheduling, stop/restore round trips and usage errors. Fast; the multi-process
behaviour is covered by test_elastic_acceptance.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.api import ElasticJob, JobOptions, JobStopped
from trainer.env import TrainerEnv
from trainer.errors import TrainerConfigError, TrainerUsageError
from trainer.report import BatchConfig, TrainerReport
from trainer.reporter import read_reports

N, DIM = 50, 4


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, DIM, generator=g, dtype=torch.float64)
    y = x @ torch.randn(DIM, 1, generator=g, dtype=torch.float64) + 0.1
    return torch.utils.data.TensorDataset(torch.arange(N), x, y)


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
    ).double()


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator[Callable[..., ElasticJob]]:
    jobs: list[ElasticJob] = []

    def make(batch: BatchConfig | None = None, **options: object) -> ElasticJob:
        environ = {
            "COADAPT_CHECKPOINT_URI": str(tmp_path / "ckpt"),
            "COADAPT_REPORT_FILE": str(tmp_path / "reports.jsonl"),
        }
        if batch is not None:
            environ["COADAPT_BATCH_SIZE"] = str(batch.global_batch_size)
            environ["COADAPT_ACCUM_STEPS"] = str(batch.accum_steps)
        options.setdefault("initial_batch_size", 10)
        options.setdefault("preimport", False)
        job = ElasticJob(JobOptions(**options), env=TrainerEnv.from_environ(environ))  # type: ignore[arg-type]
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.close()


def _train(
    job: ElasticJob,
    epochs: int,
    *,
    zero_first: bool = False,
    stop_at_step: int | None = None,
    lr_step: int = 4,
) -> tuple[torch.nn.Module, list[list[int]]]:
    model = _model()
    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(inner, step_size=lr_step, gamma=0.5)
    ddp, opt = job.prepare(model, inner, lr_scheduler=scheduler)
    loader = job.data_loader(_data())
    job.restore()
    steps: dict[int, list[int]] = {}
    for _ in job.epochs(epochs):
        for ids, x, y in loader:
            if zero_first:
                opt.zero_grad()  # the other common order: must not drop accumulated gradients
            steps.setdefault(job.micro_batch.step, []).extend(ids.tolist())
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            if not zero_first:
                opt.zero_grad()
            scheduler.step()  # per iteration: must count optimizer steps, not micro-batches
            if stop_at_step is not None and job.step == stop_at_step and job.at_step_boundary:
                job.request_stop()
    return model, [steps[s] for s in sorted(steps)]


def _reference(batches: list[list[int]], lr_step: int = 4) -> torch.nn.Module:
    _, x, y = _data().tensors
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=lr_step, gamma=0.5)
    for ids in batches:
        opt.zero_grad()
        F.mse_loss(model(x[ids]), y[ids]).backward()
        opt.step()
        scheduler.step()
    return model


@pytest.mark.parametrize("zero_first", [False, True])
@pytest.mark.parametrize("batch", [BatchConfig(10, 1), BatchConfig(10, 3), BatchConfig(7, 2)])
def test_accumulation_and_uneven_splits_give_the_global_batch_update(
    make_job, batch: BatchConfig, zero_first: bool
) -> None:
    # initial batch = current batch: the AdaScale gain is exactly 1, as in the reference
    job = make_job(batch, gns_every_steps=2, initial_batch_size=batch.global_batch_size)
    model, batches = _train(job, 2, zero_first=zero_first)
    assert [len(b) for b in batches[: -(-N // batch.global_batch_size)]][-1] == (
        N % batch.global_batch_size or batch.global_batch_size
    )
    reference = _reference(batches)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    assert job.step == len(batches) and job.gradient_stats is not None


def test_stop_then_restore_continues_exactly(make_job, tmp_path: Path) -> None:
    first = make_job(BatchConfig(10, 1))
    with pytest.raises(JobStopped) as stopped:
        _train(first, 3, stop_at_step=7)
    # requested after step 7; flags are exchanged at the end of each step and read at the end
    # of the next, so the stop lands after step 9 (the same step on every rank)
    assert stopped.value.code == 0 and stopped.value.step == 9
    assert first.last_checkpoint is not None and first.last_checkpoint.step == 9
    first.close()
    torch.manual_seed(123)  # the restore must bring the RNG back, whatever happens before
    second = make_job(BatchConfig(10, 2))
    model, later = _train(second, 3)
    info = second.restore()  # idempotent: what the first call used
    assert info is not None and info.checkpoint.step == 9 and info.skipped == ()
    assert len(later) == 15 - 9
    all_batches = _batches_of_a_full_run()
    assert later == all_batches[9:]
    reference = _reference(all_batches)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    second.finish()
    reports = read_reports(tmp_path / "reports.jsonl")
    assert reports[-1].step == 15 and reports[-1].epoch == 3


def _batches_of_a_full_run() -> list[list[int]]:
    from trainer.data import epoch_order

    out = []
    for epoch in range(3):
        order = epoch_order(N, 0, epoch).tolist()
        out.extend(order[i : i + 10] for i in range(0, N, 10))
    return out


def test_batch_configuration_changes_at_the_next_agreed_step(make_job) -> None:
    job = make_job(BatchConfig(10, 1))
    model = _model()
    ddp, opt = job.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = job.data_loader(_data())
    configs: dict[int, BatchConfig] = {}
    seen: dict[int, list[int]] = {}
    for epoch in job.epochs(2):
        for ids, x, y in loader:
            job.request_batch_config(BatchConfig(25, 5))
            configs[job.micro_batch.step] = job.micro_batch.batch
            seen.setdefault(epoch, []).extend(ids.tolist())
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
    # Alone, the exchange runs every step: the request is offered at the end of step 0, read
    # at the end of step 1 and in force from the next step, 2: mid-epoch 0 (position 20), the
    # rest of the epoch re-planned at 25 (every sample once), no restart.
    assert [configs[s] for s in range(3)] == [BatchConfig(10, 1)] * 2 + [BatchConfig(25, 5)]
    assert all(configs[s] == BatchConfig(25, 5) for s in configs if s >= 2)
    assert sorted(seen[0]) == list(range(N))
    report = job.build_report()
    assert TrainerReport.from_json(report.to_json()) == report
    assert report.batch == BatchConfig(25, 5)
    # The declared length is 2 epochs at the initial batch: 2 x 50 / 10 = 10 iterations of
    # progress. Each step of 25 makes between 1 and 2.5 (the AdaScale gain; the 5-sample tail
    # of epoch 0 a fifth of that), so the loop runs on past epoch 1 until the target is
    # reached, and stops at the step that reaches it.
    assert report.target_progress == 10.0 and job.target_progress == 10.0
    assert report.progress >= 10.0 and report.progress - 2.5 < 10.0


def test_adam_statistics_are_preconditioned_and_lr_is_sqrt_scaled(make_job) -> None:
    job = make_job(BatchConfig(20, 1), gns_every_steps=1)
    model = _model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    ddp, opt = job.prepare(model, inner)
    loader = job.data_loader(_data())
    lrs = []
    for _ in job.epochs(4):
        for _ids, x, y in loader:
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            lrs.append(inner.param_groups[0]["lr"])
    stats = job.gradient_stats
    assert stats is not None and stats.preconditioned and stats.grad_var > 0
    assert job.build_report().hints.scaling_rule == "sqrt"
    assert set(lrs) == {0.01}  # the factor sqrt(20/10) applies only inside step()


def test_usage_errors_are_typed(make_job) -> None:
    job = make_job(gns_every_steps=0)
    model = _model()
    with pytest.raises(TrainerConfigError):
        job.prepare(
            model, torch.optim.SGD(model.parameters(), lr=0.1), gradient_as_bucket_view=True
        )
    ddp, opt = job.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TrainerUsageError):
        job.prepare(model, opt)
    with pytest.raises(TrainerUsageError):
        opt.step()  # outside the loader
    loader = job.data_loader(_data())
    with pytest.raises(TrainerUsageError):
        job.data_loader(_data())
    with pytest.raises(TrainerConfigError):
        job.register("model", model)
    with pytest.raises(TrainerConfigError):
        job.register("thing", object())
    for _ in job.epochs(1):
        for _ids, x, y in loader:
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            with pytest.raises(TrainerUsageError):
                opt.step()
            opt.zero_grad()
            break
    with pytest.raises(TrainerConfigError):
        JobOptions(initial_batch_size=0)


def test_the_declared_length_is_the_done_rule(make_job) -> None:
    """``epochs(3)`` declares 3 x 50 / 10 = 15 iterations of progress. At a batch of 20 each
    step makes between 1 and 2 (its gain); the loader ends the run at the step that reaches
    the target, mid-epoch if that is where it lands, and the final report says done, with
    the target, the learning-rate factor of the rule (AdaScale: the gain) and no work left."""
    job = make_job(BatchConfig(20, 1), gns_every_steps=1)
    model = _model()
    ddp, opt = job.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    loader = job.data_loader(_data())
    gains: list[float] = []
    for _ in job.epochs(3):
        for _ids, x, y in loader:
            before = job.progress
            F.mse_loss(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            gains.append(job.progress - before)
            assert before < 15.0, "no global batch is handed out once the target is reached"
    assert job.progress >= 15.0 > job.progress - gains[-1]
    report = job.build_report()
    assert (report.target_progress, report.remaining_progress, report.done) == (15.0, 0.0, False)
    # full steps make their gain: the factor AdaScale applied to the learning rate
    full = [g for g in gains if g > 1.0 + 1e-9]
    assert full, "the gain rose above 1 once the gradient noise was measured"
    job.finish()
    final = read_reports(Path(job.env.report_file or ""))[-1]
    assert final.done and final.target_progress == 15.0 and final.lr_scale is not None
    assert 1.0 <= final.lr_scale <= 2.0


def test_a_job_without_an_elastic_loader_declares_no_length(make_job) -> None:
    job = make_job()
    model = _model()
    job.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    assert list(job.epochs(2)) == [0, 1]
    assert job.target_progress is None and job.build_report().remaining_progress is None
    with pytest.raises(TrainerConfigError):
        list(job.epochs(-1))
