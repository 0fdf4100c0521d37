"""The step loop of an elastic job: micro-batch entry, the optimizer step, gradient-noise
measurement, stop/checkpoint agreement and safe points.

:class:`StepLoop` is what the elastic data loader (:class:`trainer.data.ElasticDataLoader`, through
its :class:`trainer.data.LoaderJob` port) and the optimizer wrapper
(:class:`trainer.scaling.ElasticOptimizer`, through its :class:`trainer.scaling.StepDriver` port)
call; :class:`trainer.api.ElasticJob` owns one and implements :class:`StepHost`, the few actions
a safe point needs from the job (restore, checkpoint, stop). The loop owns the training counters
(step, progress, data position, batch configuration, gradient statistics, step profile), which
the job reads and writes when it checkpoints, restores and reports.

Contract, per global step: the loader calls :meth:`StepLoop.enter_micro_batch` before handing
out each micro-batch; on the first one of a step it first runs the safe point (stop or save if an
earlier step agreed to). ``optimizer.step()`` on the last micro-batch ends the step
(:meth:`StepLoop.optimizer_step`): finiteness check, learning-rate scaling, progress, data
position, profile, and (every few steps, the period adapted to ``control_interval_s``) the lagged
stop/checkpoint exchange among ranks (:class:`trainer.control.ControlChannel`).

**Batch changes** (one rule, for coadapt's loop and both framework integrations). Rank 0's
request (:attr:`StepLoop.pending_batch`, set by :meth:`StepLoop.request_batch`: the
controller's reply or :meth:`trainer.api.ElasticJob.request_batch_config`) is adopted

* at an epoch boundary, at once: the ranks agree on it before the epoch's first global batch is
  planned (a broadcast at :meth:`StepLoop.start_epoch_iteration`);
* mid-epoch, at the next optimizer step the ranks can all still plan: rank 0 offers it at the
  next exchange, every rank reads it at the following one, at the end of some step ``c``, and
  it is in force from step ``c + batch_lead_steps``. ``batch_lead_steps`` is 1 where the loader
  plans a step after the previous one's update (coadapt's loop, the Hugging Face integration:
  the very next step), 2 where the framework fetches one micro-batch ahead (Lightning).

**Within a step of the reply.** Exchanges come every step only with ``control_interval_s=0``;
otherwise about every ``control_interval_s`` (``k`` steps, up to 64), and a request waits for
the next exchange and one more: up to ``2k`` steps (the batch timing test measured 13 steps at
the default 0.5 s and 0.05 s steps before this rule). So rank 0 sends each scheduled report
inside a *reply window* (:meth:`StepLoop.reply_window`): it first proposes a period of 1 and
holds the report until every step exchanges (at most two periods), keeps every step
exchanging until the reply is handled, then proposes its ``control_interval_s`` period again.
A reply that arrives while step ``r`` is in progress (:attr:`StepLoop.batch_requested_at_step`)
is offered at the end of step ``r`` and read at the end of ``r + 1``: in force from step
``r + 2`` in coadapt's loop and the Hugging Face integration (after the step in progress, at
most one more step at the old configuration), ``r + 3`` in Lightning's. Per report the window
costs about two extra exchanges plus one per step of the reply's round trip, and holds the
report back up to two periods (about ``2 x control_interval_s``). Outside an epoch the report
goes out at once (the next epoch's start adopts its batch); where the loop stalls inside one
(evaluation, a slow save) it goes out after that bound, and its batch follows the rule above.
A request from the script (:meth:`trainer.api.ElasticJob.request_batch_config`) has no
window: up to ``2k`` steps.

No restart either way: the loader re-plans the rest of the epoch from that step's position with
the new configuration (:meth:`trainer.data.ElasticDataLoader.load`), so the epoch still visits
every sample once, and the learning-rate rule uses each step's own batch. A configuration
agreed but not yet in force is part of a checkpoint (the exact resume keeps the schedule); a
launch that sets the batch (``COADAPT_BATCH_SIZE``) replaces both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from coadapt_common.clock import Clock
from trainer.control import ControlChannel, ControlDecision, StopCause
from trainer.data import DataState, MicroBatch
from trainer.env import TrainerEnv
from trainer.errors import TrainerConfigError, TrainerUsageError
from trainer.gns import (
    GradientNoiseEstimator,
    Scratch,
    adam_sqrt_preconditioner,
    grad_sqr_from,
    is_adam_type,
    sigma2_from_difference,
    sigma2_from_replicas,
    small_batch_terms,
    sq_norm_one,
    sq_norm_params,
)
from trainer.metrics import ProfileKey, StepProfiler
from trainer.options import JobOptions
from trainer.report import BatchConfig, is_done
from trainer.scaling import ElasticOptimizer, ScalingRule, adascale_gain, lr_factor

__all__ = ["PRECOND_REFRESH", "StepHost", "StepLoop"]

logger = logging.getLogger("trainer")

_NO_DECISION = ControlDecision()
PRECOND_REFRESH = 8  # measurements between recomputations of Adam's preconditioner


class StepHost(Protocol):
    """What a safe point needs from the job that owns the loop (:class:`trainer.api.ElasticJob`).

    ``stop_cause``: why this rank wants to stop, or ``None``. ``restore()``: idempotent; loads
    the newest checkpoint the first time. ``save_checkpoint(wait=...)``: collective, at a step
    boundary. ``stop_at_safe_point(cause)``: save the stop checkpoint, write the exit marker and
    end the worker (it never returns).
    """

    @property
    def stop_cause(self) -> StopCause | None: ...

    def restore(self) -> object: ...

    def save_checkpoint(self, *, wait: bool = True) -> object: ...

    def stop_at_safe_point(self, cause: StopCause) -> NoReturn: ...


class _StepState:
    """What the micro-batch entry, the gradient hooks and the optimizer step share for one
    global step (gradient-noise measurement only; other steps leave it empty)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.measure = False
        self.sqrt_precond: dict[int, torch.Tensor] | None = None
        self.local_parts: list[torch.Tensor] = []
        self.handles: list[Any] = []
        self.small_params: list[torch.Tensor] = []
        self.small_copy: list[torch.Tensor] = []

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


