"""The goodput model: system throughput x statistical efficiency, fitted per job.

Pure numerics: numbers in, numbers out; no I/O, no clock. Every public function accepts numpy
arrays and broadcasts, so a policy can evaluate thousands of allocations in one call.

Vocabulary (units in names):

* an *allocation* is ``num_nodes`` nodes holding ``num_gpus`` GPUs in total (one replica per GPU);
* ``local_bsz`` is the per-GPU micro-batch (samples), ``accum_steps`` the micro-steps per
  iteration (gradient accumulation); the *total batch size* of one iteration is
  ``M = num_gpus * local_bsz * accum_steps``;
* ``M0`` (``BatchLimits.init_batch_size``) is the batch size the job was written for: statistical
  efficiency is 1 there, and learning progress is counted in ``M0``-sized iterations.

Throughput model (time of one iteration, seconds)::

    t_compute = alpha_c + beta_c * local_bsz                       # one micro-batch, fwd + bwd
    t_sync    = 0                                   if num_gpus == 1
              = alpha_n + beta_n * log2(num_gpus)   if num_nodes == 1   (intra-node)
              = alpha_r + beta_r * log2(num_gpus)   otherwise           (inter-node)
    t_iter    = (accum_steps - 1) * t_compute + (t_compute**gamma + t_sync**gamma) ** (1/gamma)

Only the last micro-step synchronises gradients, and ``gamma >= 1`` says how much of that sync
overlaps the backward pass (1: none, the two add; large: almost fully hidden, max of the two).

Why ``log2(num_gpus)`` and not the paper's linear ``(num_gpus - 2)``: gradient all-reduce as done
by NCCL across nodes (double binary trees) has a bandwidth cost that does not grow with the number
of GPUs and a latency cost that grows with the tree depth, ``log2(K)``; a ring all-reduce's
bandwidth term ``2(K-1)/K`` also saturates. Measured on the Pollux traces
(``benchmarks/goodput_fit.py --form linear|log2|sqrt``, mean step-time MAPE over the six
applications): interpolating, all forms fit equally well (log2 0.092, linear 0.091, sqrt 0.090);
extrapolating from at most 4 nodes to 6-16 nodes, the linear term overshoots (log2 0.098,
linear 0.125, sqrt 0.096). ``sqrt(K)`` fits as well as ``log2(K)``; log2 is kept for the
all-reduce latency argument above (``tests/model/test_goodput_fit_bench.py`` checks these
relations).

Statistical efficiency (McCandlish et al. gradient noise scale, as used by Pollux)::

    phi(M0)       = M0 * grad_var / grad_sqr            # gradient noise scale
    efficiency(M) = (phi + M0) / (phi + M)              # 1 at M0, decreasing in M
    gain(M)       = M / M0 * efficiency(M)              # AdaScale gain = progress per iteration

``grad_sqr`` is the squared norm of the true gradient and ``grad_var`` the trace of the
covariance of the gradient estimate at batch size ``M0``. Goodput = throughput x efficiency,
in ``M0``-equivalent samples per second.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum

import numpy as np
from numpy.typing import ArrayLike

from autoscaler.errors import InvalidInputError

__all__ = [
    "BatchLimits",
    "BatchOptimum",
    "GoodputModel",
    "GradParams",
    "OptimizerKind",
    "PerfParams",
    "ProfileSample",
    "adascale_gain",
    "efficiency",
    "fit_perf_params",
    "lr_scale",
    "optimistic_internode",
    "predict_step_time_s",
    "validate_sample",
]


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PerfParams:
    """Fitted throughput-model parameters (all times in seconds). See the module docstring."""

    alpha_c: float  # fixed compute time of one micro-batch (kernel launches, optimizer share)
    beta_c: float  # compute time per sample of a micro-batch
    alpha_n: float  # intra-node gradient sync: base time (2+ GPUs on one node)
    beta_n: float  # intra-node gradient sync: extra time per doubling of the GPU count
    alpha_r: float  # inter-node gradient sync: base time (>= alpha_n)
    beta_r: float  # inter-node gradient sync: extra time per doubling of the GPU count (>= beta_n)
    gamma: float  # compute/sync overlap exponent, >= 1 (1 = no overlap)

    def __post_init__(self) -> None:
        for name in _PERF_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InvalidInputError(
                    f"PerfParams.{name} must be a finite number >= 0, got {value!r}",
                    field=name,
                )
        if self.gamma < 1.0:
            raise InvalidInputError(
                f"PerfParams.gamma must be >= 1, got {self.gamma}", field="gamma"
            )
        if self.alpha_c + self.beta_c <= 0:
            raise InvalidInputError("PerfParams: compute time must be positive", field="beta_c")

    def as_array(self) -> np.ndarray:
        return np.array([getattr(self, name) for name in _PERF_FIELDS], dtype=float)


#: PerfParams' field names in declaration order (``dataclasses.fields`` is slow on hot paths).
_PERF_FIELDS = tuple(f.name for f in fields(PerfParams))


@dataclass(frozen=True)
class GradParams:
    """Gradient statistics at the initial batch size ``M0``.

    ``grad_sqr``: squared norm of the true gradient; ``grad_var``: trace of the covariance of the
    ``M0``-batch gradient estimate. Both must be finite (NaN/inf are rejected: they come from
    overflowed mixed-precision gradients and must be dropped by the caller). Estimator noise can
    make either non-positive; that is accepted and handled by ``efficiency``: ``grad_var <= 0``
    means no gradient noise (phi = 0, efficiency = M0 / M) and ``grad_sqr <= 0`` means noise
    dominates (phi -> inf, efficiency = 1, its upper bound).
    """

    grad_sqr: float
    grad_var: float

    def __post_init__(self) -> None:
        for name in ("grad_sqr", "grad_var"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidInputError(
                    f"GradParams.{name} must be a finite number, got {value!r}", field=name
                )

    def noise_scale(self, init_batch_size: float) -> float:
        """phi = M0 * grad_var / grad_sqr, clamped to [0, inf]."""
        if self.grad_sqr <= 0:
            return math.inf
        return max(0.0, init_batch_size * self.grad_var / self.grad_sqr)


@dataclass(frozen=True)
class BatchLimits:
    """A job's batch-size bounds.

    ``init_batch_size`` (M0) is the smallest total batch the job runs at; ``max_batch_size`` the
    largest; ``min_local_bsz``/``max_local_bsz`` bound the per-GPU micro-batch (memory);
    ``max_accum_steps`` bounds gradient accumulation.
    """

    init_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    max_accum_steps: int = 16

    def __post_init__(self) -> None:
        for name in _LIMIT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"BatchLimits.{name} must be a positive integer, got {value!r}",
                    field=name,
                )
        if self.max_batch_size < self.init_batch_size:
            raise InvalidInputError(
                "BatchLimits.max_batch_size must be >= init_batch_size", field="max_batch_size"
            )
        if self.max_local_bsz < self.min_local_bsz:
            raise InvalidInputError(
                "BatchLimits.max_local_bsz must be >= min_local_bsz", field="max_local_bsz"
            )


_LIMIT_FIELDS = tuple(f.name for f in fields(BatchLimits))


@dataclass(frozen=True)
class ProfileSample:
    """One measured configuration: mean iteration time and its gradient-sync part.

    ``placement`` lists the GPUs used on each node (e.g. ``(4, 4)``: 2 nodes x 4 GPUs).
    ``step_time_s`` is the time of one iteration of ``accum_steps`` micro-batches of
    ``local_bsz`` samples per GPU; ``sync_time_s`` the part spent in gradient synchronisation.
    """

    placement: tuple[int, ...]
    local_bsz: int
    accum_steps: int
    step_time_s: float
    sync_time_s: float

    @property
    def num_nodes(self) -> int:
        return sum(1 for g in self.placement if g > 0)

    @property
    def num_gpus(self) -> int:
        return sum(self.placement)


def validate_sample(s: object, where: str = "sample") -> None:
    """Raise :class:`InvalidInputError` naming ``where`` (e.g. ``"samples[3]"``) unless ``s`` is
    a well-formed :class:`ProfileSample`: a non-empty placement of GPU counts with at least one
    GPU, positive integer micro-batch and accumulation steps, finite times >= 0, step time > 0.
    """
    if not isinstance(s, ProfileSample):
        raise InvalidInputError(f"{where} is not a ProfileSample: {s!r}", field=where)
    if (
        not isinstance(s.placement, tuple)
        or not s.placement
        or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in s.placement)
        or sum(s.placement) < 1
    ):
        raise InvalidInputError(
            f"{where}.placement must be a non-empty tuple of GPU counts (>= 0, at least one GPU), "
            f"got {s.placement!r}",
            field=f"{where}.placement",
        )
    for name in ("local_bsz", "accum_steps"):
        value = getattr(s, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(
                f"{where}.{name} must be a positive integer, got {value!r}", field=f"{where}.{name}"
            )
    for name in ("step_time_s", "sync_time_s"):
        value = getattr(s, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InvalidInputError(
                f"{where}.{name} must be a finite number >= 0, got {value!r}",
                field=f"{where}.{name}",
            )
    if s.step_time_s <= 0:
        raise InvalidInputError(
            f"{where}.step_time_s must be > 0, got {s.step_time_s!r}", field=f"{where}.step_time_s"
        )


# --------------------------------------------------------------------------------------------
# Throughput model
# --------------------------------------------------------------------------------------------


def _sync_time(p: np.ndarray, num_nodes: np.ndarray, num_gpus: np.ndarray) -> np.ndarray:
    """Gradient sync time; ``p`` is ``PerfParams.as_array()`` (may be a float array)."""
    log_k = np.log2(np.maximum(num_gpus, 1))
    intra = p[2] + p[3] * log_k
    inter = p[4] + p[5] * log_k
    t = np.where(num_nodes > 1, inter, intra)
    return np.where(num_gpus > 1, t, 0.0)


def _iter_time(
    p: np.ndarray,
    num_nodes: np.ndarray,
    num_gpus: np.ndarray,
    local_bsz: np.ndarray,
    accum_steps: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(iteration time, sync time) for parameter vector ``p``."""
    t_c = p[0] + p[1] * local_bsz
    t_s = _sync_time(p, num_nodes, num_gpus)
    g = p[6]
    # (a^g + b^g)^(1/g) computed stably as m * (1 + (x/m)^g)^(1/g), m = max(a, b).
    hi = np.maximum(t_c, t_s)
    lo = np.minimum(t_c, t_s)
    ratio = np.divide(lo, hi, out=np.zeros_like(hi, dtype=float), where=hi > 0)
    last = hi * (1.0 + ratio**g) ** (1.0 / g)
    return (accum_steps - 1) * t_c + last, t_s


