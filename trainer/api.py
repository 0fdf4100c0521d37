"""The entry point a training script uses: :func:`init` returns an :class:`ElasticJob`.

A script changes in a few lines (see ``examples/elastic_mlp.py``)::

    job = trainer.init(initial_batch_size=64)
    model, optimizer = job.prepare(model, optimizer, lr_scheduler=scheduler)
    loader = job.data_loader(dataset)
    job.restore()                       # resume from the newest valid checkpoint, if any
    for epoch in job.epochs(10):
        for x, y in loader:             # micro-batches of this replica
            loss = loss_fn(model(x), y)  # mean over the micro-batch
            loss.backward()
            optimizer.step()            # a no-op on accumulation micro-steps
            optimizer.zero_grad()
    job.finish()

What the job does around that loop:

* **Process group and DDP.** Initialises ``torch.distributed`` from the launcher's environment
  (gloo on CPU, NCCL on GPU; a private single-process group when run without a launcher) and
  wraps the model in ``DistributedDataParallel`` (its own C++ all-reduce, no Python hook). Each
  micro-batch's output gradient is weighted so that DDP's average is the mean over the *global*
  batch (see :mod:`trainer.data`; the weight is 1, i.e. nothing is done, in the common even
  case). On measurement steps, temporary gradient hooks read each replica's local gradient
  before DDP reduces it (:mod:`trainer.gns`).
* **Optimizer.** Wrapped by :class:`~trainer.scaling.ElasticOptimizer`: steps once per global
  batch, skips the update when the reduced gradient is not finite, scales the learning rate
  (:mod:`trainer.scaling`).
* **Stop and checkpoint.** SIGTERM, a preemption-notice file, the controller's reply or
  :meth:`ElasticJob.request_stop` set a local flag; a small lagged all-reduce (about every
  ``control_interval_s``) makes every rank see it at the same step. At the next safe point
  (before the next global batch is handed out, after the user's loop body finished the last
  one) rank 0 saves one checkpoint, every rank writes an exit marker and raises
  :class:`JobStopped` (exit status 0). The launcher then relaunches at the new world size and
  :meth:`ElasticJob.restore` resumes at the exact sample.
* **Step loop.** The per-step work (micro-batch entry, optimizer step, gradient-noise
  measurement, the stop/checkpoint exchange and the safe points) is
  :class:`trainer.stepping.StepLoop`; the job owns one and supplies the checkpoint, restore and
  stop actions it needs.
* **Reports.** Rank 0 reports profiles and gradient statistics every ``report_interval_s``
  (:mod:`trainer.reporter`).

Per step, beyond DDP's own work (which keeps its built-in C++ all-reduce hook), the job adds:
one sum per gradient tensor and a host read of the result (the finiteness check); every
``control_interval_s`` a three-integer asynchronous all-reduce on a CPU (gloo) group; on
measurement steps (every ``gns_every_steps``) one squared-norm pass over the local and one over
the reduced gradients and a two-element all-reduce, finished one step later. On CPU none of
this waits for anything; on CUDA the finiteness flag is one small device-to-host read per step
(what ``GradScaler`` does too) and the gradient statistics reach the host through a lagged,
event-guarded copy.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import signal
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from coadapt_common.clock import Clock, SystemClock
from trainer.checkpoint import CheckpointInfo, CheckpointManager, RestoreInfo, encode
from trainer.control import ControlChannel, ExitKind, ExitMarker, RunDir, StopCause
from trainer.data import DataState, ElasticDataLoader, MicroBatch
from trainer.env import TrainerEnv
from trainer.errors import TrainerConfigError, TrainerUsageError
from trainer.options import JobOptions
from trainer.report import (
    BatchConfig,
    GradientStats,
    JobHints,
    ReportReply,
    TrainerReport,
    epochs_progress,
)
from trainer.reporter import FileSink, HttpSink, Reporter
from trainer.scaling import ElasticOptimizer, ScalingRule, default_rule
from trainer.stepping import StepLoop
from trainer.storage import open_store

logger = logging.getLogger("trainer")

CHECKPOINT_FORMAT = 1


class JobStopped(SystemExit):
    """Raised on every rank after an agreed stop checkpoint; the process exits with status 0.

    It is a ``SystemExit`` (not an error): the launcher tells a stop from completion by the exit
    markers. Do not catch it in the training loop.
    """

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(0)
        self.step = step
        self.checkpoint = checkpoint


@dataclass(frozen=True)
class Timings:
    """Durations of the last checkpoint save and of the restore (seconds, this process)."""

    save_s: float | None = None
    load_s: float | None = None
    restore_total_s: float | None = None


def _capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _apply_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        with contextlib.suppress(RuntimeError, IndexError):
            torch.cuda.set_rng_state_all(state["cuda"])


def _seed_rng_from(state: dict[str, Any], rank: int) -> None:
    """Fresh, deterministic streams for a rank the checkpoint had no state for."""
    digest = hashlib.sha256(bytes(state["torch"].numpy()) + rank.to_bytes(4, "little")).digest()
    seed = int.from_bytes(digest[:8], "little")
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))
    random.seed(seed)


class ElasticJob:
    """One worker's view of an elastic coadapt job (see module docstring). Create via
    :func:`init`. Not thread-safe: use it from the training thread."""

    def __init__(
        self,
        options: JobOptions,
        *,
        env: TrainerEnv | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.options = options
        self.env = env or TrainerEnv.from_environ()
        self._clock = clock or SystemClock()
        self._started_at_s = self._clock.now_s()
        if options.preimport:
            threading.Thread(target=_preimport, name="coadapt-preimport", daemon=True).start()

        # The stop flag exists before anything that can take long (rendezvous, restore).
        self._stop_cause: StopCause | None = None
        self._finished = False
        self._previous_sigterm = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        self._run_dir = RunDir(self.env.run_dir) if self.env.run_dir else None
        if self._run_dir is not None:
            # Files are keyed by local rank (a node's run directory always holds local ranks
            # 0..n-1; global ranks move when nodes come and go). A new worker generation
            # (torchrun restarting workers after a membership change) replaces the old one.
            self._run_dir.clear_marker(self.env.local_rank)
            self._run_dir.write_pid(self.env.local_rank)
        self._init_process_group()
        self._control = ControlChannel(self._ctrl_group, self.world_size)

        self._loop = StepLoop(
            options,
            env=self.env,
            clock=self._clock,
            host=self,
            control=self._control,
            ctrl_group=self._ctrl_group,
            device=self.device,
        )
        self._model: DistributedDataParallel | None = None
        self._loader: ElasticDataLoader | None = None
        self._states: dict[str, Any] = {}

        self._restored = False
        self._restore_info: RestoreInfo | None = None
        self._last_checkpoint: CheckpointInfo | None = None
        # The progress of the newest checkpoint saved (written) or resumed from: reported, so
        # the controller says truthfully where a stopped run resumes.
        self._checkpoint_progress: float | None = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="coadapt-ckpt")
        self._pending_write: Future[None] | None = None
        self.timings = Timings()
        self._manager = CheckpointManager(
            open_store(self.env.checkpoint_uri), keep_last=options.keep_last
        )
        self._closed = False

        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        # After an agreed stop the process only has to go away, and a torch process takes ~1 s
        # to tear its interpreter down. Registered now, this runs after the atexit handlers
        # the script registers later, and ends the process without that teardown.
        self._exit_fast = False
        atexit.register(self._fast_exit)
        self._watcher_stop = threading.Event()
        if self.env.stop_file and self.env.local_rank == 0:
            threading.Thread(target=self._watch_notice, name="coadapt-notice", daemon=True).start()

        self._reporter: Reporter | None = None
        if self.rank == 0:
            sink = (
                FileSink(self.env.report_file)
                if self.env.standalone
                else HttpSink(
                    self.env.controller_url or "",
                    self.env.job_id,
                    timeout_s=2.0,
                    token_file=self.env.report_token_file,
                )
            )
            self._reporter = Reporter(
                sink,
                self.build_report,
                interval_s=self.env.report_interval_s,
                clock=self._clock,
                on_reply=self._on_reply,
                reply_window=self._loop.reply_window,
            )
            self._reporter.start()

    # ------------------------------------------------------------------ process group
    def _init_process_group(self) -> None:
        env = self.env
        use_cuda = env.backend == "nccl" or (env.backend is None and torch.cuda.is_available())
        backend = "nccl" if use_cuda else "gloo"
        if use_cuda:
            torch.cuda.set_device(env.local_rank)
            self.device = torch.device("cuda", env.local_rank)
        else:
            self.device = torch.device("cpu")
        self._owns_group = False
        if not dist.is_initialized():
            timeout = timedelta(seconds=env.collective_timeout_s)
            if env.distributed:
                dist.init_process_group(backend, timeout=timeout)
            else:
                dist.init_process_group(
                    backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
                )
            self._owns_group = True
        if dist.get_world_size() != env.world_size or dist.get_rank() != env.rank:
            raise TrainerConfigError(
                f"process group is rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"the environment says {env.rank} of {env.world_size}",
                field="WORLD_SIZE",
            )
        self.backend = backend
        self._ctrl_group = dist.new_group(backend="gloo") if env.world_size > 1 else None

    # ------------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def batch(self) -> BatchConfig:
        """The batch configuration in force."""
        return self._loop.batch

    @property
    def step(self) -> int:
        """Optimizer steps taken over the whole run (including skipped ones)."""
        return self._loop.step

    @property
    def batch_requested_at_step(self) -> int | None:
        """Rank 0: the step in progress (optimizer steps completed) when the newest batch
        configuration not yet agreed arrived, from the controller's reply or
        :meth:`request_batch_config` (``None``: none yet in this process; other ranks learn a
        configuration only when the ranks agree on it)."""
        return self._loop.batch_requested_at_step

    @property
    def skipped_steps(self) -> int:
        return self._loop.skipped

    @property
    def progress(self) -> float:
        """Initial-batch-size iterations of progress (see :mod:`trainer.scaling`)."""
        return self._loop.progress

    @property
    def data_state(self) -> DataState:
        return self._loop.data

    @property
    def epoch(self) -> int:
        return self._loop.data.epoch

    @property
    def gns_every_steps(self) -> int:
        return self.options.gns_every_steps

    @property
    def micro_batch(self) -> MicroBatch | None:
        """The micro-batch the loader handed out last (``None`` outside an epoch)."""
        return self._loop.micro_batch

    @property
    def at_step_boundary(self) -> bool:
        """True once ``optimizer.step()`` has applied (or skipped) the current global batch."""
        return self._loop.at_step_boundary

    @property
    def scaling_rule(self) -> ScalingRule:
        return self._loop.rule

    @property
    def gradient_stats(self) -> GradientStats | None:
        """Host view of the smoothed statistics (as of the last measurement step but one)."""
        values = self._loop.gns.values()
        if values is None:
            return None
        return GradientStats(
            initial_batch_size=self.options.initial_batch_size,
            grad_sqr=values[0],
            grad_var=values[1],
            measurements=self._loop.gns.measurements,
            preconditioned=self._loop.rule is ScalingRule.SQRT,
        )

    @property
    def last_checkpoint(self) -> CheckpointInfo | None:
        return self._last_checkpoint

    @property
    def stop_cause(self) -> StopCause | None:
        return self._stop_cause

    def read_gradient_state(self) -> list[float]:
        """The estimator's raw device state ``[ema |G|^2, ema grad_var, ema weight]`` read now.

        Completes a measurement still in flight first, and forces a device-to-host copy: for
        tests and debugging, not for the training loop.
        """
        self._loop.finish_measurement()
        return [float(v) for v in self._loop.gns.state.tolist()]

    def gain(self) -> float:
        """AdaScale gain at the current batch size from the host statistics (1 before data)."""
        return self._loop.gain()

    def gain_at(self, ratio: float) -> float:
        """AdaScale gain at ``ratio`` times the initial batch size (1 before data)."""
        return self._loop.gain_at(ratio)

    # ------------------------------------------------------------------ setup
    def prepare(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        lr_scheduler: Any = None,
        **ddp_kwargs: Any,
    ) -> tuple[DistributedDataParallel, ElasticOptimizer]:
        """Wrap ``model`` in DDP and ``optimizer`` in an :class:`ElasticOptimizer`.

        The model is moved to the job's device. ``lr_scheduler`` (optional) is checkpointed and
        its ``step()`` becomes a no-op inside accumulation (so per-iteration schedulers count
        optimizer steps, not micro-batches). ``ddp_kwargs`` go to ``DistributedDataParallel``.
        """
        if self._model is not None:
            raise TrainerUsageError("prepare() was already called for this job")
        model = model.to(self.device)
        if self.device.type == "cuda":
            ddp_kwargs.setdefault("device_ids", [self.device.index])
        if ddp_kwargs.get("gradient_as_bucket_view"):
            raise TrainerConfigError(
                "coadapt reads each replica's local gradient before DDP reduces it in place",
                field="gradient_as_bucket_view",
            )
        ddp = DistributedDataParallel(model, **ddp_kwargs)
        # The first parameter's gradient is (nearly always) the last one the backward pass
        # produces: its accumulation marks "compute done" for the profiler's sync split.
        params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise TrainerConfigError("the model has no trainable parameters", field="model")
        params[0].register_post_accumulate_grad_hook(self._loop.mark_grads_done)
        self._model = ddp
        rule = self.options.scaling_rule or default_rule(optimizer)
        elastic = ElasticOptimizer(optimizer, self._loop, rule)
        self._loop.attach(ddp, params, elastic)
        self._states["model"] = model
        self._states["optimizer"] = optimizer
        if lr_scheduler is not None:
            self._states["lr_scheduler"] = lr_scheduler
            self._guard_scheduler(lr_scheduler)
        return ddp, elastic

    def _guard_scheduler(self, scheduler: Any) -> None:
        """Make ``scheduler.step()`` a no-op inside accumulation by giving the instance a
        subclass (an instance attribute would end up in the scheduler's ``state_dict``)."""
        loop = self._loop
        base = type(scheduler)

        def step(sched: Any, *args: Any, **kwargs: Any) -> Any:
            if loop.inside_accumulation:
                return None
            return base.step(sched, *args, **kwargs)

        scheduler.__class__ = type(
            f"Elastic{base.__name__}", (base,), {"step": step, "__module__": base.__module__}
        )

    def data_loader(
        self, dataset: Any, *, shuffle: bool = True, **dataloader_kwargs: Any
    ) -> ElasticDataLoader:
        """The job's elastic loader over ``dataset`` (``len()`` and integer indexing)."""
        if self._loader is not None:
            raise TrainerUsageError("a job has one elastic data loader")
        self._loader = ElasticDataLoader(
            self._loop, dataset, shuffle=shuffle, seed=self.options.data_seed, **dataloader_kwargs
        )
        return self._loader

    def register(self, name: str, obj: Any) -> None:
        """Checkpoint ``obj`` (anything with ``state_dict()`` and ``load_state_dict()``)."""
        if name in self._states:
            raise TrainerConfigError(f"state {name!r} is already registered", field="name")
        if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
            raise TrainerConfigError("needs state_dict() and load_state_dict()", field=name)
        self._states[name] = obj

    # ------------------------------------------------------------------ requests
    def request_batch_config(self, batch: BatchConfig) -> None:
        """Use ``batch`` from the next step the ranks can agree on, without a restart (rank
        0's request is what counts): at an epoch boundary at once, mid-epoch one exchange after
        the next (:mod:`trainer.stepping`, "Batch changes"; the controller's reply is adopted
        within a step of its arrival)."""
        self._loop.request_batch(batch)

    def request_stop(self) -> None:
        """Checkpoint and stop at the next agreed step (as on SIGTERM)."""
        if self._stop_cause is None:
            self._stop_cause = StopCause.REQUEST

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self._stop_cause is None:
            self._stop_cause = StopCause.SIGNAL
        if self._finished:
            # Training is over: nothing to agree on. Behave as the default action would.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    def _on_reply(self, reply: ReportReply) -> None:
        if reply.batch is not None:
            self._loop.request_batch(reply.batch)
        if reply.stop and self._stop_cause is None:
            self._stop_cause = StopCause.CONTROLLER

    def _watch_notice(self) -> None:
        path = self.env.stop_file or ""
        while not self._watcher_stop.wait(1.0):
            if os.path.exists(path):
                if self._stop_cause is None:
                    self._stop_cause = StopCause.NOTICE
                return

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        with contextlib.suppress(Exception):
            exit_kind = ExitKind.PEER_LOST if _is_peer_failure(value) else ExitKind.FAILED
            self._write_marker(exit_kind, cause=_one_line(kind, value))
        self._previous_excepthook(kind, value, tb)

    # ------------------------------------------------------------------ restore
    def restore(self) -> RestoreInfo | None:
        """Load the newest valid checkpoint into every registered object (collective).

        Call after :meth:`prepare`, :meth:`data_loader` and :meth:`register`. Rank 0 picks the
        checkpoint (skipping corrupt ones with a warning) and every rank loads that one.
        Returns what was used, or ``None`` for a fresh start. Idempotent.
        """
        if self._restored:
            return self._restore_info
        self._restored = True
        start = self._clock.monotonic_s()
        chosen: list[Any] = [None]
        payload = None
        if self.rank == 0:
            loaded = self._manager.load_latest(map_location=self.device)
            if loaded is not None:
                payload, self._restore_info = loaded
                chosen[0] = (self._restore_info.checkpoint.name, self._restore_info.skipped)
        if self.world_size > 1:
            dist.broadcast_object_list(chosen, src=0, group=self._ctrl_group)
        if chosen[0] is not None and self.rank != 0:
            name, skipped = chosen[0]
            payload, info = self._manager.read(name, map_location=self.device)
            self._restore_info = RestoreInfo(info, tuple(skipped))
        if payload is not None:
            read_s = self._clock.monotonic_s() - start
            self._apply_checkpoint(payload)
            self._checkpoint_progress = self._loop.progress
            load_s = self._clock.monotonic_s() - start
            self.timings = dataclasses.replace(self.timings, load_s=load_s)
            if self.rank == 0:  # visible without logging set up: a user should see a resume
                print(f"coadapt: resumed from step {self._loop.step}", file=sys.stderr, flush=True)
            logger.info(
                "restored %s (step %d, epoch %d, position %d) in %.3f s (read %.3f s)",
                self._restore_info.checkpoint.name if self._restore_info else "?",
                self._loop.step,
                self._loop.data.epoch,
                self._loop.data.position,
                load_s,
                read_s,
            )
        self._loop.profiler.break_chain()
        return self._restore_info

    def _apply_checkpoint(self, payload: dict[str, Any]) -> None:
        if payload.get("format") != CHECKPOINT_FORMAT:
            raise TrainerConfigError(f"unknown checkpoint format {payload.get('format')!r}")
        states = payload["states"]
        unknown = sorted(set(states) - set(self._states))
        if unknown:
            raise TrainerUsageError(
                f"checkpoint holds state {unknown} that nothing is registered for: call "
                "restore() after prepare() and register()"
            )
        for name, obj in self._states.items():
            if name in states:
                obj.load_state_dict(states[name])
            else:
                logger.warning("checkpoint has no state for %r; keeping its current state", name)
        t = payload["trainer"]
        self._loop.step = int(t["step"])
        self._loop.progress = float(t["progress"])
        self._loop.skipped = int(t["skipped_steps"])
        self._loop.data = DataState(int(t["epoch"]), int(t["position"]), t["num_samples"])
        self._loop.gns.load_state_dict(t["gns"])
        saved_batch = BatchConfig.from_dict(t["batch"])
        schedule = [
            (int(first), BatchConfig.from_dict(c)) for first, c in t.get("batch_schedule", [])
        ]
        if self.env.batch is not None:  # this launch's configuration replaces the saved ones
            self._loop.set_batch_schedule(self.env.batch, [])
        else:
            self._loop.set_batch_schedule(saved_batch, schedule)
        if self._loop.batch != saved_batch:
            logger.info("batch configuration %s -> %s at restart", saved_batch, self._loop.batch)
        rng = payload["rng"]
        if self.rank < len(rng):
            _apply_rng(rng[self.rank])
        else:
            _seed_rng_from(rng[0], self.rank)

    # ------------------------------------------------------------------ checkpoint
    def _checkpoint_payload(self, rng: list[Any]) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "job_id": self.env.job_id,
            "step": self._loop.step,
            "world_size": self.world_size,
            "saved_at_s": self._clock.now_s(),
            "states": {name: obj.state_dict() for name, obj in self._states.items()},
            "trainer": {
                "step": self._loop.step,
                "progress": self._loop.progress,
                "skipped_steps": self._loop.skipped,
                "epoch": self._loop.data.epoch,
                "position": self._loop.data.position,
                "num_samples": self._loop.data.num_samples,
                # the next step's configuration, and those agreed for later steps
                "batch": self._loop.batch_for_step(self._loop.step).to_dict(),
                "batch_schedule": [
                    [first, config.to_dict()]
                    for first, config in self._loop.batch_schedule
                    if first > self._loop.step
                ],
                "gns": self._loop.gns.state_dict(),
            },
            "rng": rng,
        }

    def _quiesce_and_gather_rng(self) -> list[Any]:
        """Before a checkpoint (collective): let the in-flight stop/checkpoint exchange and
        gradient measurement finish, and gather every rank's RNG states on rank 0 (index =
        rank; other ranks get a list of ``None``)."""
        self._control.drain()
        self._loop.finish_measurement()
        rng_states: list[Any] = [None] * self.world_size
        if self.world_size > 1:
            dist.gather_object(
                _capture_rng(),
                rng_states if self.rank == 0 else None,
                dst=0,
                group=self._ctrl_group,
            )
        else:
            rng_states = [_capture_rng()]
        return rng_states

    def save_checkpoint(self, *, wait: bool = True) -> CheckpointInfo | None:
        """Save a checkpoint at the current step boundary (collective: every rank calls it).

        Rank 0 serialises; the write runs in the background unless ``wait``. With ``wait``,
        every rank returns only once the checkpoint is stored. Returns the info on rank 0.
        """
        if not self._loop.at_step_boundary:
            raise TrainerUsageError("checkpoints are taken between optimizer steps")
        start = self._clock.monotonic_s()
        rng_states = self._quiesce_and_gather_rng()
        info = None
        if self.rank == 0:
            if self._pending_write is not None:
                self._pending_write.result()
            blob, info = encode(self._checkpoint_payload(rng_states), self._loop.step)
            self._pending_write = self._writer.submit(self._manager.write, blob, info)
            saved_progress = self._loop.progress

            def written(done: Future[None]) -> None:
                if done.exception() is None:
                    self._checkpoint_progress = saved_progress

            self._pending_write.add_done_callback(written)
            if wait:
                self._pending_write.result()
                self._checkpoint_progress = saved_progress
            self._last_checkpoint = info
        if wait and self.world_size > 1:
            dist.barrier(group=self._ctrl_group)
        self._loop.note_checkpoint()
        self.timings = dataclasses.replace(self.timings, save_s=self._clock.monotonic_s() - start)
        return info

    # ------------------------------------------------------------------ the loop
    def epochs(
        self, total: int, *, declare: bool = True, target_progress: float | None = None
    ) -> Iterator[int]:
        """Yield the epochs still to run, from the restored one, until the job's length is
        reached; the length ``total`` epochs is declared to the controller.

        With the elastic data loader (:meth:`data_loader`, called first), the length is
        declared in the unit of progress (:func:`trainer.report.is_done`): ``total x
        len(dataset) / initial_batch_size`` initial-batch-size iterations, the progress
        ``total`` epochs make at the initial batch size. At a larger batch an epoch makes less
        progress (its statistical efficiency is below 1: the AdaScale gain is below the batch
        ratio), so the loop runs on into later epochs, and the loader ends the last one at the
        global batch that reaches the target. Without an elastic loader, or with ``declare``
        false, the loop runs ``total`` epochs and declares no length (the controller then
        knows no remaining work for the job).

        ``target_progress`` (with ``declare``) declares that length instead, in the same unit
        (e.g. a step budget: ``max_steps`` steps at the initial batch size are ``max_steps``
        iterations); ``total`` then only bounds the epochs after which an epoch that made no
        progress is an error.

        An epoch ends when the loop body returns: if the body did not finish the loader (a
        ``break``), the rest of that epoch is skipped. An epoch whose every step was skipped
        (non-finite gradients) makes no progress: the loop then raises
        :class:`TrainerUsageError` rather than run forever.
        """
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise TrainerConfigError(f"must be an integer >= 0, got {total!r}", field="total")
        if target_progress is not None:
            if not declare or not (0 < target_progress < float("inf")):
                raise TrainerConfigError(
                    f"must be finite and > 0 (and declared), got {target_progress!r}",
                    field="target_progress",
                )
            self._loop.target_progress = float(target_progress)
        elif self._loader is not None and declare:
            self._loop.target_progress = epochs_progress(
                total, len(self._loader.dataset), self.options.initial_batch_size
            )
        if not self._restored:
            self.restore()
        declared = self._loop.target_progress is not None
        while True:
            self._loop.normalize_epoch()
            epoch = self._loop.data.epoch
            if self._loop.training_done or (not declared and epoch >= total) or total == 0:
                return
            before = self._loop.progress
            yield epoch
            self._loop.safe_point()
            if self._loop.training_done:  # at the global batch that reached the target
                self._loop.normalize_epoch()
                return
            if self._loop.data.epoch == epoch:
                self._loop.data = DataState(epoch + 1, 0, self._loop.data.num_samples)
            if declared and epoch >= total and self._loop.progress <= before:
                raise TrainerUsageError(
                    f"epoch {epoch} made no progress (every step skipped: non-finite "
                    "gradients); the declared length cannot be reached"
                )

    @property
    def target_progress(self) -> float | None:
        """The declared length, in initial-batch-size iterations (``None``: undeclared)."""
        return self._loop.target_progress

    @property
    def training_done(self) -> bool:
        """The declared length is reached (:func:`trainer.report.is_done`)."""
        return self._loop.training_done

    @property
    def lr_scale(self) -> float | None:
        """The factor the scaling rule applied to the learning rate on the last update."""
        return self._loop.lr_scale

    # ------------------------------------------------------------------ end
    def stop_at_safe_point(self, cause: StopCause) -> NoReturn:
        """Called by the step loop at the safe point where the ranks agreed to stop: save the
        stop checkpoint (collective), write this worker's exit marker, stop the background
        threads and raise :class:`JobStopped` (the process then exits fast, status 0)."""
        # A SIGTERM may come from torchrun's agent restarting the workers for a membership
        # change: only a notice, the controller or the script mean "this node stops".
        initiated = cause in (StopCause.NOTICE, StopCause.CONTROLLER, StopCause.REQUEST)
        info = self.save_checkpoint(wait=True)
        name = info.name if info else None
        logger.warning(
            "stopping at step %d (%s); checkpoint saved in %.3f s",
            self._loop.step,
            cause,
            self.timings.save_s or 0.0,
        )
        self._write_marker(ExitKind.STOPPED, cause=str(cause), initiated=initiated, name=name)
        self._shutdown(final_report=True)
        self._exit_fast = True
        raise JobStopped(self._loop.step, name)

    def finish(self) -> None:
        """Training is complete: save a final checkpoint, report, mark done (collective)."""
        if self._finished:
            return
        if not self._loop.at_step_boundary:
            raise TrainerUsageError("finish() in the middle of a global batch")
        info = self.save_checkpoint(wait=True)
        self._finished = True
        self._write_marker(ExitKind.DONE, cause=None, name=info.name if info else None)
        self._shutdown(final_report=True)

    def _write_marker(
        self, kind: ExitKind, *, cause: str | None, initiated: bool = False, name: str | None = None
    ) -> None:
        if self._run_dir is None:
            return
        self._run_dir.write_marker(
            ExitMarker(
                rank=self.env.local_rank,
                kind=kind,
                cause=cause,
                initiated=initiated,
                step=self._loop.step,
                checkpoint=name or (self._last_checkpoint.name if self._last_checkpoint else None),
            )
        )

    def _shutdown(self, *, final_report: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self._watcher_stop.set()
        if self._pending_write is not None:
            self._pending_write.result()
        self._writer.shutdown(wait=True)
        self._loop.end_reply_windows()
        if self._reporter is not None:
            self._reporter.stop(final=final_report)
        if threading.current_thread() is threading.main_thread() and not self._finished:
            signal.signal(signal.SIGTERM, self._previous_sigterm)

    def _fast_exit(self) -> None:
        if not self._exit_fast:
            return
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

    def close(self) -> None:
        """Stop background threads (without a final checkpoint), restore the signal handler
        and excepthook, and destroy the process group if the job created it. Idempotent."""
        self._shutdown(final_report=False)
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        atexit.unregister(self._fast_exit)
        if self._owns_group and dist.is_initialized():
            self._owns_group = False
            dist.destroy_process_group()

    def __enter__(self) -> ElasticJob:
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is not None and not issubclass(kind, SystemExit):
            exit_kind = ExitKind.PEER_LOST if _is_peer_failure(value) else ExitKind.FAILED
            with contextlib.suppress(Exception):
                self._write_marker(exit_kind, cause=_one_line(kind, value))
        self.close()

    # ------------------------------------------------------------------ reports
    def build_report(self) -> TrainerReport:
        """The current report (host-side values only; safe from the reporter thread)."""
        options = self.options
        return TrainerReport(
            job_id=self.env.job_id,
            attempt=self.env.attempt,
            started_at_s=self._started_at_s,
            sent_at_s=self._clock.now_s(),
            world_size=self.world_size,
            num_nodes=self.env.num_nodes,
            batch=self._loop.batch,
            step=self._loop.step,
            skipped_steps=self._loop.skipped,
            epoch=self._loop.data.epoch,
            epoch_position=self._loop.data.position,
            progress=self._loop.progress,
            gradient=self.gradient_stats,
            profiles=self._loop.profiler.snapshot(),
            hints=JobHints(
                initial_batch_size=options.initial_batch_size,
                max_batch_size=options.max_batch_size,
                min_local_batch_size=options.min_local_batch_size,
                max_local_batch_size=options.max_local_batch_size,
                max_accum_steps=options.max_accum_steps,
                scaling_rule=str(self._loop.rule),
            ),
            standalone=self.env.standalone,
            target_progress=self._loop.target_progress,
            done=self._finished,
            lr_scale=self._loop.lr_scale,
            checkpoint_progress=self._checkpoint_progress,
        )


def _one_line(kind: type[BaseException], value: BaseException | None) -> str:
    """``Type: first line of the message`` (at most 300 characters), for exit markers."""
    text = str(value).strip().splitlines()[0] if value is not None and str(value).strip() else ""
    return f"{kind.__name__}: {text}"[:300] if text else kind.__name__


def _is_peer_failure(error: BaseException | None) -> bool:
    """A collective failed because another process went away (not this process's fault)."""
    if error is None:
        return False
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and any(
        marker in text
        for marker in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )


def _preimport() -> None:
    with contextlib.suppress(Exception):
        import torch._dynamo  # noqa: F401


def init(
    initial_batch_size: int,
    *,
    env: TrainerEnv | None = None,
    clock: Clock | None = None,
    **options: Any,
) -> ElasticJob:
    """Start this worker's part of an elastic job; ``options`` are :class:`JobOptions` fields."""
    return ElasticJob(
        JobOptions(initial_batch_size=initial_batch_size, **options), env=env, clock=clock
    )


__all__ = [
    "DataState",
    "ElasticJob",
    "JobOptions",
    "JobStopped",
    "Timings",
    "init",
]
