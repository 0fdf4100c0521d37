"""A small elastic training job that runs on CPU with data it generates itself.

Regression with a multi-layer perceptron (or, with ``--hidden 0``, linear regression, whose
gradient noise is known in closed form). Each sample is ``(index, x, y)`` so that logs can name
exactly which samples each step trained on. Run it under the coadapt launcher::

    python -m trainer.launch --nproc-per-node 2 examples/elastic_mlp.py --epochs 3

or alone (one process, standalone)::

    python examples/elastic_mlp.py --epochs 1

Rank 0 prints what it does as it trains (``coadapt logs JOB`` shows it): its launch (attempt,
workers, batch, where it resumed), each batch change the controller makes without a restart,
and each epoch's end, with progress in samples and as a share of the declared length
(``--quiet``: nothing).

Send SIGTERM to the launcher at any time: the workers agree on a step, save one checkpoint and
exit; relaunch with any ``--nproc-per-node`` and training resumes at the exact sample.

The options after ``--log-dir`` exist for coadapt's tests and benchmark: per-rank JSON-lines logs
of every micro-batch's sample ids and of events (restore, first step, gradient statistics,
each batch change with the step rank 0 learned it at),
injected non-finite gradients, and batch-configuration changes at epoch boundaries.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import trainer
from trainer.report import BatchConfig


class SyntheticRegression(torch.utils.data.Dataset):
    """``y = x . w_true + noise`` with ``x ~ N(0, I)``; deterministic for a seed."""

    def __init__(
        self, num_samples: int, dim: int, *, noise_std: float, seed: int, dtype: torch.dtype
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(num_samples, dim, generator=g, dtype=torch.float64)
        self.w_true = torch.randn(dim, 1, generator=g, dtype=torch.float64) / dim**0.5
        noise = noise_std * torch.randn(num_samples, 1, generator=g, dtype=torch.float64)
        self.y = self.x @ self.w_true + noise
        self.x, self.y = self.x.to(dtype), self.y.to(dtype)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


def build_model(dim: int, hidden: int, seed: int, dtype: torch.dtype) -> nn.Module:
    """The model, initialised deterministically from ``seed`` (identical on every rank)."""
    torch.manual_seed(seed)
    if hidden <= 0:
        model: nn.Module = nn.Linear(dim, 1, bias=False)
    else:
        model = nn.Sequential(
            nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
            nn.Linear(hidden, 1),
        )  # fmt: skip
    return model.to(dtype)


def loss_fn(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Half mean squared error: the per-sample gradient of linear regression is x (x.w - y)."""
    return 0.5 * F.mse_loss(pred, y)


def build_optimizer(args: argparse.Namespace, model: nn.Module) -> torch.optim.Optimizer:
    if args.optimizer == "sgd":
        return torch.optim.SGD(
            model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
        )
    return torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)


def parse_batch_schedule(text: str) -> dict[int, BatchConfig]:
    """``"1:32x2,3:64x1"`` -> {1: BatchConfig(32, 2), 3: BatchConfig(64, 1)}."""
    out = {}
    for item in filter(None, text.split(",")):
        epoch, config = item.split(":")
        size, accum = config.split("x")
        out[int(epoch)] = BatchConfig(int(size), int(accum))
    return out


