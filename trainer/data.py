"""Elastic data loading: a global, world-size-independent sample order and batch sequence.

The contract, which is what makes a restart at another world size exact:

* **Order.** Epoch ``e`` visits the dataset in ``epoch_order(n, seed, e)``: a permutation drawn
  from ``numpy.random.default_rng([seed, e])`` (the identity when ``shuffle=False``). It does not
  depend on the number of replicas.
* **Global batches.** Starting at the epoch position ``p`` (samples of this epoch already
  consumed), each optimizer step takes the next ``B = global_batch_size`` samples of the order;
  the last step of an epoch takes what is left (fewer than ``B``; no sample is dropped).
* **Split.** A step's ``B_step`` samples are cut into ``W`` contiguous shares, sizes as even as
  possible (the first ``B_step mod W`` replicas get one more), and each share into
  ``min(accum_steps, share)`` contiguous micro-batches, again as even as possible. A replica whose
  share is empty (only when ``B_step < W``, at an epoch's tail) runs one *padding* micro-batch
  (a stand-in sample with weight 0) so that it still takes part in the gradient all-reduce.
* **Weights.** Each micro-batch carries ``weight = size * W / B_step``; the trainer multiplies
  the gradient flowing out of the model's output by it (a no-op in the common case of an even
  split without accumulation, where it is 1), and DDP averages over the ``W`` replicas. With a
  loss that is a mean over the micro-batch, each real sample then contributes exactly
  ``1 / B_step`` of its gradient: the update is the mean over the global batch, whatever ``W``,
  the accumulation and the split.
* **Position.** The position advances by ``B_step`` when the optimizer step of that batch ends;
  a checkpoint stores ``(epoch, position, step)``, so a restart with any world size resumes at the
  exact sample: no sample of an epoch is skipped or repeated.
* **Batch configuration.** It can change at any global step (agreed by all ranks, see
  :mod:`trainer.stepping`, "Batch changes") and at a restart: the sequence above is defined
  from the position on, each step taking its own ``B``, so every change is exact. Mid-epoch,
  the loader re-plans the rest of the epoch from the first step at the new configuration
  (:meth:`ElasticDataLoader.load`).

Gradient-noise measurement steps (every ``gns_every_steps`` global steps) need two batch sizes:
with several replicas the local and the global gradient; with one replica and no accumulation the
step's batch is split into two micro-batches (the update is unchanged, see *Weights*).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trainer.errors import TrainerConfigError
from trainer.report import BatchConfig


@dataclass(frozen=True)
class DataState:
    """Where the data stands: ``position`` samples of ``epoch`` consumed, of ``num_samples``."""

    epoch: int = 0
    position: int = 0
    num_samples: int | None = None


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The dataset indices of epoch ``epoch`` in visiting order (int64, length ``num_samples``)."""
    if num_samples < 0:
        raise TrainerConfigError("num_samples must be >= 0", field="num_samples")
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch)])
    return rng.permutation(num_samples).astype(np.int64, copy=False)


