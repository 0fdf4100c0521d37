"""The job settings a training script decides (:class:`JobOptions`); the environment decides the
rest (:mod:`trainer.env`). Its own module so that both the job (:mod:`trainer.api`) and its step
loop (:mod:`trainer.stepping`) read it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

from trainer.errors import TrainerConfigError
from trainer.scaling import ScalingRule

__all__ = ["JobOptions"]


@dataclass(frozen=True)
class JobOptions:
    """Settings of the job that the script decides (the environment decides the rest).

    ``initial_batch_size`` (``M0``): the total batch size the hyper-parameters were tuned for.
    ``max_batch_size``, ``min/max_local_batch_size``, ``max_accum_steps``: limits passed to the
    scheduler. ``gns_every_steps``: measure gradient noise on every k-th step (0 = never); a
    measurement step costs about two extra passes over the gradients (a quarter of a step for
    a 1M-parameter MLP on CPU), so the default 16 keeps the average cost near 1.5%.
    ``gns_smoothing``: EMA weight of the past per measurement. ``control_interval_s``: ranks
    exchange their stop/checkpoint flags about this often (every k-th step, k chosen by rank 0
    from its step time and agreed at the previous exchange; a stop lands within two exchanges of
    the request; each exchange costs one small CPU all-reduce; alone, every step, for free).
    Around each report's reply the ranks exchange every step, so that a batch change from the
    controller lands within a step of the reply whatever this interval
    (:mod:`trainer.stepping`, "Within a step of the reply").
    ``checkpoint_every_s`` / ``checkpoint_every_steps``: periodic checkpoints (0 = off; stops
    always checkpoint).
    ``keep_last``: checkpoints kept. ``data_seed``: seed of the data order.
    ``scaling_rule``: ``None`` = by optimizer type. ``skip_nonfinite``: check the reduced
    gradient every step (one read pass over it) and skip the update if any value is not finite;
    with ``False`` only measurement steps are checked (their norms come for free) and other
    steps always update. ``preimport``: import ``torch._dynamo`` (which
    the first optimizer use needs, 1.5-3 s) in the background while the process group forms.
    ``weight_model_outputs``: multiply the gradient flowing out of the model's outputs by the
    micro-batch's weight (:mod:`trainer.data`); ``False`` when the script multiplies each
    micro-batch's loss by ``job.micro_batch.weight`` itself (needed when the model returns its
    loss beside the outputs it is computed from, as Hugging Face models do: weighting both
    would weight twice).
    """

    initial_batch_size: int
    max_batch_size: int | None = None
    min_local_batch_size: int | None = None
    max_local_batch_size: int | None = None
    max_accum_steps: int | None = None
    gns_every_steps: int = 16
    gns_smoothing: float = 0.95
    control_interval_s: float = 0.5
    checkpoint_every_s: float = 600.0
    checkpoint_every_steps: int = 0
    keep_last: int = 3
    data_seed: int = 0
    scaling_rule: ScalingRule | None = None
    skip_nonfinite: bool = True
    preimport: bool = True
    weight_model_outputs: bool = True

    def __post_init__(self) -> None:
        if self.initial_batch_size < 1:
            raise TrainerConfigError("must be >= 1", field="initial_batch_size")
        if self.gns_every_steps < 0:
            raise TrainerConfigError("must be >= 0", field="gns_every_steps")
        if self.control_interval_s < 0:
            raise TrainerConfigError("must be >= 0", field="control_interval_s")
        if self.checkpoint_every_s < 0 or self.checkpoint_every_steps < 0:
            raise TrainerConfigError("must be >= 0", field="checkpoint_every")
        if self.max_batch_size is not None and self.max_batch_size < self.initial_batch_size:
            raise TrainerConfigError("must be >= initial_batch_size", field="max_batch_size")
