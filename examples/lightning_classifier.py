"""A small PyTorch Lightning classifier run as a coadapt job (random init, generated data).

A ``LightningModule`` (an MLP over Gaussian class clusters) trained by ``lightning.Trainer``;
the three coadapt lines are marked ``# coadapt``. Run it alone (one process, standalone)::

    python examples/lightning_classifier.py --epochs 2

or under the coadapt launcher (any number of processes; SIGTERM stops it at an agreed step with
a Lightning checkpoint, and a relaunch at any size resumes at the exact sample)::

    python -m trainer.launch --nproc-per-node 2 examples/lightning_classifier.py --epochs 3

The options after ``--log-dir`` exist for coadapt's tests and benchmark: per-rank JSON-lines
logs of every micro-batch's sample ids and of events, batch-configuration changes at epoch
boundaries or requested at given steps (as a controller's reply would), a stop requested at a
given step, the initial and final parameters, and a per-sample delay.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from trainer.integrations.lightning import CoadaptLightning, JobStopped
from trainer.report import BatchConfig


class Clusters(torch.utils.data.Dataset):
    """``classes`` Gaussian clusters in ``dim`` dimensions; items are ``(index, x, label)``."""

    def __init__(
        self, num_samples: int, dim: int, classes: int, seed: int, label_noise: float = 0.0
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        centres = 1.5 * torch.randn(classes, dim, generator=g)
        self.y = torch.randint(0, classes, (num_samples,), generator=g)
        self.x = centres[self.y] + torch.randn(num_samples, dim, generator=g)
        if label_noise > 0:  # a fraction of random labels: noisier gradients
            flip = torch.rand(num_samples, generator=g) < label_noise
            self.y[flip] = torch.randint(0, classes, (int(flip.sum()),), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        return i, self.x[i], self.y[i]


class Classifier(pl.LightningModule):
    """MLP classifier; SGD with momentum (or AdamW) and an optional per-step StepLR schedule."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        classes: int,
        lr: float,
        lr_step: int,
        optimizer: str = "sgd",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, hidden),
            nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, classes),
        )  # fmt: skip
        self.lr = lr
        self.lr_step = lr_step
        self.optimizer_name = optimizer
        self.delay_per_sample_s = 0.0
        self.delay_per_step_s = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        _, x, y = batch
        if self.delay_per_sample_s:
            time.sleep(self.delay_per_sample_s * len(x))
        return F.cross_entropy(self(x), y)

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self.delay_per_step_s:  # a fixed cost per optimizer step (larger batches amortise it)
            time.sleep(self.delay_per_step_s)

    def configure_optimizers(self) -> Any:
        opt: torch.optim.Optimizer
        if self.optimizer_name == "adamw":
            opt = torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=1e-4)
        else:
            opt = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)
        if not self.lr_step:
            return opt
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=self.lr_step, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class _Log(pl.Callback):
    """Per-rank JSON-lines log of each micro-batch (sample ids, step, world size, batch)."""

    def __init__(
        self,
        folder: str | None,
        job: CoadaptLightning,
        schedule: dict[int, BatchConfig],
        batch_at: dict[int, BatchConfig] | None = None,
        stop_at: int | None = None,
    ) -> None:
        self.job = job
        self.schedule = schedule
        self.batch_at = batch_at or {}
        self.stop_at = stop_at
        self._file = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            path = Path(folder) / f"rank{job.job.rank}-pid{os.getpid()}.jsonl"
            self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def __call__(self, **record: Any) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = self.job.job.epoch
        if epoch + 1 in self.schedule and self.job.job.rank == 0:
            # requested at the end of epoch e, agreed at the boundary before e+1
            self.job.job.request_batch_config(self.schedule[epoch + 1])

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        mb = self.job.micro_batch
        assert mb is not None
        if mb.index == 0 and self.job.job.rank == 0:
            if mb.step in self.batch_at:
                self.job.job.request_batch_config(self.batch_at[mb.step])
                self(event="batch_request", step=mb.step)
            if mb.step == self.stop_at:
                self.job.job.request_stop()
        self(
            step=mb.step,
            epoch=mb.epoch,
            micro=mb.index,
            ids=mb.counted_ids.tolist(),
            data_ids=batch[0].tolist(),
            world_size=mb.world_size,
            batch=mb.batch.global_batch_size,
            accum=mb.batch.accum_steps,
            global_step=trainer.global_step,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--num-samples", type=int, default=2048)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (RNG use)")
    p.add_argument("--initial-batch-size", type=int, default=64)
    p.add_argument("--accumulate", type=int, default=1, help="Trainer accumulate_grad_batches")
    p.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-step", type=int, default=0, help="StepLR period in optimizer steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gns-every", type=int, default=4)
    p.add_argument("--control-interval-s", type=float, default=0.5)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    # Test and benchmark hooks.
    p.add_argument("--log-dir", default=None)
    p.add_argument("--sample-delay-s", type=float, default=0.0)
    p.add_argument("--step-delay-s", type=float, default=0.0)
    p.add_argument("--label-noise", type=float, default=0.0, help="fraction of random labels")
    p.add_argument("--batch-schedule", default="", help='e.g. "1:32x2": config from epoch 1')
    p.add_argument(
        "--batch-at-step",
        default="",
        help='e.g. "3:40x2": rank 0 requests that configuration when global step 3 begins',
    )
    p.add_argument("--stop-at-step", type=int, default=None, help="rank 0 requests a stop")
    p.add_argument("--initial-params", default=None)
    p.add_argument("--final-params", default=None)
    p.add_argument(
        "--own-loop",
        action="store_true",
        help="train the same model on the same data with coadapt's own loop instead of "
        "Lightning (the reference the integration's tests compare with)",
    )
    return p.parse_args(argv)