def predict_step_time_s(
    perf: PerfParams,
    num_nodes: ArrayLike,
    num_gpus: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike,
) -> np.ndarray:
    """Seconds per iteration that ``perf`` predicts (broadcasting); the throughput model of the
    module docstring, without the statistical side (see :meth:`GoodputModel.step_time_s`)."""
    t, _ = _iter_time(
        perf.as_array(),
        np.asarray(num_nodes),
        np.asarray(num_gpus),
        np.asarray(local_bsz, dtype=float),
        np.asarray(accum_steps, dtype=float),
    )
    return t


# --------------------------------------------------------------------------------------------
# Statistical efficiency and learning-rate scaling
# --------------------------------------------------------------------------------------------


def efficiency(grad: GradParams, init_batch_size: float, batch_size: ArrayLike) -> np.ndarray:
    """Statistical efficiency of total batch ``batch_size`` relative to ``init_batch_size``.

    ``(phi + M0) / (phi + M)``; equals 1 at ``M0``, decreases in ``M``, never below ``M0 / M``.
    ``grad_sqr <= 0`` gives the upper bound 1 (noise-dominated), never an exception.
    """
    m = np.asarray(batch_size, dtype=float)
    phi = grad.noise_scale(init_batch_size)
    if math.isinf(phi):
        return np.ones_like(m)
    with np.errstate(divide="ignore", invalid="ignore"):
        eff = (phi + init_batch_size) / (phi + m)
    return np.where(m > 0, eff, 0.0)