@dataclass
class _PendingMeasurement:
    """A measurement whose cross-replica all-reduce is still in flight (finished next step)."""

    work: Any
    terms: torch.Tensor
    global_sq: torch.Tensor
    step_samples: int


class StepLoop:
    """One worker's step loop (see module docstring). Not thread-safe, except that the counters
    may be read from the reporter thread (host-side values only).

    Public state: ``batch`` (configuration of the step in progress, or of the last one),
    ``pending_batch`` (rank 0's request, see the module docstring),
    ``batch_requested_at_step`` (rank 0: the step in progress when the newest request not yet
    agreed arrived; ``None`` before any), ``batch_lead_steps`` (the
    loader's planning lead, see the module docstring), ``data``
    (:class:`~trainer.data.DataState`), ``step`` (optimizer steps over the whole run, skipped
    ones included), ``progress`` (initial-batch-size iterations),
    ``skipped`` (non-finite steps), ``gns`` (the estimator), ``profiler``, ``rule`` (scaling rule
    in force), ``control`` (the agreement channel), ``last_checkpoint_s`` (monotonic time of the
    last save, for ``checkpoint_every_s``), ``target_progress`` (the declared length, ``None``
    if undeclared; :attr:`training_done` reads it), ``lr_scale`` (the factor the rule applied to
    the learning rate on the last update).
    """

    def __init__(
        self,
        options: JobOptions,
        *,
        env: TrainerEnv,
        clock: Clock,
        host: StepHost,
        control: ControlChannel,
        ctrl_group: Any,
        device: torch.device,
    ) -> None:
        self._options = options
        self._env = env
        self._clock = clock
        self._host = host
        self._ctrl_group = ctrl_group
        self.control = control
        self.batch = env.batch or BatchConfig(options.initial_batch_size, 1)
        self.pending_batch: BatchConfig | None = None
        self.batch_requested_at_step: int | None = None  # see request_batch
        self.batch_lead_steps = 1
        # Agreed configurations not yet in force: (first step, configuration), ascending.
        self._batch_schedule: list[tuple[int, BatchConfig]] = []
        self._posted_at = -1  # self.step when the exchange in flight was posted
        self._boundary_at = -1  # self.step when an epoch boundary last adopted a configuration
        self.target_progress: float | None = None  # declared by ElasticJob.epochs
        self.lr_scale: float | None = None  # the scaling rule's factor on the last update
        self.data = DataState()
        self.step = 0
        self.progress = 0.0
        self.skipped = 0
        self.gns = GradientNoiseEstimator(
            options.initial_batch_size, smoothing=options.gns_smoothing, device=device
        )
        self.profiler = StepProfiler(clock)
        self.rule = options.scaling_rule or ScalingRule.NONE
        self.last_checkpoint_s = clock.monotonic_s()
        self._profile_keys: dict[BatchConfig, ProfileKey] = {}
        self._state = _StepState()
        self._pending_gns: _PendingMeasurement | None = None
        self._precond_cache: dict[int, torch.Tensor] | None = None
        self._precond_uses = 0
        self._scratch = Scratch()  # weighted-norm temporaries, reused (measurement steps)

        self._model: DistributedDataParallel | None = None
        self._param_list: list[torch.Tensor] = []
        self._optimizer: ElasticOptimizer | None = None

        self._micro: MicroBatch | None = None
        self._weight_handle: Any = None
        self._micro_step_called = False
        self._step_done = True
        self._weight = 1.0

        self._pending_decision = ControlDecision()
        self._control_every = 1  # adapted at each exchange (see trainer.control)
        self._since_exchange = 0
        self._last_proposal = 1  # rank 0's period proposal in flight (none yet: period 1)
        # Rank 0's reply window (module docstring, "Batch changes"): the reporter thread
        # requests it, the loop opens it; the lock makes a request and an exchange's post
        # atomic with respect to each other.
        self._window_lock = threading.Lock()
        self._window_requested = False
        self._window_open = threading.Event()
        self._windows_ended = False

    def attach(
        self,
        model: DistributedDataParallel,
        params: list[torch.Tensor],
        optimizer: ElasticOptimizer,
    ) -> None:
        """Use ``model`` (DDP-wrapped), its trainable ``params`` and the wrapped ``optimizer``
        (whose ``rule`` becomes the rule in force). Once, before the first epoch."""
        self._model = model
        self._param_list = params
        self._optimizer = optimizer
        self.rule = optimizer.rule

    # ------------------------------------------------------------------ views
    @property
    def rank(self) -> int:
        return self._env.rank

    @property
    def world_size(self) -> int:
        return self._env.world_size

    @property
    def data_state(self) -> DataState:
        return self.data

    @property
    def gns_every_steps(self) -> int:
        return self._options.gns_every_steps

    @property
    def micro_batch(self) -> MicroBatch | None:
        """The micro-batch the loader handed out last (``None`` outside an epoch)."""
        return self._micro

    @property
    def at_step_boundary(self) -> bool:
        """True once ``optimizer.step()`` has applied (or skipped) the current global batch."""
        return self._step_done

    @property
    def training_done(self) -> bool:
        """The declared length is reached (:func:`trainer.report.is_done`): no global batch
        is handed out any more."""
        return is_done(self.progress, self.target_progress)

    @property
    def inside_accumulation(self) -> bool:
        """True between a global batch's first micro-batch and its optimizer step."""
        return self._micro is not None and not self._step_done

    def batch_for_step(self, step: int) -> BatchConfig:
        """The batch configuration global step ``step`` trains at, as far as the ranks have
        agreed (the same answer on every rank for any step a loader may be planning)."""
        config = self.batch
        for first, scheduled in self._batch_schedule:
            if first <= step:
                config = scheduled
        return config

    @property
    def batch_schedule(self) -> tuple[tuple[int, BatchConfig], ...]:
        """Agreed configurations not yet in force: ``(first step, configuration)``."""
        return tuple(self._batch_schedule)

    def set_batch_schedule(
        self, batch: BatchConfig, schedule: list[tuple[int, BatchConfig]]
    ) -> None:
        """At a restore: the configuration of the next step and those agreed after it."""
        self.batch = batch
        later = [(first, config) for first, config in schedule if first > self.step]
        self._batch_schedule = sorted(later, key=lambda entry: entry[0])

    def request_batch(self, batch: BatchConfig) -> None:
        """Rank 0: ask for ``batch`` (the controller's reply or the script's request; see the
        module docstring). Records in ``batch_requested_at_step`` the step in progress (steps
        completed) when a configuration not already agreed arrived. Callable from the
        reporter thread."""
        if batch != self.pending_batch and batch != self._latest_batch():
            self.batch_requested_at_step = self.step
        self.pending_batch = batch

    @contextlib.contextmanager
    def reply_window(self) -> Iterator[bool]:
        """Rank 0, in the reporter thread, around sending one report and handling its reply:
        first wait until every step exchanges (the window is open), at most
        ``2 x (control_interval_s + recent step time) + 1 s`` (two exchange periods and a
        second's slack); keep every step exchanging until the reply is handled; then give the
        period back to ``control_interval_s``. Outside an epoch (before the first, between
        two) it does not wait: the next epoch's start adopts a batch at once. Yields whether
        the wait ended before its bound (it does not when the loop stalls inside an epoch: a
        report is never held longer). One window at a time (the reporter sends one report at
        a time)."""
        with self._window_lock:
            self._window_requested = True
            if (
                self._windows_ended
                or self.world_size == 1  # alone, every step exchanges anyway
                or self._micro is None  # outside an epoch: the next one's start adopts it
                or (self._control_every == 1 and self._last_proposal == 1)
            ):
                self._window_open.set()
        wait_s = 2.0 * (self._options.control_interval_s + (self.profiler.recent_step_s() or 0.0))
        try:
            yield self._window_open.wait(wait_s + 1.0)
        finally:
            with self._window_lock:
                self._window_requested = False
                self._window_open.clear()

    def end_reply_windows(self) -> None:
        """The loop steps no more (the job shuts down): no report waits for a window."""
        with self._window_lock:
            self._windows_ended = True
            self._window_open.set()

    def _latest_batch(self) -> BatchConfig:
        return self._batch_schedule[-1][1] if self._batch_schedule else self.batch

    def gain(self) -> float:
        """AdaScale gain at the current batch size from the host statistics (1 before data)."""
        return self.gain_at(self.batch.global_batch_size / self._options.initial_batch_size)

    def note_checkpoint(self) -> None:
        """A checkpoint was just saved (restarts the ``checkpoint_every_s`` period)."""
        self.last_checkpoint_s = self._clock.monotonic_s()

    # ------------------------------------------------------------------ the loop
    def normalize_epoch(self) -> None:
        n = self.data.num_samples
        if n is not None and self.data.position >= n:
            self.data = DataState(self.data.epoch + 1, 0, n)

    def start_epoch_iteration(self, num_samples: int) -> None:
        self._host.restore()
        if self._model is None or self._optimizer is None:
            raise TrainerUsageError("call prepare() before iterating the data loader")
        if not self._step_done:
            raise TrainerUsageError("optimizer.step() was not called for the last global batch")
        if self.data.num_samples is None:
            self.data = dataclasses.replace(self.data, num_samples=num_samples)
        elif self.data.num_samples != num_samples:
            raise TrainerConfigError(
                f"dataset has {num_samples} samples, the checkpoint {self.data.num_samples}",
                field="dataset",
            )
        self.safe_point()
        self.normalize_epoch()
        if self.data.position == 0:
            self._agree_batch_config()
        self._micro = None
        self.profiler.break_chain()

    def _agree_batch_config(self) -> None:
        """At an epoch boundary, every rank adopts rank 0's pending batch configuration."""
        pending = self.pending_batch if self.rank == 0 else None
        if self.world_size > 1:
            self.control.drain()
            flat = torch.tensor(
                [0, 0, 0]
                if pending is None
                else [1, pending.global_batch_size, pending.accum_steps],
                dtype=torch.int64,
            )
            dist.broadcast(flat, src=0, group=self._ctrl_group)
            has, size, accum = (int(v) for v in flat.tolist())
            pending = BatchConfig(size, accum) if has else None
        self.pending_batch = None
        if pending is None:
            return
        if pending != self.batch_for_step(self.step):
            logger.info(
                "batch configuration %s -> %s at epoch %d", self.batch, pending, self.data.epoch
            )
        # Newer than anything agreed before or still in flight: it replaces them.
        self.batch = pending
        self._batch_schedule = []
        self._boundary_at = self.step

    def leave_epoch_iteration(self) -> None:
        self._micro = None

    def enter_micro_batch(self, mb: MicroBatch) -> None:
        state = self._state
        if mb.index == 0:
            self.safe_point()
            if not self._step_done:
                raise TrainerUsageError(
                    f"optimizer.step() was not called for global step {mb.step - 1}"
                )
            agreed = self.batch_for_step(mb.step)
            if mb.batch != agreed:
                raise TrainerUsageError(
                    f"global step {mb.step} was planned at {mb.batch}, agreed: {agreed}"
                )
            if self._batch_schedule:
                self._batch_schedule = [(s, b) for s, b in self._batch_schedule if s > mb.step]
            if mb.batch != self.batch:
                logger.info(
                    "batch configuration %s -> %s at step %d (epoch %d, position %d)",
                    self.batch,
                    mb.batch,
                    mb.step,
                    mb.epoch,
                    mb.position,
                )
                self.batch = mb.batch
            self._step_done = False
            self.profiler.begin_step()
            if mb.measure:
                state.reset()
                state.measure = True
                state.sqrt_precond = self._preconditioner()
        if mb.measure and mb.is_last and self.world_size > 1:
            # Local gradient norms, read as each gradient is accumulated, before DDP's reducer
            # copies the reduced values back (measurement steps only; removed at the step).
            weights = state.sqrt_precond or {}
            for p in self._params:
                state.handles.append(
                    p.register_post_accumulate_grad_hook(
                        lambda q, w=weights.get(id(p)): state.local_parts.append(
                            sq_norm_one(q.grad, w, self._scratch)
                        )
                    )
                )
        elif mb.measure and mb.index == 1 and self.world_size == 1:
            # One replica: keep the first micro-batch's mean gradient (measurement steps only).
            # After micro-batch 0 the gradient is (b0 / B) * mean_0.
            params = [p for p in self._params if p.grad is not None]
            state.small_params = params
            state.small_copy = list(
                torch._foreach_mul(
                    [p.grad for p in params],  # type: ignore[misc]  # not None: filtered
                    mb.step_samples / mb.ref_size,
                )
            )
        model = self._model
        if model is not None:
            if model.require_backward_grad_sync is not mb.is_last:
                model.require_backward_grad_sync = mb.is_last
            # The output-gradient weight hook exists only while some weight is not 1.
            if (
                mb.weight != 1.0
                and self._weight_handle is None
                and self._options.weight_model_outputs
            ):
                self._weight_handle = model.register_forward_hook(self._forward_hook)
            elif mb.weight == 1.0 and self._weight_handle is not None:
                self._weight_handle.remove()
                self._weight_handle = None
        self._weight = mb.weight
        self._micro = mb
        self._micro_step_called = False

    @property
    def _params(self) -> list[torch.Tensor]:
        return self._param_list

    def _preconditioner(self) -> dict[int, torch.Tensor] | None:
        """Adam's ``sqrt(1/(sqrt(v_hat)+eps))``, recomputed every ``PRECOND_REFRESH``
        measurements (it drifts slowly; any fixed weighting keeps the estimates unbiased)."""
        opt = self._optimizer
        if self.rule is not ScalingRule.SQRT or opt is None or not is_adam_type(opt.inner):
            return None
        if self._precond_cache is None or self._precond_uses >= PRECOND_REFRESH:
            self._precond_cache = adam_sqrt_preconditioner(opt.inner, self._precond_cache)
            self._precond_uses = 0
        self._precond_uses += 1
        return self._precond_cache

    def mark_grads_done(self, param: torch.Tensor) -> None:
        self.profiler.mark_last_bucket()

    def _forward_hook(self, module: Any, inputs: Any, output: Any) -> Any:
        weight = self._weight
        if weight != 1.0 and torch.is_grad_enabled():
            for tensor in _tensors_in(output):
                if tensor.requires_grad:
                    tensor.register_hook(lambda g, w=weight: g * w)
        return None

    def zero_grad_allowed(self) -> bool:
        if self._micro is None or self._step_done:
            return True
        return self._micro.index == 0 and not self._micro_step_called

    def optimizer_step(self, opt: ElasticOptimizer, closure: Callable[[], Any] | None) -> Any:
        mb = self._micro
        if mb is None:
            raise TrainerUsageError("optimizer.step() outside an epoch of the elastic data loader")
        self._micro_step_called = True
        if not mb.is_last:
            return None
        if self._step_done:
            raise TrainerUsageError("optimizer.step() called twice for one global batch")
        state = self._state
        if state.handles:
            state.remove_hooks()
        self.finish_measurement()
        params = [p for p in self._params if p.grad is not None]
        if not params:
            raise TrainerUsageError("optimizer.step() before backward() on the last micro-batch")
        grads: list[torch.Tensor] = [p.grad for p in params]  # type: ignore[misc]  # filtered
        global_sq = None
        if mb.measure:
            global_sq = sq_norm_params(grads, params, state.sqrt_precond, self._scratch)
            check = global_sq
        elif self._options.skip_nonfinite:
            check = torch.stack([g.sum() for g in grads]).sum()
        else:
            check = None
        # the one host read per step
        finite = check is None or bool(torch.isfinite(check).item())
        self._since_exchange += 1
        exchange = self._since_exchange >= self._control_every
        decision = _NO_DECISION
        if exchange:
            self._since_exchange = 0
            decision = self.control.collect()
            if decision.batch_size and self._posted_at <= self._boundary_at:
                # offered before an epoch boundary adopted a newer request: stale
                decision = dataclasses.replace(decision, batch_size=0, accum_steps=0)
            if decision.next_every and self.world_size > 1:  # alone, exchanging is free
                self._control_every = decision.next_every
        if mb.measure:
            self.gns.refresh()
        ratio = mb.batch.global_batch_size / self._options.initial_batch_size
        gain = self.gain_at(ratio)
        result = None
        if finite:
            if global_sq is not None:
                self._start_measurement(mb, global_sq)
            factor = lr_factor(self.rule, gain, ratio)
            result = opt.scaled_step(factor, closure)
            self.lr_scale = factor
            self.progress += gain * mb.step_samples / mb.batch.global_batch_size
        else:
            self.skipped += 1
            logger.warning(
                "step %d: non-finite gradient; update skipped (%d skipped so far)",
                self.step,
                self.skipped,
            )
        if mb.measure:
            state.reset()
        data = self.data
        self.data = DataState(data.epoch, data.position + mb.step_samples, data.num_samples)
        self.step += 1
        self._step_done = True
        self.profiler.end_step(
            self._profile_key(mb.batch),
            # typical steps only: a full global batch, split as configured
            record=mb.step_samples == mb.batch.global_batch_size
            and mb.count == mb.batch.accum_steps,
        )
        if exchange:
            offer = self._batch_offer()
            with self._window_lock:
                proposal = self._propose_control_every()
                self.control.post(
                    stop=self._host.stop_cause is not None,
                    checkpoint=self._checkpoint_due(),
                    next_every=proposal,
                    batch_size=offer.global_batch_size if offer else 0,
                    accum_steps=offer.accum_steps if offer else 0,
                )
                self._last_proposal = proposal
                if self._window_requested and self._control_every == 1 and proposal == 1:
                    self._window_open.set()  # every step exchanges from here on
            self._posted_at = self.step
        self._after_step(decision)
        return result

    def _batch_offer(self) -> BatchConfig | None:
        """Rank 0: its request, if it is not already the latest agreed configuration."""
        pending = self.pending_batch if self.rank == 0 else None
        return pending if pending is not None and pending != self._latest_batch() else None

    def _propose_control_every(self) -> int:
        """Rank 0: steps per ``control_interval_s`` at the recent step time (1..64); 1 while a
        reply window is requested or open."""
        if self.rank != 0:
            return 0
        if self._window_requested:
            return 1
        step_s = self.profiler.recent_step_s()
        if step_s is None or step_s <= 0:
            return 1
        return max(1, min(64, int(self._options.control_interval_s / step_s)))

    def _profile_key(self, batch: BatchConfig) -> ProfileKey:
        key = self._profile_keys.get(batch)
        if key is None:
            key = ProfileKey(
                self._env.num_nodes,
                self.world_size,
                batch.local_batch_size(self.world_size),
                batch.accum_steps,
            )
            self._profile_keys[batch] = key
        return key

    def gain_at(self, ratio: float) -> float:
        values = self.gns.values()
        return 1.0 if values is None else adascale_gain(values[0], values[1], ratio)

    def _start_measurement(self, mb: MicroBatch, global_sq: torch.Tensor) -> None:
        """Fold this step's norms into the estimator (one replica) or start the tiny
        all-reduce of the replicas' terms, finished at the next step (several)."""
        state = self._state
        B = mb.step_samples
        if self.world_size == 1:
            if not state.small_copy:
                return
            final: list[torch.Tensor] = [p.grad for p in state.small_params]  # type: ignore[misc]
            diff = torch._foreach_sub(final, state.small_copy)
            diff_sq = sq_norm_params(diff, state.small_params, state.sqrt_precond, self._scratch)
            sigma2 = sigma2_from_difference(diff_sq, mb.ref_size, B)
            self.gns.update(grad_sqr_from(global_sq, sigma2, B), sigma2)
            self.gns.publish()
            return
        if not state.local_parts:
            return
        # Local gradient = (W / B) * sum of local per-sample gradients = (W n / B) * m_local.
        scale = B / (self.world_size * mb.local_samples)
        local_sq = torch.stack(state.local_parts).sum() * scale**2
        terms = small_batch_terms(local_sq, mb.local_samples, B)
        work = dist.all_reduce(terms, async_op=True)
        self._pending_gns = _PendingMeasurement(work, terms, global_sq, B)

    def finish_measurement(self) -> None:
        pending = self._pending_gns
        if pending is None:
            return
        self._pending_gns = None
        pending.work.wait()
        sigma2 = sigma2_from_replicas(pending.global_sq, pending.terms, self.world_size)
        self.gns.update(grad_sqr_from(pending.global_sq, sigma2, pending.step_samples), sigma2)
        self.gns.publish()

    def _checkpoint_due(self) -> bool:
        every = self._options.checkpoint_every_s
        return (
            self.rank == 0
            and every > 0
            and self._clock.monotonic_s() - self.last_checkpoint_s >= every
        )

    def _after_step(self, decision: ControlDecision) -> None:
        """Remember what the step agreed: a batch configuration is scheduled (see the module
        docstring), a stop or checkpoint is acted on at the next safe point."""
        if decision.batch_size:
            self._schedule_batch(BatchConfig(decision.batch_size, decision.accum_steps))
        every = self._options.checkpoint_every_steps
        checkpoint = decision.checkpoint or bool(every and self.step % every == 0)
        if decision.stop or checkpoint:
            pending = self._pending_decision
            self._pending_decision = ControlDecision(
                stop=pending.stop or decision.stop, checkpoint=pending.checkpoint or checkpoint
            )

    def _schedule_batch(self, batch: BatchConfig) -> None:
        if batch == self._latest_batch():
            return
        first = self.step + self.batch_lead_steps - 1
        kept = [(s, b) for s, b in self._batch_schedule if s < first]
        self._batch_schedule = [*kept, (first, batch)]
        logger.info("batch configuration %s agreed, in force from step %d", batch, first)

    def safe_point(self) -> None:
        """Between global batches, after the user's loop body finished the last one (so its
        own per-step work, e.g. ``scheduler.step()``, is in the checkpoint): stop or save if a
        step agreed to. Every rank reaches the same safe point with the same decision."""
        decision = self._pending_decision
        if not (decision.stop or decision.checkpoint):
            return
        self._pending_decision = ControlDecision()
        if decision.stop:
            self._host.stop_at_safe_point(self._host.stop_cause or StopCause.PEER)
        self._host.save_checkpoint(wait=False)


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
