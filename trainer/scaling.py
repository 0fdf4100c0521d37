"""Learning-rate scaling for a changing batch size, and progress in initial-batch iterations.

With ``r = M / M0`` (current over initial total batch size) and the smoothed statistics of
:mod:`trainer.gns` (``grad_sqr``, ``grad_var`` at ``M0``), the AdaScale gain is

    gain = (grad_var + grad_sqr) / (grad_var / r + grad_sqr)        (1 <= gain <= r)

the number of initial-batch-size iterations one step at batch ``M`` is worth. Rules:

* ``ADASCALE`` (SGD and its momentum variants): ``lr = lr_user * gain``.
* ``SQRT`` (Adam, AdamW and the Adam family): ``lr = lr_user * sqrt(r)``.
* ``NONE``: the user's learning rate unchanged.

``lr_user`` is whatever the user's optimizer (or its LR scheduler) holds: the factor is applied
for the duration of ``step()`` only, so schedulers keep working on the unscaled value.

Progress (``ElasticJob.progress``) adds ``gain * B_step / M`` per applied step for every rule:
an estimate of the initial-batch iterations' worth of optimisation done (for SGD it is the
AdaScale iteration count; for Adam it uses the same noise-based gain computed from the
preconditioned statistics, which the square-root rule only approximates). A partial last batch of
an epoch counts pro rata; a skipped (non-finite) step counts zero. Before the first gradient
measurement the gain is 1.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from trainer.errors import TrainerConfigError


class StepDriver(Protocol):
    """The port :class:`ElasticOptimizer` calls (implemented by :class:`trainer.stepping.StepLoop`):
    ``zero_grad_allowed()`` is false while gradients accumulate within a global step;
    ``optimizer_step(opt, closure)`` runs (or, on an accumulation micro-batch, skips) the step
    of ``opt`` with the job's per-step bookkeeping, and returns what the inner step returned."""

    def zero_grad_allowed(self) -> bool: ...

    def optimizer_step(self, opt: ElasticOptimizer, closure: Callable[[], Any] | None) -> Any: ...


class ScalingRule(enum.StrEnum):
    ADASCALE = "adascale"
    SQRT = "sqrt"
    NONE = "none"


def default_rule(optimizer: torch.optim.Optimizer) -> ScalingRule:
    """AdaScale for SGD, square root for the Adam family, none for anything else."""
    from trainer.gns import is_adam_type

    if is_adam_type(optimizer):
        return ScalingRule.SQRT
    if any(cls.__name__ == "SGD" for cls in type(optimizer).__mro__):
        return ScalingRule.ADASCALE
    return ScalingRule.NONE


def adascale_gain(grad_sqr: float, grad_var: float, scale_ratio: float) -> float:
    """The AdaScale gain at ``r = scale_ratio`` (``grad_*`` at the initial batch size).

    Negative estimates are clamped to 0. With no signal (``grad_sqr <= 0``) the gain is ``r``
    (pure noise: a batch ``r`` times larger is worth ``r`` steps); with neither, 1.
    """
    if not scale_ratio > 0:
        raise TrainerConfigError(f"must be > 0, got {scale_ratio}", field="scale_ratio")
    sqr = max(grad_sqr, 0.0)
    var = max(grad_var, 0.0)
    if sqr == 0.0:
        return scale_ratio if var > 0.0 else 1.0
    return (var + sqr) / (var / scale_ratio + sqr)


def lr_factor(rule: ScalingRule, gain: float, scale_ratio: float) -> float:
    """Multiplier applied to the user's learning rate for one step."""
    if rule is ScalingRule.ADASCALE:
        return gain
    if rule is ScalingRule.SQRT:
        return math.sqrt(scale_ratio)
    return 1.0


class ElasticOptimizer(torch.optim.Optimizer):
    """The user's optimizer, stepped by coadapt.

    * ``step()`` on an accumulation micro-batch does nothing; on the last micro-batch of a step it
      skips the update if the all-reduced gradient is not finite, otherwise applies it with the
      learning rate scaled by :func:`lr_factor`, then does the trainer's per-step bookkeeping
      (data position, gradient statistics, profiling, stop/checkpoint agreement).
    * ``zero_grad()`` is ignored while gradients are being accumulated within a step.
    * ``param_groups``, ``state``, ``state_dict()``, ``load_state_dict()`` are the inner
      optimizer's, so LR schedulers built on either object behave the same.

    It is a view: ``Optimizer.__init__`` is deliberately not called.
    """

    def __init__(self, inner: torch.optim.Optimizer, job: StepDriver, rule: ScalingRule) -> None:
        if isinstance(inner, ElasticOptimizer):
            raise TrainerConfigError("optimizer is already wrapped", field="optimizer")
        self.inner = inner
        self.rule = rule
        self._job = job

    # --- views of the inner optimizer ----------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.inner.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.inner.state

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.inner.defaults

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.inner.add_param_group(param_group)

    def __repr__(self) -> str:
        return f"ElasticOptimizer(rule={self.rule}, inner={self.inner!r})"

    # --- stepping -----------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._job.zero_grad_allowed():
            self.inner.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        return self._job.optimizer_step(self, closure)

    def scaled_step(self, factor: float, closure: Callable[[], Any] | None) -> Any:
        """Run the inner step with every group's learning rate multiplied by ``factor``."""
        if factor == 1.0:
            return self.inner.step(closure)
        saved = [group["lr"] for group in self.inner.param_groups]
        try:
            for group, lr in zip(self.inner.param_groups, saved, strict=True):
                group["lr"] = lr * factor
            return self.inner.step(closure)
        finally:
            for group, lr in zip(self.inner.param_groups, saved, strict=True):
                group["lr"] = lr