def adascale_gain(grad: GradParams, init_batch_size: float, batch_size: ArrayLike) -> np.ndarray:
    """AdaScale gain: progress (in ``M0``-iterations) made by one iteration at batch ``M``.

    ``(grad_var + grad_sqr) / (grad_var / r + grad_sqr)`` with ``r = M / M0``; equal to
    ``r * efficiency(M)``; 1 at ``M0``, between 1 and ``r`` for ``M >= M0``.
    """
    m = np.asarray(batch_size, dtype=float)
    return m / float(init_batch_size) * efficiency(grad, init_batch_size, m)


class OptimizerKind(StrEnum):
    """How the learning rate is scaled with the batch size."""

    SGD = "sgd"  # AdaScale: lr x gain
    ADAM = "adam"  # square-root scaling: lr x sqrt(M / M0)
    ADAMW = "adamw"


def lr_scale(
    kind: OptimizerKind | str, grad: GradParams, init_batch_size: float, batch_size: ArrayLike
) -> np.ndarray:
    """Learning-rate multiplier for total batch ``batch_size`` (1 at ``M0``)."""
    kind = OptimizerKind(kind)
    m = np.asarray(batch_size, dtype=float)
    if kind is OptimizerKind.SGD:
        return adascale_gain(grad, init_batch_size, m)
    return np.sqrt(m / float(init_batch_size))


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchOptimum:
    """Best batch configuration per allocation (arrays of the allocations' broadcast shape).

    ``goodput`` is 0 (and the sizes 0) where no configuration fits the job's limits.
    """

    goodput: np.ndarray  # M0-equivalent samples per second
    throughput: np.ndarray  # samples per second
    efficiency: np.ndarray
    batch_size: np.ndarray  # total batch per iteration = num_gpus * local_bsz * accum_steps
    local_bsz: np.ndarray
    accum_steps: np.ndarray


