"""A Hugging Face ``transformers.Trainer`` co-adapted like coadapt's own loop.

A script changes two lines::

    from trainer.integrations.hf import CoadaptTrainer      # was: from transformers import Trainer
    trainer = CoadaptTrainer(model=model, args=args, train_dataset=ds, ...)   # was: Trainer(...)
    trainer.train()

and runs as before (``python script.py``: one standalone process), under ``torchrun``, or under
coadapt (``coadapt submit`` / ``coadapt-launch``).

**Design: a ``Trainer`` subclass whose ``train()`` runs the step loop of
:class:`trainer.api.ElasticJob`,** and keeps everything else of the Trainer: its model, its
``TrainingArguments``, its optimizer and learning-rate scheduler
(``create_optimizer_and_scheduler``, so ``optim``, ``learning_rate``, ``weight_decay``,
``lr_scheduler_type``, ``warmup_*`` mean what they mean), its ``compute_loss`` (custom losses,
``compute_loss_func``, label smoothing), its data collator and column removal, ``max_grad_norm``
clipping, its callbacks (``on_train_begin``, ``on_epoch_begin/end``, ``on_step_begin``,
``on_substep_end``, ``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``, ``on_log``,
``on_train_end``), its ``TrainerState`` (``global_step``, ``epoch``, ``log_history``), its logging
flow (``DefaultFlowCallback``'s ``should_log``) and everything after ``train()`` (``evaluate``,
``save_model``, ``predict``). Why not a ``TrainerCallback`` on the Trainer's own loop: that loop
fixes what exact elastic resumption needs to own. Its sampler shards the data by world size
(``DistributedSampler`` / accelerate's batch-sampler shards), so a checkpoint taken at 2 processes
names a position in an order that does not exist at 1; its resume (``resume_from_checkpoint``)
skips ``global_step x gradient_accumulation_steps`` batches of the *new* loader, which is the right
sample only at the old world size and batch; its gradient accumulation count is fixed for the run;
and a callback cannot weight micro-batches, read the local gradient before the all-reduce (gradient
noise) or scale the learning rate per step. Re-deriving each of those inside its loop would be a
second copy of rules that live once in :mod:`trainer.data`, :mod:`trainer.stepping`,
:mod:`trainer.gns` and :mod:`trainer.scaling`; running the Trainer's pieces on coadapt's loop uses
the one copy, so a HF job sends the same reports as any other and resumes the same way.

What each coadapt duty maps to:

* **Length** (:func:`declared_length`): ``max_steps > 0`` declares ``max_steps`` initial-batch
  iterations (a step at the initial batch size is one); otherwise ``num_train_epochs`` (a float
  is fine) declares ``num_train_epochs x len(train_dataset) / M0``
  (:func:`trainer.report.epochs_progress`). Training ends by the one rule,
  :func:`trainer.report.is_done`; ``TrainerState.max_steps`` follows it (so
  ``DefaultFlowCallback`` does not end training at a step count that a larger or smaller batch
  made wrong).
* **Initial batch** ``M0`` = ``per_device_train_batch_size x gradient_accumulation_steps``
  (the total batch of one process, what the hyper-parameters were tuned for: it does not change
  with the world size), or ``initial_batch_size=``. Run alone, the job trains at
  ``BatchConfig(M0, gradient_accumulation_steps)``; under coadapt the controller's plan sets the
  global batch and the accumulation steps, and the per-device batch follows
  (``ceil(M / (W x accum))``). The same ``batch_size.initial`` goes into the job spec.
* **Reports** (profiles, gradient-noise statistics, progress, target) are the job's own
  (:mod:`trainer.reporter`): same schema, same path, rank 0.
* **Stop**: SIGTERM, a spot notice (stop file) or the controller's word stop the job at the next
  agreed safe point (between optimizer steps, after the loop body's scheduler step), which saves
  one checkpoint and raises :class:`trainer.api.JobStopped` out of ``train()`` (exit status 0;
  the launcher relaunches at the new world size). Do not catch it.
* **Checkpoint**: the coadapt checkpoint (:mod:`trainer.checkpoint`, ``COADAPT_CHECKPOINT_URI``)
  holds the states the Trainer's own checkpoints hold (model, optimizer, scheduler, the
  ``TrainerState`` with ``log_history`` and stateful callbacks, every rank's RNG) plus the data
  position, gradient statistics and batch configuration. ``save_strategy``/``save_steps`` decide
  when (``DefaultFlowCallback``'s ``should_save``); ``train()`` always resumes from the job's
  newest checkpoint, at the exact sample, whatever the world size (``resume_from_checkpoint`` is
  ignored, with a warning). ``output_dir`` gets what ``save_model()`` writes, as usual.

  *Why not the Trainer's own checkpoints* (``Trainer._save_checkpoint``, ``output_dir/
  checkpoint-<step>/``; read in transformers 5.25), as issue 38 asked and Lightning's job does
  (:mod:`trainer.integrations.lightning` saves through ``trainer.save_checkpoint``): three of
  the things an exact resume on a spot fleet needs are outside that format, not just outside
  its resume. (1) Its RNG is one file per process (``rng_state_<process_index>.pth``, or
  ``rng_state.pth`` when alone): after a rescale from 2 processes to 1, or to more processes,
  a process finds no file of its name and keeps whatever state it had (transformers logs it
  at info level and goes on); coadapt gathers every rank's state on rank 0 and derives new
  ranks' deterministically. (2) It has no data position: its resume skips
  ``global_step % steps_per_epoch x gradient_accumulation_steps`` batches of the *new* loader,
  the right sample only at the old world size and batch; our position (epoch, samples
  consumed, step, batch configuration and the agreed-but-not-in-force schedule) would have to
  ride in an extra file that only coadapt reads, beside files that the Trainer would read
  wrongly if a user passed the folder to ``resume_from_checkpoint``. (3) Its writes go file by
  file into the final folder under ``output_dir`` (local disk; no staging, no digest), so a
  preemption during the save leaves a partial ``checkpoint-<step>`` that
  ``get_last_checkpoint`` still picks; the job's store (``COADAPT_CHECKPOINT_URI``, local or
  object storage) writes one framed, digest-checked object atomically and falls back past a
  corrupt one, which is what the stop checkpoint of a spot notice relies on. Saving the
  Trainer's folder *as well* (for tools that read it) would double every save's cost on the
  notice's deadline and still not be what the job resumes from, so it is not done; a user who
  wants one calls ``save_model()`` after ``train()``.
* **Batch changes** from the controller (total batch and accumulation steps; the per-device
  batch follows) apply mid-epoch without a restart, by the rule of coadapt's own loop
  (:mod:`trainer.stepping`, "Batch changes"): the ranks agree on the change at an exchange
  of the stop flags (around a report's reply, every step: a reply that arrives during step
  ``r`` is read at the end of ``r + 1``) and it is in force from the next optimizer step; the
  elastic loader re-plans the rest of the epoch from there (every sample still once) and the
  accumulation count is the plan's. A change requested before an epoch starts is in force from
  its first step. Only a change of GPU count is a restart (stop, checkpoint, relaunch), in
  which the planned batch comes with the launch. The learning-rate rule is
  :func:`trainer.scaling.default_rule` of the Trainer's optimizer (AdamW: square root), applied
  at every step with that step's batch.

Not supported under ``CoadaptTrainer.train()`` (each refused or warned about, never silently
changed): iterable datasets (the elastic order needs ``len()`` and indexing), evaluation during
training (``eval_strategy``: call ``evaluate()`` after ``train()``), DeepSpeed/FSDP/model
parallelism, ``auto_find_batch_size``, ``model_init``/hyper-parameter search, fp16/bf16 mixed
precision (the model trains in its own dtype). The model's dropout draws from each rank's RNG:
a run at another world size is the same optimisation but not bit-identical unless the model is
deterministic (dropout 0).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Generator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
import transformers
from transformers.trainer_callback import TrainerState
from transformers.trainer_utils import TrainOutput

from trainer.api import ElasticJob, init
from trainer.data import MicroBatch
from trainer.errors import TrainerConfigError
from trainer.report import BatchConfig, epochs_progress

__all__ = ["CoadaptTrainer", "HfLength", "declared_length"]

logger = logging.getLogger("trainer.integrations.hf")

STATE_NAME = "hf_trainer_state"
"""Name of the ``TrainerState`` in the job's checkpoint."""


