"""PyTorch Lightning: a ``LightningModule`` trained by ``lightning.Trainer`` as a coadapt job.

A script changes in three places (see ``examples/lightning_classifier.py``)::

    from trainer.integrations.lightning import CoadaptLightning

    job = CoadaptLightning(initial_batch_size=64)               # 1. before the Trainer
    trainer = L.Trainer(max_epochs=10, accumulate_grad_batches=2,
                        callbacks=[job], **job.trainer_kwargs()) # 2. devices, strategy, ...
    job.fit(trainer, model, dataset)                             # 3. not trainer.fit(model, dl)

``initial_batch_size`` is the total batch the hyper-parameters were tuned for (per-device batch x
``accumulate_grad_batches`` x devices of the run they were tuned on); ``dataset`` is a map-style
dataset (``len()`` and integer indexing); ``fit`` passes other ``DataLoader`` arguments
(``collate_fn``, ``num_workers``, ...) through. Nothing else in the ``LightningModule`` changes.

**Design: a Callback that owns an** :class:`~trainer.api.ElasticJob` **(why).** The job's rules
(exact sample order, micro-batch weights, optimizer-step bookkeeping, AdaScale, gradient-noise
estimation, stop agreement, reports, exit markers) live once, in :mod:`trainer.stepping`,
:mod:`trainer.data` and :mod:`trainer.api`; Lightning keeps its own loop, hooks, logging,
schedulers and checkpoint format. A ``Strategy`` subclass would own fewer hook points (it sees no
batch boundaries) and a launcher of our own would replace Lightning's loop; a ``Callback`` sees
every boundary the step loop needs (fit start, each batch start and end) and leaves the user's
``Trainer`` arguments alone. What the callback wires in, and where:

* **Process group, devices.** :meth:`CoadaptLightning.trainer_kwargs` gives Lightning a
  ``DDPStrategy`` over coadapt's :class:`~trainer.env.TrainerEnv` (a ``ClusterEnvironment`` that
  reports torchrun's ranks; no process launching) with ``use_distributed_sampler=False``. The job
  initialises ``torch.distributed`` before ``fit``; Lightning finds it initialised and reuses it,
  and wraps the model in ``DistributedDataParallel`` itself (always, one process included, so the
  gradient path is the same at every world size).
* **Data.** Lightning's train loader is an iterable over the job's elastic plan
  (:meth:`trainer.data.ElasticDataLoader.load`): one Lightning batch is one micro-batch of the
  global, world-size-independent order; the plan of an epoch is made when Lightning starts
  iterating it (after a restore, from the restored position) and made again from the step where
  a batch change comes into force. It has no ``len()``: Lightning then ends an epoch when the
  plan is exhausted, so a plan that changes length (new batch configuration, resume mid-epoch)
  never confuses its batch counting.
* **Accumulation.** The plan decides how many micro-batches a replica runs per optimizer step
  (``accum_steps``, fewer at an epoch's tail, two on a one-replica measurement step). Lightning's
  ``accumulate_grad_batches`` is read once, as the initial accumulation, and then set to 1 (no
  loss division: the plan's per-micro-batch weights make each update the mean over the global
  batch, as in our loop); its accumulation decision (the epoch loop's ``_should_accumulate``,
  a private method of Lightning 2.6 that its optimizer loop, DDP ``no_sync`` and scheduler
  stepping all ask) is answered from the plan: "accumulate unless this is the replica's last
  micro-batch of the step".
* **Optimizer.** Lightning's optimizer is wrapped in an
  :class:`~trainer.scaling.ElasticOptimizer` whose ``step(closure)`` runs Lightning's closure
  (forward, backward, clipping, hooks) and then the job's optimizer step (finiteness check,
  learning-rate scaling rule, progress, data position, gradient noise, stop exchange). Optimizers
  that call the closure several times per step (LBFGS) and manual optimisation are refused.
* **Stop and checkpoint.** SIGTERM, the preemption-notice file and the controller's reply set the
  job's stop flag (Lightning's own SIGTERM handler, which broadcasts from inside a signal
  handler, is not installed); the ranks agree on a step, and at the first batch end after it
  (``on_train_batch_end`` of the step's last micro-batch, after Lightning stepped its
  schedulers) the job saves through **Lightning's own** ``trainer.save_checkpoint`` (model,
  optimizer, schedulers, loops, callbacks, precision) with a ``CheckpointIO`` that stores the
  file in the job's checkpoint store (self-checking, atomic, keep-last-K); this callback's state
  carries the job's counters, data position, batch configuration, gradient statistics and every
  rank's RNG. The next launch passes the newest valid checkpoint as ``ckpt_path``: Lightning
  restores its state, and the job resumes at the exact sample at any world size.
* **Length.** The job's length is declared from the ``Trainer``'s own ``max_steps`` and
  ``max_epochs`` in the progress unit of :func:`trainer.report.is_done` (``max_steps`` optimizer
  steps at the initial batch are ``max_steps`` initial-batch iterations; ``max_epochs`` are
  ``max_epochs x len(dataset) / initial_batch_size``; with both, the smaller). Training then
  ends by that one rule (Lightning's own limits are lifted once the length is declared: at a
  larger batch an epoch is worth less progress, and the run goes on into later epochs).
* **Batch configuration.** The controller's batch configuration (total batch and accumulation)
  is adopted mid-epoch without a restart, by the rule of coadapt's own loop
  (:mod:`trainer.stepping`, "Batch changes"): the ranks agree on it at an exchange of the stop
  flags (a reply that arrives during step ``r`` is read at the end of ``r + 1``), and it is in
  force from the **second** optimizer step after that exchange, not the
  first as in coadapt's loop and the Hugging Face integration: Lightning's data fetcher takes
  each batch from the loader one batch ahead of the one it trains (that is how it knows an
  epoch's last batch), so the first micro-batch of the next step is already planned when the
  exchange is read. From that step the rest of the epoch is re-planned at the new total batch
  (every sample still once), the accumulation count follows the plan (see *Accumulation*), the
  learning-rate rule applies each step's own batch, and an agreed change not yet in force is
  saved in the checkpoint. A change requested before an epoch starts is in force from its first
  step; a configuration set at a restart (``COADAPT_BATCH_SIZE``) applies from the first step.
  Only a change of GPU count needs a restart (the launcher's).

Lightning 2.6 is what this is tested with: the two private names it touches
(``_TrainingEpochLoop._should_accumulate`` and the trainer's signal connector) are checked at
``fit`` and a missing one is refused with :class:`~trainer.errors.TrainerConfigError`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from coadapt_common.clock import Clock
from trainer.api import CHECKPOINT_FORMAT, ElasticJob, JobStopped
from trainer.checkpoint import (
    CheckpointInfo,
    CheckpointManager,
    RestoreInfo,
    checkpoint_name,
    encode,
    step_of,
)
from trainer.data import ElasticDataLoader, MicroBatch
from trainer.env import TrainerEnv
from trainer.errors import TrainerConfigError, TrainerUsageError
from trainer.options import JobOptions
from trainer.report import BatchConfig
from trainer.scaling import ElasticOptimizer, default_rule

__all__ = ["CHECKPOINT_PREFIX", "CoadaptLightning", "JobStopped", "declared_length"]

logger = logging.getLogger("trainer")

CHECKPOINT_PREFIX = "coadapt-store:"
"""Lightning checkpoint paths that name an object of the job's checkpoint store."""