#: Candidate total batch sizes per allocation in :meth:`GoodputModel.optimize` (geometric grid).
N_TOTAL_CANDIDATES = 48


@functools.lru_cache(maxsize=1024)
def _total_grid(lo: int, hi: int) -> np.ndarray:
    """The candidate total batch sizes between ``lo`` and ``hi`` (read-only, shared)."""
    grid = np.unique(np.round(np.geomspace(lo, hi, N_TOTAL_CANDIDATES))).astype(float)
    grid.setflags(write=False)
    return grid


class GoodputModel:
    """A job's goodput as a function of allocation and batch configuration."""

    def __init__(self, perf: PerfParams, grad: GradParams, limits: BatchLimits) -> None:
        self.perf = perf
        self.grad = grad
        self.limits = limits
        self._p = perf.as_array()
        self._p.flags.writeable = False
        self._total_grid = _total_grid(limits.init_batch_size, limits.max_batch_size)

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        return (
            isinstance(other, GoodputModel)
            and self.perf == other.perf
            and self.grad == other.grad
            and self.limits == other.limits
        )

    def __hash__(self) -> int:
        return hash((self.perf, self.grad, self.limits))

    @property
    def perf_array(self) -> np.ndarray:
        """``perf.as_array()``, computed once (read-only)."""
        return self._p

    def __repr__(self) -> str:
        return f"GoodputModel({self.perf!r}, {self.grad!r}, {self.limits!r})"

    def step_time_s(
        self,
        num_nodes: ArrayLike,
        num_gpus: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> np.ndarray:
        """Predicted seconds per iteration (broadcasting)."""
        t, _ = _iter_time(
            self._p,
            np.asarray(num_nodes),
            np.asarray(num_gpus),
            np.asarray(local_bsz, dtype=float),
            np.asarray(accum_steps, dtype=float),
        )
        return t

    def sync_time_s(self, num_nodes: ArrayLike, num_gpus: ArrayLike) -> np.ndarray:
        """Predicted gradient-sync seconds per iteration (broadcasting)."""
        return _sync_time(self._p, np.asarray(num_nodes), np.asarray(num_gpus))

    def throughput(
        self,
        num_nodes: ArrayLike,
        num_gpus: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> np.ndarray:
        """Samples per second (0 where ``num_gpus`` is 0)."""
        k = np.asarray(num_gpus, dtype=float)
        m = np.asarray(local_bsz, dtype=float)
        s = np.asarray(accum_steps, dtype=float)
        t = self.step_time_s(num_nodes, num_gpus, m, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where((k > 0) & (t > 0), k * m * s / t, 0.0)

    def efficiency(self, batch_size: ArrayLike) -> np.ndarray:
        return efficiency(self.grad, self.limits.init_batch_size, batch_size)

    def goodput(
        self,
        num_nodes: ArrayLike,
        num_gpus: ArrayLike,
        local_bsz: ArrayLike,
        accum_steps: ArrayLike,
    ) -> np.ndarray:
        """Throughput x efficiency, in M0-equivalent samples per second."""
        k = np.asarray(num_gpus, dtype=float)
        m = np.asarray(local_bsz, dtype=float)
        s = np.asarray(accum_steps, dtype=float)
        return self.throughput(num_nodes, k, m, s) * self.efficiency(k * m * s)

    def optimize(
        self,
        num_nodes: ArrayLike,
        num_gpus: ArrayLike,
        *,
        fixed_batch_size: int | None = None,
    ) -> BatchOptimum:
        """Best (batch size, local batch, accumulation steps) per allocation, vectorised.

        Searches total batch sizes on a geometric grid over ``[init_batch_size,
        max_batch_size]``; for each, the fewest accumulation steps (<= ``max_accum_steps``) whose
        micro-batch fits ``max_local_bsz``, and the local batch just below and above the target
        (within ``[min_local_bsz, max_local_bsz]``); returns the goodput maximiser. With
        ``fixed_batch_size`` the total is that value, rounded up to a multiple of
        ``num_gpus * accum_steps`` when it does not divide. Allocations with
        no feasible configuration (or no GPU) get zeros.
        """
        n_arr, k_arr = np.broadcast_arrays(
            np.asarray(num_nodes, dtype=np.int64), np.asarray(num_gpus, dtype=np.int64)
        )
        shape = n_arr.shape
        n = n_arr.reshape(-1, 1, 1).astype(float)
        k = k_arr.reshape(-1, 1, 1).astype(float)
        lim = self.limits
        kk = np.maximum(k, 1.0)
        if fixed_batch_size is None:
            # Candidate totals on a geometric grid; for each, the fewest accumulation steps that
            # fit the micro-batch in memory (more micro-steps only add per-step overhead), and
            # the local batch rounded down and up.
            target = self._total_grid.reshape(1, -1, 1)
        else:
            if fixed_batch_size < 1:
                raise InvalidInputError("fixed_batch_size must be >= 1", field="fixed_batch_size")
            target = np.full((1, 1, 1), float(fixed_batch_size))
        s = np.clip(np.ceil(target / (kk * lim.max_local_bsz)), 1, lim.max_accum_steps)
        per_gpu = target / (kk * s)
        m = np.concatenate(np.broadcast_arrays(np.floor(per_gpu), np.ceil(per_gpu)), axis=2)
        s = np.broadcast_to(s, per_gpu.shape)
        s = np.concatenate([s, s], axis=2)
        m = np.clip(m, lim.min_local_bsz, lim.max_local_bsz)
        total = k * m * s
        if fixed_batch_size is None:
            ok = (total >= lim.init_batch_size) & (total <= lim.max_batch_size)
        else:
            ok = total >= fixed_batch_size
        ok &= k > 0
        t, _ = _iter_time(self._p, n, k, m, s)
        with np.errstate(divide="ignore", invalid="ignore"):
            thr = np.where(ok, total / t, 0.0)
        eff = self.efficiency(total)
        good = np.where(ok, thr * eff, -1.0)
        flat = good.reshape(good.shape[0], -1)
        best = np.argmax(flat, axis=1)
        rows = np.arange(flat.shape[0])

        def pick(a: np.ndarray) -> np.ndarray:
            full = np.broadcast_to(a, good.shape).reshape(good.shape[0], -1)
            return full[rows, best]

        feasible = flat[rows, best] >= 0
        zero = np.zeros(flat.shape[0])
        return BatchOptimum(
            goodput=np.where(feasible, pick(good), 0.0).reshape(shape),
            throughput=np.where(feasible, pick(thr), 0.0).reshape(shape),
            efficiency=np.where(feasible, pick(eff), 0.0).reshape(shape),
            batch_size=np.where(feasible, pick(total), zero).astype(np.int64).reshape(shape),
            local_bsz=np.where(feasible, pick(m), zero).astype(np.int64).reshape(shape),
            accum_steps=np.where(feasible, pick(s), zero).astype(np.int64).reshape(shape),
        )


# --------------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------------

# The fit objective's bounds and weights (shared with autoscaler.model.goodput_batch, whose batched
# fit must reproduce this one).
LOG_FLOOR = math.log(1e-8)
LOG_CEIL = math.log(1e4)
GAMMA_MAX = 10.0
PRIOR_WEIGHT = 1e-5  # weak: pulls only what the data cannot identify
SYNC_FLOOR_FRAC = 1e-3  # sync times below this fraction of the step time carry no information


def optimistic_internode(model: GoodputModel) -> GoodputModel:
    """``model`` with its inter-node sync taken as its intra-node sync: the optimistic end of
    what a job that never ran on several nodes can expect there."""
    perf = replace(model.perf, alpha_r=model.perf.alpha_n, beta_r=model.perf.beta_n)
    return GoodputModel(perf, model.grad, model.limits)


def default_prior(samples: Sequence[ProfileSample]) -> PerfParams:
    """A prior scaled to the data: 10% fixed compute cost, no sync, gamma = 1."""
    s0 = min(samples, key=lambda s: (s.num_gpus, s.local_bsz))
    t_c = max(s0.step_time_s - s0.sync_time_s, 0.5 * s0.step_time_s) / s0.accum_steps
    return PerfParams(
        alpha_c=0.1 * t_c,
        beta_c=0.9 * t_c / s0.local_bsz,
        alpha_n=1e-6,
        beta_n=1e-6,
        alpha_r=1e-6,
        beta_r=1e-6,
        gamma=1.0,
    )


def fit_perf_params(
    samples: Sequence[ProfileSample], prior: PerfParams | None = None
) -> PerfParams:
    """Fit ``PerfParams`` to profile samples; deterministic, fast, usable from one sample.

    Minimises the mean squared log-error of iteration times plus that of sync times (multi-GPU
    samples), with a weak prior on the log-parameters. What the data cannot identify is pinned:

    * no multi-GPU sample: sync terms stay at ~0 and gamma at 1 (optimistic scaling, which the
      policy bounds by exploring at most 2x the largest profiled GPU count);
    * no multi-node sample: inter-node sync equals intra-node sync;
    * inter-node sync is never faster than intra-node (``alpha_r >= alpha_n``,
      ``beta_r >= beta_n``), enforced by fitting non-negative increments.

    Raises ``InvalidInputError`` naming the offending field for empty input or NaN/inf/negative
    values, before any optimisation.
    """
    if prior is not None and not isinstance(prior, PerfParams):
        raise InvalidInputError("prior must be PerfParams or None", field="prior")
    samples = list(samples)
    if not samples:
        raise InvalidInputError("at least one profile sample is needed", field="samples")
    for i, s in enumerate(samples):
        validate_sample(s, f"samples[{i}]")
    from scipy.optimize import minimize  # lazy: scipy import costs ~0.1 s

    prior_given = prior
    prior = prior or default_prior(samples)
    nodes = np.array([s.num_nodes for s in samples], dtype=float)
    gpus = np.array([s.num_gpus for s in samples], dtype=float)
    lbsz = np.array([s.local_bsz for s in samples], dtype=float)
    accum = np.array([s.accum_steps for s in samples], dtype=float)
    step = np.array([s.step_time_s for s in samples], dtype=float)
    sync = np.array([s.sync_time_s for s in samples], dtype=float)
    log_step = np.log(step)
    sync_mask = (gpus > 1) & (sync > SYNC_FLOOR_FRAC * step)
    log_sync = np.log(np.where(sync_mask, sync, 1.0))
    has_multi_gpu = bool(np.any(gpus > 1))
    has_multi_node = bool(np.any(nodes > 1))

    # Free vector: log alpha_c, log beta_c, log alpha_n, log beta_n, log d_alpha_r, log d_beta_r,
    # gamma. Pinned entries are removed from the optimisation.
    pv = prior.as_array()
    tiny = 1e-8
    x_prior = np.array(
        [
            math.log(max(pv[0], tiny)),
            math.log(max(pv[1], tiny)),
            math.log(max(pv[2], tiny)),
            math.log(max(pv[3], tiny)),
            math.log(max(pv[4] - pv[2], tiny)),
            math.log(max(pv[5] - pv[3], tiny)),
            pv[6],
        ]
    )
    free = np.array(
        [True, True, has_multi_gpu, has_multi_gpu, has_multi_node, has_multi_node, has_multi_gpu]
    )
    x_full = x_prior.copy()
    if not has_multi_gpu:
        x_full[2] = x_full[3] = x_full[4] = x_full[5] = LOG_FLOOR
        x_full[6] = 1.0
    if not has_multi_node:
        x_full[4] = x_full[5] = LOG_FLOOR
    if prior_given is None:
        # Start (and centre the weak prior on) sync terms scaled to the measured sync times:
        # starting at the floor would leave them stuck there (flat in log space).
        intra = (gpus > 1) & (nodes == 1)
        inter = nodes > 1
        any_sync = float(np.mean(sync[gpus > 1])) if has_multi_gpu else 0.0
        intra_sync = float(np.mean(sync[intra])) if intra.any() else 0.5 * any_sync
        inter_sync = float(np.mean(sync[inter])) if inter.any() else intra_sync
        if has_multi_gpu:
            x_full[2] = x_full[3] = math.log(max(0.25 * intra_sync, tiny))
            x_full[6] = 1.5
        if has_multi_node:
            x_full[4] = x_full[5] = math.log(max(0.25 * max(inter_sync - intra_sync, 0.0), 1e-6))
    bounds_all = [(LOG_FLOOR, LOG_CEIL)] * 6 + [(1.0, GAMMA_MAX)]
    idx = np.flatnonzero(free)
    prior_center = x_full[idx].copy()
    scale = np.array([1.0] * 6 + [0.5])[idx]

    def unpack(x: np.ndarray) -> np.ndarray:
        full = x_full.copy()
        full[idx] = x
        e = np.exp(full[:6])
        return np.array([e[0], e[1], e[2], e[3], e[2] + e[4], e[3] + e[5], full[6]])

    n_sync = max(int(sync_mask.sum()), 1)
    log_k = np.log2(gpus)
    multi = gpus > 1
    inter = multi & (nodes > 1)
    lo_b = np.array([bounds_all[i][0] for i in idx])
    hi_b = np.array([bounds_all[i][1] for i in idx])

    def loss_and_grad(x: np.ndarray) -> tuple[float, np.ndarray]:
        # Analytic gradient: ~10x fewer evaluations than finite differences.
        full = x_full.copy()
        full[idx] = x
        e = np.exp(full[:6])
        g = full[6]
        t_c = e[0] + e[1] * lbsz
        t_s = np.where(multi, e[2] + e[3] * log_k + np.where(inter, e[4] + e[5] * log_k, 0.0), 0.0)
        hi = np.maximum(t_c, t_s)
        ratio = np.minimum(t_c, t_s) / hi
        last = hi * (1.0 + ratio**g) ** (1.0 / g)
        t = (accum - 1.0) * t_c + last
        rc = t_c / last
        rs = t_s / last
        err = np.log(t) - log_step
        w1 = 2.0 * err / (t * len(t))  # dL/dt
        with np.errstate(divide="ignore", invalid="ignore"):
            log_ts = np.log(np.where(multi, t_s, 1.0))
            dl_dts_sync = np.where(sync_mask, 2.0 * (log_ts - log_sync) / (t_s * n_sync), 0.0)
            rs_g1 = np.where(t_s > 0, rs ** (g - 1.0), 0.0)
            d_last_dg = (last / g) * (
                rc**g * np.log(t_c) + np.where(t_s > 0, rs**g * log_ts, 0.0) - np.log(last)
            )
        dt_dtc = (accum - 1.0) + rc ** (g - 1.0)
        dl_dtc = w1 * dt_dtc
        dl_dts = w1 * rs_g1 + dl_dts_sync
        grad_full = np.array(
            [
                np.sum(dl_dtc) * e[0],
                np.sum(dl_dtc * lbsz) * e[1],
                np.sum(np.where(multi, dl_dts, 0.0)) * e[2],
                np.sum(np.where(multi, dl_dts * log_k, 0.0)) * e[3],
                np.sum(np.where(inter, dl_dts, 0.0)) * e[4],
                np.sum(np.where(inter, dl_dts * log_k, 0.0)) * e[5],
                np.sum(w1 * d_last_dg),
            ]
        )
        val = float(np.mean(err * err))
        if sync_mask.any():
            e2 = np.where(sync_mask, log_ts - log_sync, 0.0)
            val += float(np.sum(e2 * e2) / n_sync)
        d = (x - prior_center) * scale
        val += PRIOR_WEIGHT * float(np.dot(d, d))
        grad = grad_full[idx] + 2.0 * PRIOR_WEIGHT * d * scale
        return val, grad

    res = minimize(
        loss_and_grad,
        np.clip(x_full[idx], lo_b, hi_b),
        jac=True,
        method="L-BFGS-B",
        bounds=list(zip(lo_b, hi_b, strict=True)),
        options={"maxiter": 500, "ftol": 1e-10, "gtol": 1e-8},
    )
    x_best = res.x if np.all(np.isfinite(res.x)) else x_full[idx]
    p = unpack(np.clip(x_best, lo_b, hi_b))
    return PerfParams(
        alpha_c=float(p[0]),
        beta_c=float(p[1]),
        alpha_n=float(p[2]),
        beta_n=float(p[3]),
        alpha_r=float(max(p[4], p[2])),
        beta_r=float(max(p[5], p[3])),
        gamma=float(min(max(p[6], 1.0), GAMMA_MAX)),
    )