@dataclass(frozen=True)
class HfLength:
    """The length a Trainer's arguments declare.

    ``target_progress``: in initial-batch-size iterations (the unit of
    :func:`trainer.report.is_done`). ``epochs``: data epochs that reach it at the initial batch
    size (an upper bound for :meth:`trainer.api.ElasticJob.epochs`' no-progress check).
    ``schedule_steps``: optimizer steps at the initial batch size, what the learning-rate
    schedule is built for (HF's ``num_training_steps``).
    """

    target_progress: float
    epochs: int
    schedule_steps: int


def declared_length(
    *, max_steps: int, num_train_epochs: float, num_samples: int, initial_batch_size: int
) -> HfLength:
    """The job's length from the Trainer's own ``max_steps`` / ``num_train_epochs``.

    ``max_steps > 0`` wins (as in ``transformers``): ``max_steps`` steps at the initial batch
    size are ``max_steps`` initial-batch iterations. Otherwise ``num_train_epochs`` passes over
    ``num_samples`` samples. Raises :class:`TrainerConfigError` for an empty length.
    """
    if initial_batch_size < 1:
        raise TrainerConfigError("must be >= 1", field="initial_batch_size")
    if num_samples < 1:
        raise TrainerConfigError("the training dataset is empty", field="train_dataset")
    steps_per_epoch = math.ceil(num_samples / initial_batch_size)
    if max_steps > 0:
        return HfLength(
            target_progress=float(max_steps),
            epochs=max(1, math.ceil(max_steps / steps_per_epoch)),
            schedule_steps=int(max_steps),
        )
    target = epochs_progress(num_train_epochs, num_samples, initial_batch_size)
    if target is None or not math.isfinite(target):
        raise TrainerConfigError(
            f"max_steps {max_steps} and num_train_epochs {num_train_epochs} declare no length",
            field="num_train_epochs",
        )
    return HfLength(
        target_progress=target,
        epochs=max(1, math.ceil(num_train_epochs)),
        schedule_steps=max(1, math.ceil(num_train_epochs * steps_per_epoch)),
    )