def declared_length(
    *, max_steps: int | None, max_epochs: int | None, num_samples: int, initial_batch_size: int
) -> float | None:
    """The job's length in initial-batch-size iterations from Lightning's own limits.

    ``max_steps`` (``-1`` or ``None``: unset) optimizer steps at the initial batch are worth
    ``max_steps`` iterations; ``max_epochs`` (``-1`` or ``None``: unset) are worth ``max_epochs x
    num_samples / initial_batch_size``, as :meth:`trainer.api.ElasticJob.epochs` declares them.
    Lightning stops at whichever limit comes first, so with both the smaller one is declared.
    ``None`` when neither is set (Lightning then runs its default number of epochs, undeclared).
    """
    if initial_batch_size < 1:
        raise TrainerConfigError("must be >= 1", field="initial_batch_size")
    targets = []
    if max_steps is not None and max_steps >= 0:
        targets.append(float(max_steps))
    if max_epochs is not None and max_epochs >= 0:
        targets.append(max_epochs * num_samples / initial_batch_size)
    return min(targets) if targets else None


class _TrainerEnvironment(ClusterEnvironment):
    """Lightning's view of the processes: exactly what torchrun told the job (it launches
    nothing; the process group already exists when Lightning asks)."""

    def __init__(self, env: TrainerEnv) -> None:
        super().__init__()
        self._env = env

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        import os

        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        import os

        return int(os.environ.get("MASTER_PORT", "0") or 0)

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self._env.world_size

    def set_world_size(self, size: int) -> None:
        if size != self._env.world_size:
            raise TrainerConfigError(
                f"Lightning wants {size} processes, the launcher started {self._env.world_size}",
                field="devices",
            )

    def global_rank(self) -> int:
        return self._env.rank

    def set_global_rank(self, rank: int) -> None:
        if rank != self._env.rank:
            raise TrainerConfigError(f"rank {rank} != {self._env.rank}", field="rank")

    def local_rank(self) -> int:
        return self._env.local_rank

    def node_rank(self) -> int:
        return self._env.node_rank


