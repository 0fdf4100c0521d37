"""Gradient-noise measurement: unbiased |G|^2 and tr(Sigma) estimates from two batch sizes.

Let ``g_s`` be per-sample gradients with mean ``G`` and per-sample covariance trace ``sigma2``.
The mean gradient ``m_b`` of ``b`` samples has ``E|m_b|^2 = |G|^2 + sigma2 / b`` (the samples of
one batch are distinct draws). Two squared norms at batch sizes ``s < B`` therefore give

    sigma2_hat = (|m_s|^2 - |m_B|^2) / (1/s - 1/B)      |G|^2_hat = |m_B|^2 - sigma2_hat / B

both unbiased, whether or not the small batch is part of the large one. The trainer gets them
for free from what data-parallel training already computes:

* several replicas: ``m_s`` is each replica's local gradient (read by a post-accumulate hook on
  each parameter, before DDP's reducer copies the all-reduced values back), ``m_B`` the
  all-reduced one; the per-replica estimates are averaged
  (one tiny all-reduce on measurement steps only);
* one replica: ``m_s`` is the first accumulation micro-batch's gradient (copied between
  micro-steps, on measurement steps only), ``m_B`` the accumulated one; the variance comes from
  ``|m_s - m_B|^2``, whose expectation is ``sigma2 (1/s - 1/B)``.

Reported at the initial batch size ``M0``: ``grad_sqr = |G|^2``, ``grad_var = sigma2 / M0``. Both
are smoothed by an exponential moving average with bias correction (``smoothing`` = weight of
the past per measurement). For Adam-type optimisers the norms are taken in the preconditioned
metric ``sum(g^2 / (sqrt(v_hat) + eps))`` (``v_hat`` = Adam's bias-corrected second moment), the
geometry in which Adam's steps are taken.

Everything stays on the device as tensors: there is no host synchronisation here. Non-finite
measurements are masked out (``torch.where``), so an overflowing step never poisons the average.
Host copies for the learning-rate scaling go through :class:`HostMirror`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from trainer.errors import TrainerConfigError

ADAM_TYPES = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax")


def sq_norm_flat(buffer: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of a flat tensor, as a float64 0-dim tensor on its device."""
    if buffer.dtype in (torch.float16, torch.bfloat16):
        buffer = buffer.float()
    return torch.dot(buffer, buffer).to(torch.float64)


def sq_norm_weighted(
    tensors: Sequence[torch.Tensor], sqrt_weights: Sequence[torch.Tensor]
) -> torch.Tensor:
    """``sum_i sum(t_i^2 * w_i)`` for flat tensors and flat ``sqrt(w_i)``, float64 0-dim."""
    if not tensors:
        raise TrainerConfigError("no tensors to measure", field="tensors")
    scaled = torch._foreach_mul(list(tensors), list(sqrt_weights))
    norms = torch._foreach_norm(scaled)
    return torch.stack(norms).to(torch.float64).square().sum()