class _StateHolder:
    """The Trainer's ``TrainerState`` as a checkpointable object (``state_dict`` / ``load``)."""

    def __init__(self, owner: CoadaptTrainer) -> None:
        self._owner = owner

    def state_dict(self) -> dict[str, Any]:
        return asdict(self._owner.state)

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        fields = dict(data)
        current = self._owner.state
        # The process-local fields are this process's, not the saving one's.
        fields["is_local_process_zero"] = current.is_local_process_zero
        fields["is_world_process_zero"] = current.is_world_process_zero
        self._owner.state = TrainerState(**fields)


def _clip_closure(params: Sequence[torch.Tensor], max_norm: float) -> Any:
    """A closure for ``optimizer.step(closure)`` that clips the (all-reduced) gradients.

    The inner optimizer calls it at the start of its step, so clipping happens after coadapt
    checked the gradient and measured its noise on the unclipped values, and only when the
    update is applied. Returns ``None`` (no loss to re-evaluate).
    """

    def clip() -> None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)

    return clip


class CoadaptTrainer(transformers.Trainer):
    """``transformers.Trainer`` whose ``train()`` runs under coadapt (see module docstring).

    ``initial_batch_size``: the job's ``M0`` (default ``per_device_train_batch_size x
    gradient_accumulation_steps``). ``job_options``: further :class:`trainer.options.JobOptions`
    fields (e.g. ``gns_every_steps``, ``control_interval_s``, ``max_batch_size``). Everything
    else is ``transformers.Trainer``'s.
    """

    def __init__(
        self,
        *args: Any,
        initial_batch_size: int | None = None,
        job_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        options = dict(job_options or {})
        for reserved in ("initial_batch_size", "weight_model_outputs"):
            if reserved in options:
                raise TrainerConfigError("is set by CoadaptTrainer", field=reserved)
        self._coadapt_options = options
        self._coadapt_m0 = initial_batch_size
        self.coadapt_job: ElasticJob | None = None
        """The job while ``train()`` runs (its ``micro_batch``, ``progress``, ``batch`` ...)."""

    # ------------------------------------------------------------------ setup
    @property
    def initial_batch_size(self) -> int:
        args = self.args
        m0 = self._coadapt_m0 or args.per_device_train_batch_size * args.gradient_accumulation_steps
        if isinstance(m0, bool) or not isinstance(m0, int) or m0 < 1:
            raise TrainerConfigError(f"must be an integer >= 1, got {m0!r}", field="initial_batch")
        return m0

    def _check_supported(self, resume_from_checkpoint: Any) -> None:
        args = self.args
        if self.model_init is not None:
            raise TrainerConfigError("is not supported under coadapt", field="model_init")
        if getattr(self, "is_deepspeed_enabled", False) or getattr(self, "is_fsdp_enabled", False):
            raise TrainerConfigError("DeepSpeed and FSDP are not supported", field="args")
        if args.auto_find_batch_size:
            raise TrainerConfigError("the batch size is coadapt's", field="auto_find_batch_size")
        if args.fp16 or args.bf16:
            raise TrainerConfigError("mixed precision is not supported yet", field="fp16/bf16")
        if self.train_dataset is None:
            raise TrainerConfigError("training requires a train_dataset", field="train_dataset")
        try:
            len(self.train_dataset)  # type: ignore[arg-type]
        except TypeError as e:
            raise TrainerConfigError(
                "the elastic sample order needs a dataset with len() and indexing",
                field="train_dataset",
            ) from e
        if resume_from_checkpoint:
            warnings.warn(
                "CoadaptTrainer resumes from the job's newest coadapt checkpoint; "
                "resume_from_checkpoint is ignored",
                stacklevel=3,
            )
        if str(args.eval_strategy) not in ("no", "IntervalStrategy.NO"):
            warnings.warn(
                "evaluation during training is not run under coadapt: call evaluate() after "
                "train()",
                stacklevel=3,
            )

    def _train_dataset_and_collator(self) -> tuple[Any, Any]:
        dataset = self.train_dataset
        collator = self.data_collator
        try:
            import datasets

            if isinstance(dataset, datasets.Dataset):
                dataset = self._remove_unused_columns(dataset, description="training")
            else:
                collator = self._get_collator_with_removed_columns(collator, "training")
        except ImportError:
            collator = self._get_collator_with_removed_columns(collator, "training")
        return dataset, collator

    # ------------------------------------------------------------------ train
    def train(  # type: ignore[override]
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
        **kwargs: Any,
    ) -> TrainOutput:
        """Train to the declared length under coadapt; resumes from the job's newest
        checkpoint. Raises :class:`trainer.api.JobStopped` when the job stops to be relaunched
        (let it propagate: the process exits with status 0)."""
        if trial is not None:
            raise TrainerConfigError("hyper-parameter search is not supported", field="trial")
        self._check_supported(resume_from_checkpoint)
        args = self.args
        m0 = self.initial_batch_size
        dataset, collator = self._train_dataset_and_collator()
        length = declared_length(
            max_steps=args.max_steps,
            num_train_epochs=args.num_train_epochs,
            num_samples=len(dataset),
            initial_batch_size=m0,
        )
        options: dict[str, Any] = {
            "data_seed": args.data_seed if args.data_seed is not None else args.seed,
            # HF models return the loss beside the logits it is computed from: the loop weights
            # the loss (below), not the model's outputs.
            "weight_model_outputs": False,
            **self._coadapt_options,
        }
        job = init(m0, **options)
        self.coadapt_job = job
        self.is_in_train = True
        try:
            return self._train_job(job, dataset, collator, length)
        finally:
            self.is_in_train = False

    def _train_job(
        self, job: ElasticJob, dataset: Any, collator: Any, length: HfLength
    ) -> TrainOutput:
        args = self.args
        start_time = time.time()
        model = self.model
        if not isinstance(model, torch.nn.Module):
            raise TrainerConfigError("a Trainer needs a model", field="model")
        model.train()
        # The Trainer's own: those given in optimizers=(...) or made here as its arguments say.
        self.create_optimizer_and_scheduler(num_training_steps=length.schedule_steps)
        if self.optimizer is None:
            raise TrainerConfigError("create_optimizer made no optimizer", field="optimizers")
        ddp, optimizer = job.prepare(model, self.optimizer, lr_scheduler=self.lr_scheduler)
        self.model_wrapped = ddp
        loader = job.data_loader(
            dataset,
            shuffle=True,
            collate_fn=collator,
            num_workers=args.dataloader_num_workers,
        )
        stateful: list[Any] = [
            cb
            for cb in [*self.callback_handler.callbacks, self.control]
            if isinstance(cb, transformers.trainer_callback.ExportableState)
        ]
        self.state = TrainerState(
            is_local_process_zero=job.env.local_rank == 0,
            is_world_process_zero=job.rank == 0,
            stateful_callbacks=stateful,
        )
        self.state.compute_steps(args, length.schedule_steps)
        self.state.train_batch_size = m0 = self.initial_batch_size
        self.state.num_train_epochs = length.epochs
        job.register(STATE_NAME, _StateHolder(self))
        restored = job.restore()
        if restored is None:
            transformers.set_seed(args.seed)
            if job.env.batch is None:  # alone: the Trainer's own accumulation
                job.request_batch_config(BatchConfig(m0, args.gradient_accumulation_steps))
        self.state.max_steps = length.schedule_steps
        self._follow_length(job)

        clip = args.max_grad_norm
        params = [p for p in model.parameters() if p.requires_grad]
        closure = _clip_closure(params, float(clip)) if clip and clip > 0 else None
        num_samples = len(dataset)
        handler = self.callback_handler
        self.control = handler.on_train_begin(args, self.state, self.control)
        loss_sum = torch.zeros((), dtype=torch.float64)
        loss_steps = 0
        logged_sum, logged_steps = 0.0, 0
        stopped_by_callback = False
        epochs = cast(
            Generator[int, None, None],
            job.epochs(length.epochs, target_progress=length.target_progress),
        )
        for epoch in epochs:
            self.control = handler.on_epoch_begin(args, self.state, self.control)
            step_loss = torch.zeros((), dtype=torch.float64)
            for inputs in loader:
                micro: MicroBatch = job.micro_batch  # type: ignore[assignment]  # set by loader
                if micro.index == 0:
                    self.control = handler.on_step_begin(args, self.state, self.control)
                inputs = self._prepare_inputs(inputs)
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(ddp, inputs)
                if not isinstance(loss, torch.Tensor):
                    raise TrainerConfigError("compute_loss must return the loss", field="loss")
                # Each micro-batch's mean loss, weighted so that DDP's average is the mean over
                # the global batch whatever the split (trainer.data, "Weights"); the weighted
                # sum over this replica's micro-batches estimates the global batch's mean loss.
                (loss * micro.weight).backward()
                step_loss += loss.detach().double() * micro.weight
                if micro.is_last:
                    self.control = handler.on_pre_optimizer_step(args, self.state, self.control)
                else:
                    self.control = handler.on_substep_end(args, self.state, self.control)
                optimizer.step(closure)
                if not job.at_step_boundary:
                    continue
                self.control = handler.on_optimizer_step(args, self.state, self.control)
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                optimizer.zero_grad()
                loss_sum += step_loss
                loss_steps += 1
                step_loss = torch.zeros((), dtype=torch.float64)
                self.state.global_step = job.step
                self.state.epoch = epoch + job.data_state.position / num_samples
                self._follow_length(job)
                self.control = handler.on_step_end(args, self.state, self.control)
                logged_sum, logged_steps = self._after_callbacks(
                    job, loss_sum, loss_steps, logged_sum, logged_steps, start_time
                )
                if self.control.should_training_stop and not job.training_done:
                    stopped_by_callback = True
                    break
            self.control = handler.on_epoch_end(args, self.state, self.control)
            logged_sum, logged_steps = self._after_callbacks(
                job, loss_sum, loss_steps, logged_sum, logged_steps, start_time
            )
            if stopped_by_callback:
                epochs.close()
                break
        job.finish()
        self.state.global_step = job.step
        metrics = {
            "train_runtime": round(time.time() - start_time, 4),
            "train_loss": float(loss_sum) / max(1, loss_steps),
            "progress": job.progress,
            "target_progress": length.target_progress,
            "epoch": self.state.epoch,
        }
        self.control = handler.on_train_end(args, self.state, self.control)
        job.close()
        # After train(): evaluate()/predict() wrap the model as the Trainer does (the job's DDP
        # wrapper may hold a process group the job has just closed).
        self.model_wrapped = model
        return TrainOutput(job.step, metrics["train_loss"], metrics)

    def _follow_length(self, job: ElasticJob) -> None:
        """``TrainerState.max_steps`` follows the one done rule: past the current step until
        the job is done, the current step when it is (``DefaultFlowCallback`` ends training
        when ``global_step >= max_steps``)."""
        state = self.state
        if job.training_done:
            state.max_steps = state.global_step
        elif state.max_steps <= state.global_step:
            state.max_steps = state.global_step + 1

    def _after_callbacks(
        self,
        job: ElasticJob,
        loss_sum: torch.Tensor,
        loss_steps: int,
        logged_sum: float,
        logged_steps: int,
        start_time: float,
    ) -> tuple[float, int]:
        """Do what the callbacks asked (``DefaultFlowCallback``): ``should_save`` saves a
        coadapt checkpoint (collective: the flags follow ``global_step``, the same on every
        rank); ``should_log`` logs (``on_log``) the mean loss since the last log, the learning
        rate in force (scaled) and coadapt's view (progress, batch). ``should_evaluate`` is
        dropped (evaluation runs after ``train()``)."""
        control = self.control
        if control.should_save:
            control.should_save = False
            if job.at_step_boundary:
                job.save_checkpoint(wait=False)
        if control.should_evaluate:
            control.should_evaluate = False
        if not control.should_log:
            return logged_sum, logged_steps
        control.should_log = False
        total = float(loss_sum)
        steps = loss_steps - logged_steps
        if steps <= 0:
            return logged_sum, logged_steps
        lr = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None
        logs: dict[str, float] = {
            "loss": (total - logged_sum) / steps,
            "coadapt_progress": job.progress,
            "coadapt_batch_size": float(job.batch.global_batch_size),
            "coadapt_accum_steps": float(job.batch.accum_steps),
        }
        if lr is not None:
            logs["learning_rate"] = float(lr) * (job.lr_scale or 1.0)
        self.log(logs, start_time)
        return total, loss_steps
