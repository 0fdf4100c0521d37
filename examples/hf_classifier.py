"""A small text classifier trained with the Hugging Face ``transformers.Trainer``, under coadapt.

A 2-layer BERT (hidden 32) built from a config with random weights, on token sequences this script
generates (nothing is downloaded): the label says whether "signal" tokens outnumber "noise"
tokens in the sequence. The two lines that make it a coadapt job are marked ``# coadapt``. Run it
alone (one process)::

    python examples/hf_classifier.py --epochs 2

under the coadapt launcher (or ``coadapt submit examples/jobs/hf-classifier.yaml``)::

    python -m trainer.launch --nproc-per-node 2 examples/hf_classifier.py --epochs 2

Send SIGTERM to the launcher at any time: the workers agree on a step, save one checkpoint and
exit; relaunch with any ``--nproc-per-node`` and training resumes at the exact sample.

``--mode hf`` trains the same model with the plain ``transformers.Trainer`` (no coadapt), and
``--mode loop`` with coadapt's own loop (``trainer.init``): for comparisons. The options after
``--log-dir`` exist for coadapt's tests and benchmark (per-rank JSON-lines logs of every
micro-batch's sample ids and of events).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments

import trainer
from trainer.integrations.hf import CoadaptTrainer  # coadapt
from trainer.report import BatchConfig

VOCAB, SIGNAL, NOISE = 64, range(8, 16), range(16, 24)


class SyntheticText(torch.utils.data.Dataset):
    """``num_samples`` sequences of ``seq_len`` tokens; deterministic for a seed."""

    def __init__(self, num_samples: int, seq_len: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.input_ids = torch.randint(4, VOCAB, (num_samples, seq_len), generator=g)
        self.input_ids[:, 0] = 2  # a [CLS]-like first token
        signal = torch.isin(self.input_ids, torch.tensor(list(SIGNAL))).sum(1)
        noise = torch.isin(self.input_ids, torch.tensor(list(NOISE))).sum(1)
        self.labels = (signal > noise).long()
        self.attention_mask = torch.ones_like(self.input_ids)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[i],
            "attention_mask": self.attention_mask[i],
            "labels": self.labels[i],
        }


def build_model(seed: int, dtype: torch.dtype) -> BertForSequenceClassification:
    """Random weights from ``seed`` (the same on every rank); dropout 0, so that a run at
    another world size is the same computation (dropout would draw from each rank's RNG)."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForSequenceClassification(config).to(dtype)


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


class LoggingTrainer(CoadaptTrainer):
    """Logs each micro-batch's sample ids (coadapt's tests read them), and sleeps per sample
    when asked (an accelerator's per-sample work, which a second replica halves)."""

    def __init__(self, *a: Any, log: Log, sample_delay_s: float, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self._log = log
        self._sample_delay_s = sample_delay_s

    def compute_loss(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
        job = self.coadapt_job
        micro = job.micro_batch if job is not None else None
        if micro is not None:
            self._log(
                step=micro.step,
                epoch=micro.epoch,
                micro=micro.index,
                ids=micro.counted_ids.tolist(),
                world_size=micro.world_size,
                batch=micro.batch.global_batch_size,
                accum=micro.batch.accum_steps,
            )
            if self._sample_delay_s:
                time.sleep(self._sample_delay_s * len(micro.sample_ids))
        return super().compute_loss(model, inputs, *a, **kw)


class EventLog(transformers.TrainerCallback):
    """Logs the first step, each epoch's end (with the gradient statistics) and the stop; on
    rank 0, requests the batch configurations of ``batch_at`` (``{step: config}``) when those
    global steps begin, as a controller's reply would."""

    def __init__(self, log: Log, batch_at: dict[int, BatchConfig] | None = None) -> None:
        self.log = log
        self.trainer: CoadaptTrainer | None = None
        self.batch_at = batch_at or {}
        self._first = True

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        job = self.trainer.coadapt_job if self.trainer is not None else None
        if job is not None and job.rank == 0 and state.global_step in self.batch_at:
            job.request_batch_config(self.batch_at[state.global_step])
            self.log(event="batch_request", step=state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._first:
            self._first = False
            self.log(event="first_step", t=time.time(), step=state.global_step)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        job = self.trainer.coadapt_job if self.trainer is not None else None
        if job is None:
            return
        stats = job.gradient_stats
        self.log(
            event="epoch_end",
            epoch=job.epoch,
            step=job.step,
            progress=job.progress,
            target_progress=job.target_progress,
            grad_sqr=None if stats is None else stats.grad_sqr,
            grad_var=None if stats is None else stats.grad_var,
            measurements=None if stats is None else stats.measurements,
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--num-samples", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--per-device-batch", type=int, default=32)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--output-dir", default=None, help="default: a folder under /tmp")
    p.add_argument("--mode", choices=["coadapt", "hf", "loop"], default="coadapt")
    p.add_argument("--gns-every", type=int, default=16)
    p.add_argument("--control-interval-s", type=float, default=0.5)
    # Test and benchmark hooks.
    p.add_argument("--log-dir", default=None)
    p.add_argument("--sample-delay-s", type=float, default=0.0)
    p.add_argument(
        "--batch-at-step",
        default="",
        help='e.g. "3:40x2": rank 0 requests that configuration when global step 3 begins',
    )
    p.add_argument("--initial-params", default=None, help="rank 0 saves the initial model here")
    p.add_argument("--final-params", default=None, help="rank 0 saves the final model here")
    return p.parse_args(argv)


def parse_batch_at(text: str) -> dict[int, BatchConfig]:
    """``"3:40x2,9:16x1"`` -> {3: BatchConfig(40, 2), 9: BatchConfig(16, 1)}."""
    out = {}
    for item in filter(None, text.split(",")):
        step, config = item.split(":")
        size, accum = config.split("x")
        out[int(step)] = BatchConfig(int(size), int(accum))
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dtype = getattr(torch, args.dtype)
    rank = int(os.environ.get("RANK", "0"))
    log = Log(args.log_dir, rank)
    log(event="start", t=time.time(), pid=os.getpid(), mode=args.mode)
    dataset = SyntheticText(args.num_samples, args.seq_len, args.seed + 1)
    model = build_model(args.seed, dtype)
    if args.initial_params and rank == 0 and not Path(args.initial_params).exists():
        torch.save(model.state_dict(), args.initial_params)
    if args.mode == "loop":
        train_with_our_loop(args, model, dataset, log)
        return
    training_args = TrainingArguments(
        output_dir=args.output_dir or f"/tmp/hf-classifier-{os.getuid()}",
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_batch,
        gradient_accumulation_steps=args.accum,
        learning_rate=args.lr,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="epoch",
        disable_tqdm=True,
    )
    events = EventLog(log, parse_batch_at(args.batch_at_step))
    common: dict[str, Any] = dict(
        model=model, args=training_args, train_dataset=dataset, callbacks=[events]
    )
    hf: transformers.Trainer
    if args.mode == "hf":  # the same script without coadapt
        hf = transformers.Trainer(**common)
    else:
        hf = LoggingTrainer(  # coadapt
            **common,
            log=log,
            sample_delay_s=args.sample_delay_s,
            job_options={
                "gns_every_steps": args.gns_every,
                "control_interval_s": args.control_interval_s,
            },
        )
        events.trainer = hf
    try:
        result = hf.train()
    except trainer.JobStopped as stop:
        log(event="stopped", t=time.time(), step=stop.step)
        raise
    if args.final_params and rank == 0:
        torch.save(hf.model.state_dict(), args.final_params)
    log(event="done", t=time.time(), step=result.global_step, metrics=result.metrics)


def train_with_our_loop(
    args: argparse.Namespace, model: torch.nn.Module, dataset: SyntheticText, log: Log
) -> None:
    """The same model and data on coadapt's own loop (``trainer.init``), for comparisons: the
    optimizer is a plain AdamW (no weight decay) without clipping."""
    job = trainer.init(
        args.per_device_batch * args.accum,
        gns_every_steps=args.gns_every,
        control_interval_s=args.control_interval_s,
        data_seed=args.seed,
        weight_model_outputs=False,
    )
    ddp, optimizer = job.prepare(model, torch.optim.AdamW(model.parameters(), lr=args.lr))
    loader = job.data_loader(dataset)
    job.restore()
    for epoch in job.epochs(int(args.epochs)):
        for batch in loader:
            micro = job.micro_batch
            (ddp(**batch).loss * micro.weight).backward()
            optimizer.step()
            optimizer.zero_grad()
        stats = job.gradient_stats
        log(
            event="epoch_end",
            epoch=epoch,
            step=job.step,
            progress=job.progress,
            grad_sqr=None if stats is None else stats.grad_sqr,
            grad_var=None if stats is None else stats.grad_var,
            measurements=None if stats is None else stats.measurements,
        )
    job.finish()
    job.close()


if __name__ == "__main__":
    main()