def parse_batch_schedule(text: str) -> dict[int, BatchConfig]:
    """``"1:32x2,3:64x1"`` -> {1: BatchConfig(32, 2), 3: BatchConfig(64, 1)} (epochs, or
    steps for ``--batch-at-step``)."""
    out = {}
    for item in filter(None, text.split(",")):
        epoch, config = item.split(":")
        size, accum = config.split("x")
        out[int(epoch)] = BatchConfig(int(size), int(accum))
    return out


def build(args: argparse.Namespace) -> tuple[Clusters, Classifier]:
    """The dataset and the model, initialised from ``--seed`` (identical on every rank)."""
    dataset = Clusters(
        args.num_samples, args.dim, args.classes, seed=args.seed + 1, label_noise=args.label_noise
    )
    torch.manual_seed(args.seed)
    model = Classifier(
        args.dim,
        args.hidden,
        args.classes,
        args.lr,
        args.lr_step,
        optimizer=args.optimizer,
        dropout=args.dropout,
    )
    if args.dtype == "float64":
        model = model.double()
        dataset.x = dataset.x.double()
    return dataset, model


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.own_loop:
        own_loop(args)
        return
    job = CoadaptLightning(  # coadapt
        args.initial_batch_size,
        gns_every_steps=args.gns_every,
        control_interval_s=args.control_interval_s,
        data_seed=args.seed,
    )
    dataset, model = build(args)
    model.delay_per_sample_s = args.sample_delay_s
    model.delay_per_step_s = args.step_delay_s
    if args.initial_params and job.job.rank == 0 and not Path(args.initial_params).exists():
        torch.save(model.state_dict(), args.initial_params)
    log = _Log(
        args.log_dir,
        job,
        parse_batch_schedule(args.batch_schedule),
        parse_batch_schedule(args.batch_at_step),
        args.stop_at_step,
    )
    log(event="start", t=time.time(), world_size=job.job.world_size, pid=os.getpid())
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        accumulate_grad_batches=args.accumulate,
        callbacks=[job, log],  # coadapt: the job is a callback
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **job.trainer_kwargs(),  # coadapt: devices, strategy and sampler from the launcher
    )
    try:
        job.fit(trainer, model, dataset)  # coadapt: instead of trainer.fit(model, loader)
    except JobStopped as stop:
        log(event="stopped", t=time.time(), step=stop.step, save_s=job.job.timings.save_s)
        raise
    if args.final_params and job.job.rank == 0:
        torch.save(model.state_dict(), args.final_params)
    stats = job.job.gradient_stats
    log(
        event="done",
        t=time.time(),
        step=job.job.step,
        progress=job.job.progress,
        target_progress=job.job.target_progress,
        global_step=trainer.global_step,
        grad_sqr=None if stats is None else stats.grad_sqr,
        grad_var=None if stats is None else stats.grad_var,
    )
    job.job.close()


def own_loop(args: argparse.Namespace) -> None:
    """The same model, data, optimizer, schedule and logs with ``trainer.init`` (no Lightning)."""
    import trainer

    job = trainer.init(
        args.initial_batch_size,
        gns_every_steps=args.gns_every,
        control_interval_s=args.control_interval_s,
        data_seed=args.seed,
    )
    dataset, model = build(args)
    configured = model.configure_optimizers()
    opt, sched = (
        (configured["optimizer"], configured["lr_scheduler"]["scheduler"])
        if isinstance(configured, dict)
        else (configured, None)
    )
    ddp, opt = job.prepare(model, opt, lr_scheduler=sched)
    loader = job.data_loader(dataset)
    job.restore()
    log_dir = Path(args.log_dir) if args.log_dir else None
    out = None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        out = open(log_dir / f"rank{job.rank}-pid{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
    schedule = parse_batch_schedule(args.batch_schedule)
    for epoch in job.epochs(args.epochs):
        if epoch in schedule and job.rank == 0:
            job.request_batch_config(schedule[epoch])
        for ids, x, y in loader:
            mb = job.micro_batch
            if out is not None:
                record = dict(step=mb.step, epoch=mb.epoch, micro=mb.index,
                              ids=mb.counted_ids.tolist(), data_ids=ids.tolist(),
                              world_size=mb.world_size, batch=mb.batch.global_batch_size,
                              accum=mb.batch.accum_steps)  # fmt: skip
                out.write(json.dumps(record) + "\n")
            if args.sample_delay_s:
                time.sleep(args.sample_delay_s * len(x))
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
    job.finish()
    if args.final_params and job.rank == 0:
        torch.save(model.state_dict(), args.final_params)
    stats = job.gradient_stats
    if out is not None:
        record = dict(event="done", step=job.step, progress=job.progress,
                      target_progress=job.target_progress,
                      grad_sqr=None if stats is None else stats.grad_sqr,
                      grad_var=None if stats is None else stats.grad_var)  # fmt: skip
        out.write(json.dumps(record) + "\n")
    job.close()


if __name__ == "__main__":
    main()