class Log:
    """Per-rank JSON-lines log (one file per process), flushed on every line."""

    def __init__(self, folder: str | None, rank: int) -> None:
        self._file = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"rank{rank}-pid{os.getpid()}.jsonl"
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def __call__(self, **record: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--num-samples", type=int, default=4096)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--hidden", type=int, default=64, help="0: linear regression")
    p.add_argument("--noise-std", type=float, default=0.5)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--initial-batch-size", type=int, default=64)
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--lr-step", type=int, default=0, help="StepLR period in optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gns-every", type=int, default=8)
    p.add_argument("--gns-smoothing", type=float, default=0.95)
    p.add_argument("--checkpoint-every-steps", type=int, default=0)
    p.add_argument("--control-interval-s", type=float, default=0.5)
    p.add_argument("--quiet", action="store_true", help="print nothing while training")
    p.add_argument(
        "--no-declare",
        action="store_true",
        help="do not declare the training length (run --epochs data epochs)",
    )
    # Test and benchmark hooks.
    p.add_argument("--log-dir", default=None)
    p.add_argument("--step-delay-s", type=float, default=0.0)
    p.add_argument(
        "--sample-delay-s",
        type=float,
        default=0.0,
        help="sleep this long per sample of each micro-batch: an accelerator's per-sample "
        "work, which a second replica halves, without using the host's CPU",
    )
    p.add_argument("--inject-nonfinite-step", type=int, default=-1)
    p.add_argument("--batch-schedule", default="", help='e.g. "1:32x2": config from epoch 1')
    p.add_argument("--initial-params", default=None, help="rank 0 saves the initial model here")
    p.add_argument("--final-params", default=None, help="rank 0 saves the final model here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    job = trainer.init(
        args.initial_batch_size,
        gns_every_steps=args.gns_every,
        gns_smoothing=args.gns_smoothing,
        checkpoint_every_steps=args.checkpoint_every_steps,
        control_interval_s=args.control_interval_s,
        data_seed=args.seed,
    )
    log = Log(args.log_dir, job.rank)
    log(event="start", t=time.time(), world_size=job.world_size, pid=os.getpid())

    dataset = SyntheticRegression(
        args.num_samples, args.dim, noise_std=args.noise_std, seed=args.seed + 1, dtype=dtype
    )
    model = build_model(args.dim, args.hidden, args.seed, dtype)
    if args.initial_params and job.rank == 0 and not Path(args.initial_params).exists():
        torch.save(model.state_dict(), args.initial_params)
    optimizer = build_optimizer(args, model)
    scheduler = (
        torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.lr_step, gamma=0.5)
        if args.lr_step
        else None
    )
    ddp, optimizer = job.prepare(model, optimizer, lr_scheduler=scheduler)
    loader = job.data_loader(dataset)
    restored = job.restore()
    if restored is not None:
        log(
            event="restored",
            checkpoint=restored.checkpoint.name,
            skipped=[name for name, _ in restored.skipped],
            step=job.step,
            progress=job.progress,
            epoch=job.epoch,
            position=job.data_state.position,
            load_s=job.timings.load_s,
        )
    schedule = parse_batch_schedule(args.batch_schedule)
    first_step_logged = False
    say = _Say(job, args.initial_batch_size, quiet=args.quiet or job.rank != 0)
    say.launch(restored is not None)
    loss = torch.tensor(float("nan"))  # an epoch resumed at its end trains no batch
    last_batch = job.batch  # the configuration of the next step (after a restore)

    try:
        for epoch in job.epochs(args.epochs, declare=not args.no_declare):
            if epoch in schedule and job.rank == 0:
                job.request_batch_config(schedule[epoch])
            for ids, x, y in loader:
                micro = job.micro_batch
                log(
                    step=micro.step,
                    epoch=epoch,
                    micro=micro.index,
                    ids=micro.counted_ids.tolist(),
                    data_ids=ids.tolist(),
                    world_size=job.world_size,
                    batch=micro.batch.global_batch_size,
                    accum=micro.batch.accum_steps,
                )
                loss = loss_fn(ddp(x), y)
                if micro.step == args.inject_nonfinite_step and job.rank == 0:
                    log(event="before_nonfinite", step=micro.step, **_probe(job, model))
                    loss = loss * float("nan")
                loss.backward()
                if args.step_delay_s:
                    time.sleep(args.step_delay_s)
                if args.sample_delay_s:
                    time.sleep(args.sample_delay_s * len(ids))
                optimizer.step()
                optimizer.zero_grad()
                if scheduler is not None:
                    scheduler.step()
                if job.at_step_boundary:
                    if micro.batch != last_batch:  # this step was the first at a new one
                        last_batch = micro.batch
                        log(
                            event="batch_change",
                            rank=job.rank,
                            first_step=micro.step,
                            epoch=epoch,
                            position=micro.position,
                            batch=micro.batch.global_batch_size,
                            accum=micro.batch.accum_steps,
                            requested_at_step=job.batch_requested_at_step,
                        )
                    say.batch_change()
                    if not first_step_logged:
                        first_step_logged = True
                        log(event="first_step", t=time.time(), step=job.step)
                    if micro.step == args.inject_nonfinite_step and job.rank == 0:
                        log(event="after_nonfinite", step=micro.step, **_probe(job, model))
            stats = job.gradient_stats
            say.epoch_end(epoch, float(loss.detach()))
            log(
                event="epoch_end",
                epoch=epoch,
                step=job.step,
                progress=job.progress,
                skipped=job.skipped_steps,
                grad_sqr=None if stats is None else stats.grad_sqr,
                grad_var=None if stats is None else stats.grad_var,
                measurements=None if stats is None else stats.measurements,
            )
    except trainer.JobStopped as stop:
        log(event="stopped", t=time.time(), step=stop.step, save_s=job.timings.save_s)
        raise
    job.finish()
    say.done()
    if args.final_params and job.rank == 0:
        torch.save(model.state_dict(), args.final_params)
    log(event="done", t=time.time(), step=job.step, progress=job.progress)
    job.close()


class _Say:
    """Rank 0's lines on stdout while it trains (flushed: the job's log shows them at once).
    Progress is in samples at the initial batch (the trainer counts iterations of it; a larger
    batch's step counts as its gain, AdaScale's, times the initial batch), shown up to the
    declared length (the last step may overshoot it)."""

    def __init__(self, job: trainer.ElasticJob, initial_batch_size: int, *, quiet: bool) -> None:
        self._job = job
        self._initial = initial_batch_size
        self._quiet = quiet
        self._batch = job.batch

    def _print(self, text: str) -> None:
        if not self._quiet:
            print(f"elastic_mlp: {text}", flush=True)

    def _progress(self) -> str:
        done = round(self._job.progress * self._initial)
        target = self._job.target_progress
        if not target:
            return f"{done} samples"
        total = round(target * self._initial)
        done = min(done, total)
        return f"{done} of {total} samples ({min(100.0, 100.0 * done / total):.0f} %)"

    @staticmethod
    def _batch_text(batch: BatchConfig) -> str:
        return f"{batch.global_batch_size} ({batch.accum_steps} micro-step(s))"

    def launch(self, resumed: bool) -> None:
        where = f"resumed at {self._progress()}" if resumed else "from the start"
        self._print(
            f"attempt {self._job.env.attempt}: {self._job.world_size} worker(s), batch "
            f"{self._batch_text(self._batch)}, {where}"
        )

    def batch_change(self) -> None:
        batch = self._job.batch
        if batch != self._batch:
            self._print(
                f"batch {self._batch_text(self._batch)} -> {self._batch_text(batch)} at step "
                f"{self._job.step}, without a restart (attempt {self._job.env.attempt})"
            )
            self._batch = batch

    def epoch_end(self, epoch: int, loss: float) -> None:
        self._print(f"epoch {epoch} done: {self._progress()}, last loss {loss:.4g}")

    def done(self) -> None:
        self._print(f"finished: {self._progress()}")


def _probe(job: trainer.ElasticJob, model: nn.Module) -> dict[str, Any]:
    """Exact values for the non-finite test: device GNS state and a parameter checksum."""
    return {
        "gns_state": job.read_gradient_state(),
        "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "skipped": job.skipped_steps,
    }


if __name__ == "__main__":
    main()