def split_even(total: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous chunks of ``total`` items; the first ``total % parts``
    chunks get one more item. ``sum(result) == total``."""
    if parts < 1:
        raise TrainerConfigError("parts must be >= 1", field="parts")
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


@dataclass(frozen=True, eq=False)
class MicroBatch:
    """One micro-batch of one replica, with everything the trainer needs to weight it.

    ``sample_ids``: dataset indices fed to the model (for padding, the stand-in sample).
    ``step``: global optimizer-step index. ``index``/``count``: position among this replica's
    micro-batches of the step. ``step_samples``: samples of the whole global batch (``B_step``).
    ``local_samples``: real samples of this replica in this step. ``ref_size``: this replica's
    first micro-batch size. ``weight``: multiplier of the output gradient (see module
    docstring). ``measure``: a gradient-noise measurement step. ``batch``: the configuration
    the step was planned at. ``position``: the epoch position at the start of the step.
    """

    sample_ids: np.ndarray
    epoch: int
    step: int
    index: int
    count: int
    step_samples: int
    local_samples: int
    ref_size: int
    weight: float
    padding: bool
    measure: bool
    rank: int
    world_size: int
    batch: BatchConfig
    position: int = 0

    @property
    def is_last(self) -> bool:
        """The last micro-batch of its step on this replica (its backward all-reduces)."""
        return self.index == self.count - 1

    @property
    def counted_ids(self) -> np.ndarray:
        """The samples this micro-batch really trains on (empty for padding)."""
        return self.sample_ids[:0] if self.padding else self.sample_ids

    @property
    def small_batch_samples(self) -> int:
        """Samples behind the 'small' gradient of a measurement: the local gradient with
        several replicas, the first micro-batch with one."""
        return self.local_samples if self.world_size > 1 else self.ref_size


def is_measure_step(step: int, step_samples: int, world_size: int, gns_every_steps: int) -> bool:
    """Whether global step ``step`` measures gradient noise (identical on every rank)."""
    if gns_every_steps <= 0 or step % gns_every_steps != 0:
        return False
    if world_size > 1:
        return step_samples >= world_size  # every replica holds at least one real sample
    return step_samples >= 2  # one replica: the batch is split in two


def plan_step(
    batch_ids: np.ndarray,
    *,
    epoch: int,
    step: int,
    batch: BatchConfig,
    world_size: int,
    rank: int,
    gns_every_steps: int,
    position: int = 0,
) -> list[MicroBatch]:
    """This replica's micro-batches for one global batch ``batch_ids``, which starts at epoch
    position ``position`` (see module docstring)."""
    step_samples = len(batch_ids)
    if step_samples < 1:
        raise TrainerConfigError("empty global batch", field="batch_ids")
    measure = is_measure_step(step, step_samples, world_size, gns_every_steps)
    shares = split_even(step_samples, world_size)
    start = sum(shares[:rank])
    local = shares[rank]
    common: dict[str, Any] = dict(
        epoch=epoch,
        step=step,
        step_samples=step_samples,
        rank=rank,
        world_size=world_size,
        batch=batch,
        measure=measure,
        position=position,
    )
    if local == 0:
        return [
            MicroBatch(
                sample_ids=batch_ids[:1],
                index=0,
                count=1,
                local_samples=0,
                ref_size=1,
                weight=0.0,
                padding=True,
                **common,
            )
        ]
    count = min(batch.accum_steps, local)
    if measure and world_size == 1 and count == 1:
        count = 2
    sizes = split_even(local, count)
    ref = sizes[0]
    out = []
    offset = start
    for k, size in enumerate(sizes):
        out.append(
            MicroBatch(
                sample_ids=batch_ids[offset : offset + size],
                index=k,
                count=count,
                local_samples=local,
                ref_size=ref,
                weight=size * world_size / step_samples,
                padding=False,
                **common,
            )
        )
        offset += size
    return out


def plan_epoch(
    order: np.ndarray,
    *,
    epoch: int,
    position: int,
    first_step: int,
    batch: BatchConfig | Callable[[int], BatchConfig],
    world_size: int,
    rank: int,
    gns_every_steps: int,
) -> Iterator[MicroBatch]:
    """This replica's micro-batches from ``position`` to the end of the epoch, in order.

    ``batch``: the configuration of every step, or a function of the global step that gives
    each step's (a schedule of changes)."""
    n = len(order)
    if not 0 <= position <= n:
        raise TrainerConfigError(f"position {position} outside [0, {n}]", field="position")
    batch_at = batch if callable(batch) else (lambda _step: batch)
    step = first_step
    while position < n:
        config = batch_at(step)
        ids = order[position : position + config.global_batch_size]
        yield from plan_step(
            ids,
            epoch=epoch,
            step=step,
            batch=config,
            world_size=world_size,
            rank=rank,
            gns_every_steps=gns_every_steps,
            position=position,
        )
        position += len(ids)
        step += 1


class LoaderJob(Protocol):
    """The port :class:`ElasticDataLoader` drives; :class:`trainer.stepping.StepLoop` implements it.

    The read-only views say where the job stands; ``batch_for_step(step)`` is the agreed
    configuration of a global step (it changes only for steps the loader has not handed out);
    ``start_epoch_iteration(num_samples)`` is called once before an epoch's first micro-batch
    (it may run a safe point and adopt a new batch configuration), ``enter_micro_batch(mb)``
    before each micro-batch is handed out, and ``leave_epoch_iteration()`` after the last one.
    """

    @property
    def data_state(self) -> DataState: ...

    @property
    def step(self) -> int: ...

    @property
    def batch(self) -> BatchConfig: ...

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def gns_every_steps(self) -> int: ...

    @property
    def training_done(self) -> bool: ...

    def batch_for_step(self, step: int) -> BatchConfig: ...

    def start_epoch_iteration(self, num_samples: int) -> None: ...

    def enter_micro_batch(self, mb: MicroBatch) -> None: ...

    def leave_epoch_iteration(self) -> None: ...


class ElasticDataLoader:
    """Iterates one epoch of ``dataset`` for this replica, from the job's current position.

    Yields what a ``torch.utils.data.DataLoader`` over the micro-batches' sample ids yields
    (``collate_fn``, ``num_workers``, ``pin_memory`` and other keyword arguments are passed
    through). Before each yield it tells the job which micro-batch is current
    (``job.micro_batch``), which is how the model and optimizer wrappers know when to
    synchronise gradients and step. Once the job's declared length is reached
    (``job.training_done``) it hands out no further global batch: the epoch ends there.
    Create it with :meth:`trainer.api.ElasticJob.data_loader`; a job has one elastic loader
    (evaluation loaders can be ordinary ``DataLoader`` objects).
    """

    def __init__(
        self,
        job: LoaderJob,
        dataset: Any,
        *,
        shuffle: bool = True,
        seed: int = 0,
        **dataloader_kwargs: Any,
    ) -> None:
        for forbidden in ("batch_size", "sampler", "batch_sampler", "shuffle", "drop_last"):
            if forbidden in dataloader_kwargs:
                raise TrainerConfigError(
                    "is decided by coadapt (set the batch configuration instead)", field=forbidden
                )
        self.job = job
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self._kwargs = dataloader_kwargs

    def plan(self) -> list[MicroBatch]:
        """This replica's remaining micro-batches of the current epoch, at the batch
        configurations agreed so far (no side effects)."""
        state = self.job.data_state
        return self._plan_from(state.epoch, state.position, self.job.step)

    def _plan_from(self, epoch: int, position: int, step: int) -> list[MicroBatch]:
        order = epoch_order(len(self.dataset), self.seed, epoch, self.shuffle)
        return list(
            plan_epoch(
                order,
                epoch=epoch,
                position=position,
                first_step=step,
                batch=self.job.batch_for_step,
                world_size=self.job.world_size,
                rank=self.job.rank,
                gns_every_steps=self.job.gns_every_steps,
            )
        )

    def __len__(self) -> int:
        return len(self.plan())

    def load(self, **loader_kwargs: Any) -> Iterator[tuple[MicroBatch, Any]]:
        """This replica's remaining micro-batches of the epoch, each with what a
        ``torch.utils.data.DataLoader`` over its sample ids yields (``loader_kwargs`` add to
        the loader's keyword arguments). When a step comes up whose agreed configuration is not
        the one it was planned at (a change agreed mid-epoch), the rest of the epoch is planned
        again from that step's position, and a new ``DataLoader`` loads it (the old one's
        prefetched batches are dropped: one re-plan per change)."""
        from torch.utils.data import DataLoader

        plan = self.plan()
        while plan:
            loaded = iter(
                DataLoader(
                    self.dataset,
                    batch_sampler=[mb.sample_ids.tolist() for mb in plan],
                    **self._kwargs,
                    **loader_kwargs,
                )
            )
            for micro in plan:
                if micro.index == 0 and micro.batch != self.job.batch_for_step(micro.step):
                    plan = self._plan_from(micro.epoch, micro.position, micro.step)
                    break
                yield micro, next(loaded)
            else:
                return

    def __iter__(self) -> Iterator[Any]:
        self.job.start_epoch_iteration(len(self.dataset))
        for micro, batch in self.load():
            if micro.index == 0 and self.job.training_done:
                break  # the declared length is reached: no further global batch
            self.job.enter_micro_batch(micro)
            yield batch
        self.job.leave_epoch_iteration()