def sq_norm_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``sum_i |t_i|^2`` as a float64 0-dim tensor, via one fused norm per tensor list."""
    norms = torch._foreach_norm(list(tensors))
    return torch.stack(norms).to(torch.float64).square().sum()


def is_adam_type(optimizer: torch.optim.Optimizer) -> bool:
    """Adam-family optimisers (preconditioned statistics, square-root LR scaling)."""
    return any(cls.__name__ in ADAM_TYPES for cls in type(optimizer).__mro__)


def adam_sqrt_preconditioner(
    optimizer: torch.optim.Optimizer,
    reuse: dict[int, torch.Tensor] | None = None,
) -> dict[int, torch.Tensor] | None:
    """``sqrt(1 / (sqrt(v_hat) + eps))`` per parameter (keyed by ``id(param)``), flattened.

    Parameters without a second-moment estimate yet (before their first step) are absent and
    measured unpreconditioned; ``None`` when no parameter has one (before the first step).
    Tensors of ``reuse`` (a previous result) are overwritten in place where they fit, so a
    refresh allocates nothing.
    """
    params: list[torch.Tensor] = []
    denom: list[torch.Tensor] = []
    divisors: list[float] = []
    eps: list[float] = []
    for group in optimizer.param_groups:
        beta2 = float(group["betas"][1])
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state or "exp_avg_sq" not in state:
                continue
            step = state.get("step", 1)
            step = float(step.item() if isinstance(step, torch.Tensor) else step)
            second = state["exp_avg_sq"].reshape(-1)
            old = None if reuse is None else reuse.get(id(p))
            if old is not None and old.shape == second.shape and old.dtype == second.dtype:
                denom.append(torch.sqrt(second, out=old))
            else:
                denom.append(torch.sqrt(second))
            params.append(p)
            divisors.append(math.sqrt(max(1.0 - beta2**step, 1e-30)))
            eps.append(float(group["eps"]))
    if not params:
        return None
    torch._foreach_div_(denom, divisors)
    torch._foreach_add_(denom, eps)
    torch._foreach_reciprocal_(denom)
    torch._foreach_sqrt_(denom)
    return {id(p): d for p, d in zip(params, denom, strict=True)}


class Scratch:
    """One reusable flat buffer per (dtype, device), grown to the largest request.

    Weighted norms multiply into it instead of allocating a parameter-sized temporary per
    tensor (allocation and first-touch page faults cost more than the multiply itself). Its
    uses are sequential: the gradient hooks of one backward pass run one after another, then
    the optimizer step; on CUDA they are ordered on the stream, since ``backward()`` returns
    synchronised with the caller's stream. Memory: one copy of the largest parameter.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}

    def take(self, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (dtype, device)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buffer
        return buffer[:numel]


def sq_norm_one(
    grad: torch.Tensor, sqrt_weight: torch.Tensor | None, scratch: Scratch | None = None
) -> torch.Tensor:
    """Squared (weighted) norm of one gradient tensor, float64 0-dim: one or two kernels
    (the weighted product goes into ``scratch`` when given, else into a temporary)."""
    flat = grad.reshape(-1)
    if flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()
    if sqrt_weight is not None:
        if scratch is None:
            flat = flat * sqrt_weight
        else:
            dtype = torch.promote_types(flat.dtype, sqrt_weight.dtype)
            flat = torch.mul(flat, sqrt_weight, out=scratch.take(flat.numel(), dtype, flat.device))
    return torch.dot(flat, flat).to(torch.float64)


def sq_norm_params(
    grads: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
    sqrt_precond: dict[int, torch.Tensor] | None,
    scratch: Scratch | None = None,
) -> torch.Tensor:
    """Squared norm of flat gradients ``grads`` of ``params``, preconditioned where
    ``sqrt_precond`` has the parameter (float64 0-dim). With ``scratch``, the weighted products
    reuse its buffer instead of allocating one temporary per parameter."""
    flat = [g.reshape(-1) for g in grads]
    if not sqrt_precond:
        return sq_norm_tensors(flat)
    weighted: list[torch.Tensor] = []
    weights: list[torch.Tensor] = []
    plain: list[torch.Tensor] = []
    for g, p in zip(flat, params, strict=True):
        w = sqrt_precond.get(id(p))
        if w is None:
            plain.append(g)
        else:
            weighted.append(g)
            weights.append(w)
    parts: list[torch.Tensor] = []
    if weighted:
        if scratch is None:
            parts.append(sq_norm_weighted(weighted, weights))
        else:
            norms = [sq_norm_one(g, w, scratch) for g, w in zip(weighted, weights, strict=True)]
            parts.append(torch.stack(norms).sum())
    if plain:
        parts.append(sq_norm_tensors(plain))
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


class HostMirror:
    """A host copy of a small device tensor, refreshed without stalling the device.

    ``push(t)`` starts the copy (on CUDA: non-blocking into pinned memory plus an event);
    ``pull()`` returns the most recently pushed value, waiting for that copy if it is still in
    flight (by then long finished). Callers push and pull at the same step on every rank, so
    every rank sees the same values at the same step.
    """

    def __init__(self, initial: Sequence[float]) -> None:
        self._value = [float(v) for v in initial]
        self._pending: tuple[torch.Tensor, Any] | None = None

    def push(self, tensor: torch.Tensor) -> None:
        if tensor.is_cuda:
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (host, event)
        else:
            self._value = [float(v) for v in tensor.tolist()]
            self._pending = None

    def pull(self) -> list[float]:
        if self._pending is not None:
            host, event = self._pending
            event.synchronize()
            self._value = [float(v) for v in host.tolist()]
            self._pending = None
        return list(self._value)


def sigma2_from_replicas(
    global_sq: torch.Tensor, small_terms: torch.Tensor, num_small: int
) -> torch.Tensor:
    """Per-sample variance trace from ``num_small`` replicas' local gradients.

    ``small_terms = [sum_i c_i * L_i, sum_i c_i]`` (all-reduced), with ``L_i = |m_{s_i}|^2`` and
    ``c_i = 1 / (1/s_i - 1/B)`` (see :func:`small_batch_terms`); ``global_sq = |m_B|^2``. Each
    replica's ``c_i (L_i - |m_B|^2)`` is unbiased; this is their mean.
    """
    return (small_terms[0] - global_sq * small_terms[1]) / num_small


def sigma2_from_difference(diff_sq: torch.Tensor, small_samples: int, step_samples: int):
    """Per-sample variance trace from ``|m_s - m_B|^2`` where the ``s`` samples are part of the
    ``B`` (``E|m_s - m_B|^2 = sigma2 (1/s - 1/B)``; free of the signal cross term that makes
    ``|m_s|^2 - |m_B|^2`` noisy)."""
    return diff_sq * small_batch_coefficient(small_samples, step_samples)


def grad_sqr_from(global_sq: torch.Tensor, sigma2: torch.Tensor, step_samples: int):
    """``|G|^2 = |m_B|^2 - sigma2 / B`` (unbiased)."""
    return global_sq - sigma2 / step_samples


def small_batch_coefficient(small_samples: int, step_samples: int) -> float:
    """``c = 1 / (1/s - 1/B)``; requires ``s < B``."""
    if not 0 < small_samples < step_samples:
        raise TrainerConfigError(
            f"small batch {small_samples} must be in (0, {step_samples})", field="small_samples"
        )
    return 1.0 / (1.0 / small_samples - 1.0 / step_samples)


def small_batch_terms(
    local_sq: torch.Tensor, small_samples: int, step_samples: int
) -> torch.Tensor:
    """``[c * L, c]`` for one small-batch squared norm ``L`` (float64, on ``L``'s device)."""
    c = small_batch_coefficient(small_samples, step_samples)
    return torch.stack([local_sq * c, torch.full_like(local_sq, c)])


class GradientNoiseEstimator:
    """Smoothed ``grad_sqr`` and ``grad_var`` at the initial batch size (device tensors).

    State: ``[ema(|G|^2), ema(sigma2 / M0), ema weight]`` (float64). ``update`` folds in one
    step's estimates only where they are finite. ``values()`` returns bias-corrected host floats
    of the last ``publish()``; ``measurements`` counts accepted updates (host counter).
    """

    def __init__(
        self, initial_batch_size: int, *, smoothing: float, device: torch.device | str = "cpu"
    ) -> None:
        if initial_batch_size < 1:
            raise TrainerConfigError("must be >= 1", field="initial_batch_size")
        if not 0.0 <= smoothing < 1.0:
            raise TrainerConfigError("must be in [0, 1)", field="gns_smoothing")
        self.initial_batch_size = int(initial_batch_size)
        self.smoothing = float(smoothing)
        self.state = torch.zeros(3, dtype=torch.float64, device=device)
        self.measurements = 0
        self._mirror = HostMirror([0.0, 0.0, 0.0])
        self._host = [0.0, 0.0, 0.0]

    def update(self, grad_sqr: torch.Tensor, sigma2: torch.Tensor) -> None:
        """Fold one step's unbiased estimates in (masked if not finite). No host sync."""
        beta = self.smoothing
        sample = torch.stack([grad_sqr, sigma2 / self.initial_batch_size, torch.ones_like(sigma2)])
        updated = self.state * beta + sample * (1.0 - beta)
        ok = torch.isfinite(sample).all()
        self.state = torch.where(ok, updated, self.state)
        self.measurements += 1

    def publish(self) -> None:
        """Start copying the current state to the host (read by :meth:`refresh`)."""
        self._mirror.push(self.state)

    def refresh(self) -> None:
        """Adopt the last published state as the host view (same step on every rank)."""
        self._host = self._mirror.pull()

    def values(self) -> tuple[float, float] | None:
        """Host ``(grad_sqr, grad_var)`` at ``M0``, bias corrected; ``None`` before any data."""
        sqr, var, weight = self._host
        if weight <= 0.0:
            return None
        return sqr / weight, var / weight

    def state_dict(self) -> dict[str, Any]:
        return {
            "state": self.state.detach().cpu().clone(),
            "measurements": self.measurements,
            "initial_batch_size": self.initial_batch_size,
            "host": list(self._host),
        }

    def load_state_dict(self, data: dict[str, Any]) -> None:
        if int(data["initial_batch_size"]) != self.initial_batch_size:
            raise TrainerConfigError(
                f"checkpoint has initial batch size {data['initial_batch_size']}, "
                f"the job says {self.initial_batch_size}",
                field="initial_batch_size",
            )
        self.state = data["state"].to(device=self.state.device, dtype=torch.float64)
        self.measurements = int(data["measurements"])
        self._host = [float(v) for v in data["host"]]
        self._mirror = HostMirror(self._host)