class _StoreCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O: paths ``coadapt-store:<name>`` go to the job's checkpoint
    store (:mod:`trainer.checkpoint` framing: length and digest checked on read, atomic write,
    keep-last-K); any other path (a user's ``ModelCheckpoint``) to Lightning's own files."""

    def __init__(self, manager: CheckpointManager) -> None:
        super().__init__()
        self._manager = manager
        self.saved: CheckpointInfo | None = None
        self._preloaded: tuple[str, Any] | None = None

    @staticmethod
    def store_name(path: Any) -> str | None:
        text = str(path)
        if not text.startswith(CHECKPOINT_PREFIX):
            return None
        name = text[len(CHECKPOINT_PREFIX) :]
        if step_of(name) is None:
            raise TrainerConfigError(f"not a checkpoint name: {name!r}", field="ckpt_path")
        return name

    def preload(self, name: str, payload: Any) -> None:
        """Hand over a checkpoint rank 0 already read and verified (read once, not twice)."""
        self._preloaded = (name, payload)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        name = self.store_name(path)
        if name is None:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        step = step_of(name)
        assert step is not None  # store_name checked it
        blob, info = encode(checkpoint, step)
        self._manager.write(blob, info)
        self.saved = info

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        name = self.store_name(path)
        if name is None:
            return super().load_checkpoint(path, map_location, weights_only)
        if self._preloaded is not None and self._preloaded[0] == name:
            payload = self._preloaded[1]
            self._preloaded = None
            return payload  # type: ignore[no-any-return]
        payload, _ = self._manager.read(name, map_location="cpu")
        return payload  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        if self.store_name(path) is None:
            super().remove_checkpoint(path)


class _ClosureThenStep(ElasticOptimizer):
    """Lightning hands ``step`` the closure that runs forward and backward; the job's step
    bookkeeping reads the gradients, so the closure runs first (once), then the job's step."""

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        super().step(None)
        return loss


class _LightningJob(ElasticJob):
    """An :class:`ElasticJob` whose checkpoints are Lightning's and whose step loop is driven by
    Lightning's batch hooks (see the module docstring). Used through :class:`CoadaptLightning`."""

    def __init__(self, options: JobOptions, *, env: TrainerEnv | None, clock: Clock | None) -> None:
        super().__init__(options, env=env, clock=clock)
        self.checkpoint_io = _StoreCheckpointIO(self._manager)
        self._trainer: pl.Trainer | None = None
        self._queue: collections.deque[MicroBatch] = collections.deque()
        # Lightning's data fetcher takes a step's first micro-batch from the plan before the
        # previous step's update: a change agreed at a step is planned for the one after next.
        self._loop.batch_lead_steps = 2

    # ------------------------------------------------------------------ set-up
    def declare(self, target_progress: float | None, initial_accum_steps: int) -> None:
        self._loop.target_progress = target_progress
        if self.env.batch is None:
            self._loop.batch = BatchConfig(self.options.initial_batch_size, initial_accum_steps)

    def attach_trainer(self, trainer: pl.Trainer) -> None:
        """At ``on_fit_start`` (after Lightning wrapped the model and built the optimizer)."""
        strategy = trainer.strategy
        module = trainer.lightning_module
        if not module.automatic_optimization:
            raise TrainerConfigError("manual optimisation is not supported", field="model")
        ddp = strategy.model
        if not isinstance(ddp, DistributedDataParallel):
            raise TrainerConfigError(
                "the model is not wrapped in DistributedDataParallel: use job.trainer_kwargs()",
                field="strategy",
            )
        if ddp.gradient_as_bucket_view:
            raise TrainerConfigError(
                "coadapt reads each replica's local gradient before DDP reduces it in place",
                field="gradient_as_bucket_view",
            )
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise TrainerConfigError(
                "fp16 loss scaling (GradScaler) is not supported: use bf16 or 32-bit precision",
                field="precision",
            )
        optimizers = strategy.optimizers
        if len(optimizers) != 1:
            raise TrainerConfigError(
                f"one optimizer per job (configure_optimizers returned {len(optimizers)})",
                field="configure_optimizers",
            )
        inner = optimizers[0]
        if isinstance(inner, torch.optim.LBFGS):
            raise TrainerConfigError("LBFGS evaluates its closure repeatedly", field="optimizer")
        params: list[torch.Tensor] = [p for p in module.parameters() if p.requires_grad]
        if not params:
            raise TrainerConfigError("the model has no trainable parameters", field="model")
        rule = self.options.scaling_rule or default_rule(inner)
        elastic = _ClosureThenStep(inner, self._loop, rule)
        strategy.optimizers = [elastic]
        params[0].register_post_accumulate_grad_hook(self._loop.mark_grads_done)
        self._loop.attach(ddp, params, elastic)
        trainer.accumulate_grad_batches = 1
        epoch_loop = trainer.fit_loop.epoch_loop
        if not callable(getattr(epoch_loop, "_should_accumulate", None)):
            raise TrainerConfigError(
                f"lightning {pl.__version__}: no _should_accumulate to answer", field="lightning"
            )
        epoch_loop._should_accumulate = self._accumulating  # type: ignore[method-assign]
        if self._loop.target_progress is not None:
            trainer.fit_loop.max_epochs = -1  # the declared length ends training (is_done)
            epoch_loop.max_steps = -1
        self._trainer = trainer

    def _accumulating(self) -> bool:
        mb = self._loop.micro_batch
        return mb is not None and not mb.is_last

    def resume_path(self) -> str | None:
        """The newest valid checkpoint (rank 0 picks, every rank gets the same), as a
        ``ckpt_path`` for ``trainer.fit``; ``None`` for a fresh start (collective)."""
        chosen: list[Any] = [None]
        if self.rank == 0:
            loaded = self._manager.load_latest(map_location="cpu")
            if loaded is not None:
                payload, info = loaded
                self.checkpoint_io.preload(info.checkpoint.name, payload)
                c = info.checkpoint
                chosen[0] = (c.name, c.step, c.size_bytes, c.sha256, info.skipped)
        if self.world_size > 1:
            dist.broadcast_object_list(chosen, src=0, group=self._ctrl_group)
        self._restored = True
        if chosen[0] is None:
            return None
        name, step, size, sha, skipped = chosen[0]
        self._restore_info = RestoreInfo(CheckpointInfo(name, step, size, sha), tuple(skipped))
        return CHECKPOINT_PREFIX + name

    # ------------------------------------------------------------------ StepHost
    def restore(self) -> RestoreInfo | None:
        """Lightning restores (``ckpt_path``); this only says what it restored from."""
        self._restored = True
        return self._restore_info

    def save_checkpoint(self, *, wait: bool = True) -> CheckpointInfo | None:
        """Save through Lightning's ``trainer.save_checkpoint`` into the job's store
        (collective; Lightning's write is synchronous, so ``wait`` is always honoured)."""
        if not self._loop.at_step_boundary:
            raise TrainerUsageError("checkpoints are taken between optimizer steps")
        if self._trainer is None:
            raise TrainerUsageError("no Lightning trainer attached (use CoadaptLightning.fit)")
        start = self._clock.monotonic_s()
        self.checkpoint_io.saved = None
        self._trainer.save_checkpoint(CHECKPOINT_PREFIX + checkpoint_name(self._loop.step))
        info = self.checkpoint_io.saved if self.rank == 0 else None
        if info is not None:
            self._last_checkpoint = info
        self._loop.note_checkpoint()
        self.timings = dataclasses.replace(self.timings, save_s=self._clock.monotonic_s() - start)
        return info

    # ------------------------------------------------------------------ callback state
    def state(self) -> dict[str, Any]:
        """The job's part of a Lightning checkpoint (collective: every rank's RNG is gathered
        on rank 0). The same payload as our own loop's checkpoints, minus the states Lightning
        saves itself (model, optimizer, schedulers)."""
        return {"coadapt": self._checkpoint_payload(self._quiesce_and_gather_rng())}

    def load_state(self, state: dict[str, Any]) -> None:
        payload = state.get("coadapt")
        if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
            raise TrainerConfigError("checkpoint has no coadapt state", field="ckpt_path")
        self._apply_checkpoint(payload)
        if self.rank == 0:
            logger.warning(
                "coadapt: resumed from step %d (epoch %d, position %d)",
                self._loop.step,
                self._loop.data.epoch,
                self._loop.data.position,
            )

    # ------------------------------------------------------------------ data and batches
    def start_epoch(self, num_samples: int) -> bool:
        """Lightning starts iterating the train data: agree the batch configuration (at an
        epoch boundary). False when the declared length is already reached."""
        self._queue.clear()
        loop = self._loop
        loop.start_epoch_iteration(num_samples)
        if loop.training_done:
            if self._trainer is not None:
                self._trainer.should_stop = True
            return False
        return True

    def planned(self, mb: MicroBatch) -> None:
        self._queue.append(mb)

    def enter_next(self) -> MicroBatch:
        if not self._queue:
            raise TrainerUsageError("a Lightning batch that the elastic plan did not hand out")
        mb = self._queue.popleft()
        self._loop.enter_micro_batch(mb)
        return mb

    def after_batch(self, trainer: pl.Trainer) -> None:
        """At the end of each Lightning batch: after a step's last micro-batch, end training
        once the declared length is reached, else run the safe point (stop or checkpoint if
        the ranks agreed to)."""
        loop = self._loop
        if not loop.at_step_boundary:
            return
        if loop.training_done:
            trainer.should_stop = True
            return
        loop.safe_point()

    def epoch_seed(self) -> int:
        return (self.options.data_seed * 1_000_003 + self._loop.data.epoch) & 0x7FFFFFFF


class _ElasticTrainData:
    """Lightning's train 'dataloader': the job's plan, one micro-batch per Lightning batch,
    loaded by a ``torch.utils.data.DataLoader`` (``dataloader_kwargs`` pass through). No
    ``len()`` (see the module docstring). Its ``DataLoader`` draws its base seed from a
    private generator seeded per epoch, so iterating does not consume the global RNG (which
    a restore sets exactly)."""

    def __init__(self, job: _LightningJob, loader: ElasticDataLoader) -> None:
        self._job = job
        self._loader = loader

    def __iter__(self) -> Iterator[Any]:
        if not self._job.start_epoch(len(self._loader.dataset)):
            return
        generator = torch.Generator().manual_seed(self._job.epoch_seed())
        # The job's plan, re-planned from a step whose configuration changed mid-epoch.
        for mb, batch in self._loader.load(generator=generator):
            self._job.planned(mb)
            yield batch


class CoadaptLightning(pl.Callback):
    """Runs a Lightning ``fit`` as one worker of an elastic coadapt job (see the module
    docstring). Create it first (it joins the process group and starts reporting), add it to
    the ``Trainer``'s callbacks with :meth:`trainer_kwargs`, and call :meth:`fit`.

    ``options`` are :class:`~trainer.options.JobOptions` fields (``gns_every_steps``,
    ``data_seed``, ``checkpoint_every_s``, ...).
    """

    def __init__(
        self,
        initial_batch_size: int,
        *,
        env: TrainerEnv | None = None,
        clock: Clock | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.job = _LightningJob(
            JobOptions(initial_batch_size=initial_batch_size, **options), env=env, clock=clock
        )

    @property
    def micro_batch(self) -> MicroBatch | None:
        """The micro-batch Lightning is training on (``None`` outside an epoch)."""
        return self.job.micro_batch

    def trainer_kwargs(self) -> dict[str, Any]:
        """``accelerator``, ``devices``, ``num_nodes``, ``strategy`` and
        ``use_distributed_sampler`` for ``lightning.Trainer`` (the launcher decides them)."""
        job = self.job
        env = job.env
        strategy = DDPStrategy(
            cluster_environment=_TrainerEnvironment(env),
            checkpoint_io=job.checkpoint_io,
            process_group_backend=job.backend,
        )
        return {
            "accelerator": "gpu" if job.device.type == "cuda" else "cpu",
            "devices": env.local_world_size if env.distributed else 1,
            "num_nodes": env.num_nodes if env.distributed else 1,
            "strategy": strategy,
            "use_distributed_sampler": False,
        }

    def fit(
        self,
        trainer: pl.Trainer,
        model: pl.LightningModule,
        dataset: Any,
        *,
        shuffle: bool = True,
        **dataloader_kwargs: Any,
    ) -> None:
        """``trainer.fit`` on the job's elastic plan over ``dataset``, resumed from the newest
        checkpoint; then the final checkpoint and the "done" exit marker. Raises
        :class:`~trainer.api.JobStopped` (exit status 0) when the job stopped at an agreed step
        with a checkpoint: the launcher relaunches it."""
        job = self.job
        if not any(cb is self for cb in getattr(trainer, "callbacks", ())):
            raise TrainerConfigError("add the job to the Trainer's callbacks", field="callbacks")
        if trainer.strategy.checkpoint_io is not job.checkpoint_io:
            raise TrainerConfigError(
                "build the Trainer with **job.trainer_kwargs()", field="strategy"
            )
        connector = getattr(trainer, "_signal_connector", None)  # lightning 2.6
        if connector is None or not callable(getattr(connector, "register_signal_handlers", None)):
            raise TrainerConfigError(
                f"lightning {pl.__version__}: no signal connector to disable", field="lightning"
            )
        # The job owns SIGTERM (agreed stop); Lightning's handler would broadcast from inside
        # the signal handler and raise at an unagreed step.
        connector.register_signal_handlers = _no_signal_handlers
        loader = job.data_loader(dataset, shuffle=shuffle, **dataloader_kwargs)
        job.declare(
            declared_length(
                max_steps=trainer.max_steps,
                max_epochs=trainer.max_epochs,
                num_samples=len(dataset),
                initial_batch_size=job.options.initial_batch_size,
            ),
            int(trainer.accumulate_grad_batches),
        )
        data = _ElasticTrainData(job, loader)
        ckpt_path = job.resume_path()
        trainer.fit(model, train_dataloaders=data, ckpt_path=ckpt_path)
        job.finish()

    # ------------------------------------------------------------------ Lightning hooks
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.job.attach_trainer(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.job.enter_next()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.job.after_batch(trainer)

    def state_dict(self) -> dict[str, Any]:
        return self.job.state()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.job.load_state(state_dict)


def _no_signal_handlers() -> None:
    """Replaces Lightning's signal registration (see :meth:`CoadaptLightning.fit`)."""
