"""The goodput model vectorised across jobs: best batch configurations and fits for many jobs.

A policy round evaluates (and, when profiles changed, refits) up to thousands of jobs; one
Python call per job costs more than the round's budget. This module does both for all jobs in
a few numpy calls per step. It builds on :mod:`autoscaler.model.goodput` (same model, same
vocabulary, same units), which never imports it.

Contracts:

* :func:`optimize_many` is the exact batched equivalent of :meth:`GoodputModel.optimize`: for
  job ``j`` and allocation ``a`` its result equals that of
  ``GoodputModel(perf[j], grad[j], limits[j]).optimize(num_nodes[j, a], num_gpus[j, a],
  fixed_batch_size=...)``: the same candidate totals (padded per job to a common width with
  never-feasible entries), each value computed by the same floating-point operations on the
  same operands (numpy's ``x ** 2`` and ``x ** 0.5`` fast paths included), and ties broken the
  same way (the first maximiser in the scalar candidate order). Sizes are equal and goodputs
  equal to the last bit (tests: property test at ``rtol=1e-12``, and bit-exact on a random
  batch; the benchmark: 0.0 relative difference over 200 jobs x 40 allocations).
* :func:`fit_perf_params_many` minimises, for every job, the objective that
  :func:`autoscaler.model.goodput.fit_perf_params` minimises: mean squared log-error of step times,
  plus that of sync times over multi-GPU samples whose sync exceeds 1e-3 of the step, plus the
  weak prior centred on the same data-derived cold start; the same pinning rules (no multi-GPU
  sample: sync at the floor and gamma 1; no multi-node sample: inter-node = intra-node), the
  same non-negative inter-node increments and the same bounds. The solver is batched: a
  projected, damped Newton method (exact analytic gradient and Hessian; Levenberg-Marquardt
  style damping on the Gauss-Newton diagonal) with one stacked 7x7 solve per iteration for all
  jobs still moving, from two gamma starts per job. It is a different local optimiser from the
  scalar L-BFGS-B, so the optimum is not the scalar one bit for bit; :func:`fit_objective_many`
  evaluates the objective so that fits can be compared on equal terms.
* Both validate their inputs before computing and raise
  :class:`~autoscaler.errors.InvalidInputError` naming the offending field; both are
  deterministic (same inputs, same bits out).

Measured by ``benchmarks/goodput_batch.py`` (seeded; one core, ``OPENBLAS_NUM_THREADS=1``;
medians; times are the range over three runs on a shared 2-core machine, so indicative only):

* ``optimize_many``, 2,000 jobs x 40 allocations (7.7 M candidates): 0.13-0.16 s; 64 jobs x
  40: 7-8 ms; peak traced memory 16 MiB.
* ``fit_perf_params_many``, 16 trace samples per job: 2,000 jobs cold 0.59-0.62 s,
  warm-started after one more sample 0.17 s; 64 jobs cold 31-39 ms, warm 12-16 ms (one scalar
  ``fit_perf_params`` of such a profile: about 5 ms, so 2,000 of them take about 10 s).
* Quality against ``fit_perf_params`` on 840 trace profiles (20 per application and size 1, 2,
  3, 5, 8, 16, 32): objective within 1% (or 1e-4) in all of them, worst +0.03%, lower by more
  than 1% in 0.2%; warm-started after one more sample, within 1% in all, worst +1e-13. Mean
  step-time MAPE on all of an application's rows: batched minus scalar between -0.0058 and
  -0.0008 per application (the batched fit goes further along the directions that only the
  prior sees, which one-sample profiles are mostly made of).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import numpy as np
from numpy.typing import ArrayLike

from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import (
    GAMMA_MAX,
    LOG_CEIL,
    LOG_FLOOR,
    N_TOTAL_CANDIDATES,
    PRIOR_WEIGHT,
    SYNC_FLOOR_FRAC,
    BatchOptimum,
    GoodputModel,
    PerfParams,
    ProfileSample,
    validate_sample,
)

__all__ = [
    "JobArrays",
    "fit_objective_many",
    "fit_perf_params_many",
    "optimize_many",
]


_PERF_NAMES = ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma")
_LIMIT_NAMES = (
    "init_batch_size",
    "max_batch_size",
    "max_local_bsz",
    "min_local_bsz",
    "max_accum_steps",
)
# Elements per (jobs x allocations x candidates) working array of optimize_many: 6 reused float
# buffers of 1 MiB, small enough to stay in cache.
_CHUNK_ELEMENTS = 1 << 17


# --------------------------------------------------------------------------------------------
# Jobs as arrays
# --------------------------------------------------------------------------------------------


def _int_array(value: ArrayLike, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or not (
        np.issubdtype(arr.dtype, np.integer)
        or (np.issubdtype(arr.dtype, np.floating) and bool(np.all(np.isfinite(arr))))
    ):
        raise InvalidInputError(f"{name} must hold integers, got dtype {arr.dtype}", field=name)
    if np.issubdtype(arr.dtype, np.floating) and not np.array_equal(arr, np.round(arr)):
        bad = int(np.flatnonzero(arr.ravel() != np.round(arr.ravel()))[0])
        raise InvalidInputError(
            f"{name} must hold integers, got {arr.ravel()[bad]!r}", field=f"{name}[{bad}]"
        )
    if shape is not None and arr.shape != shape:
        raise InvalidInputError(f"{name} must have shape {shape}, got {arr.shape}", field=name)
    return arr.astype(np.int64)


@dataclass(frozen=True, eq=False)
class JobArrays:
    """Many jobs' goodput models as arrays (``J`` jobs, row ``j`` = job ``j``).

    ``perf`` is ``(J, 7)``, rows ``PerfParams.as_array()``; ``grad`` is ``(J, 2)``, columns
    ``grad_sqr, grad_var``; the five limits are ``(J,)`` integer arrays with the meaning of
    :class:`~autoscaler.model.goodput.BatchLimits`. The constructor converts (to float64 and int64
    copies) and validates with the rules of ``PerfParams``, ``GradParams`` and ``BatchLimits``;
    an error names the array and the job, e.g. ``field="perf[3].gamma"``.
    """

    perf: np.ndarray
    grad: np.ndarray
    init_batch_size: np.ndarray
    max_batch_size: np.ndarray
    max_local_bsz: np.ndarray
    min_local_bsz: np.ndarray
    max_accum_steps: np.ndarray

    def __post_init__(self) -> None:
        perf = np.array(self.perf, dtype=float)
        if perf.ndim != 2 or perf.shape[1] != 7:
            raise InvalidInputError(f"perf must have shape (J, 7), got {perf.shape}", field="perf")
        n_jobs = perf.shape[0]
        grad = np.array(self.grad, dtype=float)
        if grad.shape != (n_jobs, 2):
            raise InvalidInputError(
                f"grad must have shape ({n_jobs}, 2), got {grad.shape}", field="grad"
            )
        bad_perf = ~np.isfinite(perf) | (perf < 0)
        bad_perf[:, 6] |= perf[:, 6] < 1.0
        if bad_perf.any():
            j, c = (int(v) for v in np.argwhere(bad_perf)[0])
            rule = "a finite number >= 1" if c == 6 else "a finite number >= 0"
            raise InvalidInputError(
                f"perf[{j}].{_PERF_NAMES[c]} must be {rule}, got {perf[j, c]!r}",
                field=f"perf[{j}].{_PERF_NAMES[c]}",
            )
        no_compute = perf[:, 0] + perf[:, 1] <= 0
        if no_compute.any():
            j = int(np.flatnonzero(no_compute)[0])
            raise InvalidInputError(
                f"perf[{j}]: compute time must be positive", field=f"perf[{j}].beta_c"
            )
        bad_grad = ~np.isfinite(grad)
        if bad_grad.any():
            j, c = (int(v) for v in np.argwhere(bad_grad)[0])
            name = ("grad_sqr", "grad_var")[c]
            raise InvalidInputError(
                f"grad[{j}].{name} must be a finite number, got {grad[j, c]!r}",
                field=f"grad[{j}].{name}",
            )
        limits = {}
        for name in _LIMIT_NAMES:
            arr = _int_array(getattr(self, name), name, (n_jobs,))
            if np.any(arr < 1):
                j = int(np.flatnonzero(arr < 1)[0])
                raise InvalidInputError(
                    f"{name}[{j}] must be a positive integer, got {arr[j]}", field=f"{name}[{j}]"
                )
            limits[name] = arr
        for big, small in (
            ("max_batch_size", "init_batch_size"),
            ("max_local_bsz", "min_local_bsz"),
        ):
            wrong = limits[big] < limits[small]
            if wrong.any():
                j = int(np.flatnonzero(wrong)[0])
                raise InvalidInputError(f"{big}[{j}] must be >= {small}[{j}]", field=f"{big}[{j}]")
        object.__setattr__(self, "perf", perf)
        object.__setattr__(self, "grad", grad)
        for name, arr in limits.items():
            object.__setattr__(self, name, arr)

    @classmethod
    def from_models(cls, models: Sequence[GoodputModel]) -> JobArrays:
        """The arrays of ``models``, in order."""
        models = list(models)
        for j, m in enumerate(models):
            if not isinstance(m, GoodputModel):
                raise InvalidInputError(
                    f"models[{j}] is not a GoodputModel: {m!r}", field=f"models[{j}]"
                )
        n_jobs = len(models)
        return cls(
            perf=np.array([m.perf_array for m in models], dtype=float).reshape(n_jobs, 7),
            grad=np.array(
                [(m.grad.grad_sqr, m.grad.grad_var) for m in models], dtype=float
            ).reshape(n_jobs, 2),
            init_batch_size=np.array([m.limits.init_batch_size for m in models], dtype=np.int64),
            max_batch_size=np.array([m.limits.max_batch_size for m in models], dtype=np.int64),
            max_local_bsz=np.array([m.limits.max_local_bsz for m in models], dtype=np.int64),
            min_local_bsz=np.array([m.limits.min_local_bsz for m in models], dtype=np.int64),
            max_accum_steps=np.array([m.limits.max_accum_steps for m in models], dtype=np.int64),
        )

    def take(self, rows: ArrayLike) -> JobArrays:
        """The jobs at ``rows`` (indices, repeats allowed), in that order."""
        idx = np.asarray(rows, dtype=np.int64)
        return JobArrays(
            perf=self.perf[idx],
            grad=self.grad[idx],
            init_batch_size=self.init_batch_size[idx],
            max_batch_size=self.max_batch_size[idx],
            max_local_bsz=self.max_local_bsz[idx],
            min_local_bsz=self.min_local_bsz[idx],
            max_accum_steps=self.max_accum_steps[idx],
        )

    @property
    def num_jobs(self) -> int:
        return int(self.perf.shape[0])


# --------------------------------------------------------------------------------------------
# Best batch configuration, many jobs at once
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _total_grid(init_batch_size: int, max_batch_size: int) -> np.ndarray:
    """The candidate totals of ``GoodputModel`` for these limits (computed the same way)."""
    grid = np.unique(
        np.round(np.geomspace(init_batch_size, max_batch_size, N_TOTAL_CANDIDATES))
    ).astype(float)
    grid.flags.writeable = False
    return grid


def _power(base: np.ndarray, exponent: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``base ** exponent`` into ``out`` (not ``base``), bit-equal to the scalar model.

    ``exponent`` is per job, shape ``(Jc, 1, 1, 1)``. numpy computes ``x ** 2.0`` and
    ``x ** 0.5`` with a scalar exponent as ``square`` and ``sqrt``, whose last bit can differ
    from the general ``power`` loop that an array exponent takes; those jobs are done the
    scalar way. ``x ** 1.0`` is ``x`` exactly (a correctly rounded power of an exact result),
    and most fits have ``gamma = 1`` (no overlap): those jobs are copied, not powered. The
    general loop runs only on the other jobs.
    """
    flat = exponent.reshape(-1)
    general = np.ones(flat.shape, dtype=bool)
    for special, fn in ((1.0, None), (2.0, np.square), (0.5, np.sqrt)):
        hit = flat == special
        if hit.any():
            general &= ~hit
            rows = np.flatnonzero(hit)
            out[rows] = base[rows] if fn is None else fn(base[rows])
    if general.all():
        np.power(base, exponent, out=out)
    elif general.any():
        rows = np.flatnonzero(general)
        out[rows] = np.power(base[rows], exponent[rows])
    return out


class _Workspace:
    """Reused flat buffers for ``_optimize_chunk``: fresh multi-MiB arrays per operation cost
    more in page faults than the arithmetic."""

    def __init__(self, elements: int) -> None:
        self.elements = elements
        self.full = [np.empty(elements) for _ in range(6)]
        self.half = [np.empty(elements // 2 + 1) for _ in range(2)]
        self.mask = [np.empty(elements, dtype=bool) for _ in range(2)]

    @staticmethod
    def view(buf: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return buf[: math.prod(shape)].reshape(shape)


_LOCAL = threading.local()


def _workspace(elements: int) -> _Workspace:
    """This thread's workspace of at least ``elements``, kept between calls: a fresh one costs
    its page faults again on every call, most of a small call's time."""
    work: _Workspace | None = getattr(_LOCAL, "work", None)
    if work is None or work.elements < elements:
        work = _LOCAL.work = _Workspace(elements)
    return work


def _optimize_chunk(
    work: _Workspace,
    perf: np.ndarray,
    phi: np.ndarray,
    init_bs: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    min_local: np.ndarray,
    max_local: np.ndarray,
    max_accum: np.ndarray,
    target: np.ndarray,
    nodes: np.ndarray,
    gpus: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """``GoodputModel.optimize`` for a chunk of ``Jc`` jobs; shapes ``(Jc, ...)``.

    Working arrays are ``(Jc, A, 2, G)``: allocation, micro-batch rounded down or up, candidate
    total (``G`` of them, NaN-padded: a NaN candidate is never ``ok``). The scalar model orders
    candidates ``(G, 2)``; the first maximiser is taken in that order. Every value is computed by
    the scalar model's operations on the same operands; in-place forms only swap the operands of
    ``+`` and ``*`` (exact in IEEE arithmetic) and skip values that are never reported.
    """

    def col(a: np.ndarray) -> np.ndarray:
        return a.reshape(-1, 1, 1, 1)

    n_jobs, n_alloc = nodes.shape
    width = target.shape[1]
    full_shape = (n_jobs, n_alloc, 2, width)
    half_shape = (n_jobs, n_alloc, 1, width)
    b_m, b_total, b_tc, b_hi, b_last, b_t = (work.view(b, full_shape) for b in work.full)
    h_s, h_tmp = (work.view(b, half_shape) for b in work.half)
    ok, ok2 = (work.view(b, full_shape) for b in work.mask)

    n = nodes.astype(float)[:, :, None, None]
    k = gpus.astype(float)[:, :, None, None]
    kk = np.maximum(k, 1.0)
    tgt = target[:, None, None, :]
    with np.errstate(invalid="ignore"):  # NaN padding
        # Fewest accumulation steps that fit the micro-batch, then the micro-batch down and up.
        s = np.divide(tgt, kk * col(max_local), out=h_s)
        np.ceil(s, out=s)
        np.clip(s, 1, col(max_accum), out=s)
        per_gpu = np.multiply(kk, s, out=h_tmp)
        np.divide(tgt, per_gpu, out=per_gpu)
        m = b_m
        np.floor(per_gpu, out=m[:, :, :1])
        np.ceil(per_gpu, out=m[:, :, 1:])
        np.clip(m, col(min_local), col(max_local), out=m)
        total = np.multiply(k, m, out=b_total)
        total *= s
        # Within the limits; 0 GPUs (total 0 < lower, lower >= 1) and padding (NaN) fail.
        np.greater_equal(total, col(lower), out=ok)
        ok &= np.less_equal(total, col(upper), out=ok2)
        # Iteration time (goodput._iter_time): compute part per candidate, sync per allocation.
        p = perf[:, :, None, None, None]  # (Jc, 7, 1, 1, 1): p[:, i] is (Jc, 1, 1, 1)
        t_c = np.multiply(p[:, 1], m, out=b_tc)
        t_c += p[:, 0]
        log_k = np.log2(np.maximum(k, 1))
        intra = p[:, 2] + p[:, 3] * log_k
        inter = p[:, 4] + p[:, 5] * log_k
        t_s = np.where(k > 1, np.where(n > 1, inter, intra), 0.0)
        hi = np.maximum(t_c, t_s, out=b_hi)
        # t_c > 0 (PerfParams: alpha_c + beta_c > 0, m >= 1), so hi > 0: a plain division.
        ratio = np.minimum(t_c, t_s, out=b_last)
        ratio /= hi
        g = p[:, 6]
        powered = _power(ratio, g, out=b_t)
        powered += 1.0
        last = _power(powered, 1.0 / g, out=b_last)
        last *= hi
        t = np.multiply(np.subtract(s, 1, out=h_tmp), t_c, out=b_t)
        t += last
        # Statistical efficiency (goodput.efficiency), phi = inf meaning efficiency 1; where the
        # scalar model zeroes it (no GPU), the candidate is not ``ok`` and never reported.
        ph = col(phi)
        eff = np.add(ph, total, out=b_tc)
    with np.errstate(divide="ignore", invalid="ignore"):  # only where not ``ok``
        np.divide(ph + col(init_bs), eff, out=eff)
        inf_phi = np.flatnonzero(np.isinf(phi))
        if inf_phi.size:
            eff[inf_phi] = 1.0
        good = np.divide(total, t, out=b_hi)
        good *= eff
    np.copyto(good, -1.0, where=np.logical_not(ok, out=ok2))
    # First maximiser in the scalar order (g, down/up): per rounding plane the first (lowest
    # g), then between the planes the larger value, on a tie the lower index g * 2 + plane.
    g_down = np.argmax(good[:, :, 0], axis=2)
    g_up = np.argmax(good[:, :, 1], axis=2)
    v_down = np.take_along_axis(good[:, :, 0], g_down[:, :, None], axis=2)[:, :, 0]
    v_up = np.take_along_axis(good[:, :, 1], g_up[:, :, None], axis=2)[:, :, 0]
    up = (v_up > v_down) | ((v_up == v_down) & (2 * g_up + 1 < 2 * g_down))
    best = np.where(up, width + g_up, g_down)[:, :, None]  # index in the (2, G) plane pair

    def pick(a: np.ndarray) -> np.ndarray:
        full = np.broadcast_to(a, full_shape).reshape(n_jobs, n_alloc, -1)
        return np.take_along_axis(full, best, axis=2)[:, :, 0]

    best_good = np.where(up, v_up, v_down)
    feasible = best_good >= 0
    best_total = pick(total)
    return (
        np.where(feasible, best_good, 0.0),
        np.where(feasible, best_total / pick(t), 0.0),
        np.where(feasible, pick(eff), 0.0),
        np.where(feasible, best_total, 0.0).astype(np.int64),
        np.where(feasible, pick(m), 0.0).astype(np.int64),
        np.where(feasible, pick(s), 0.0).astype(np.int64),
    )


def optimize_many(
    jobs: JobArrays,
    num_nodes: ArrayLike,
    num_gpus: ArrayLike,
    *,
    fixed_batch_size: ArrayLike | None = None,
) -> BatchOptimum:
    """Best batch configuration of every job at each of its allocations.

    ``num_nodes`` and ``num_gpus`` are integer arrays that broadcast together to ``(J,)`` or
    ``(J, A)`` (row ``j``: job ``j``'s ``A`` candidate allocations; a scalar or a single row
    applies to every job; 0 GPUs is allowed and gives zeros). ``fixed_batch_size`` is ``None``
    (every job adaptive) or ``(J,)`` integers: ``0`` means adaptive, ``b >= 1`` fixes job
    ``j``'s total batch to ``b`` as ``GoodputModel.optimize(..., fixed_batch_size=b)`` does.
    Returns a ``BatchOptimum`` of arrays of the broadcast shape, each entry that of the scalar
    ``optimize`` of that job at that allocation (see the module docstring). Negative or
    non-integer node or GPU counts are rejected (``InvalidInputError``), not mapped to zeros.

    Work: ``J x A x 2 x 48`` candidates (fewer where a job's grid is shorter), in chunks of jobs
    of at most 128 Ki candidates through reused buffers: memory does not grow with ``J x A``
    beyond the ``(J, A)`` results.
    """
    if not isinstance(jobs, JobArrays):
        raise InvalidInputError("jobs must be a JobArrays", field="jobs")
    n_jobs = jobs.num_jobs
    nodes = _int_array(num_nodes, "num_nodes")
    gpus = _int_array(num_gpus, "num_gpus")
    try:
        nodes, gpus = np.broadcast_arrays(nodes, gpus)
    except ValueError as exc:
        raise InvalidInputError(
            f"num_nodes {nodes.shape} and num_gpus {gpus.shape} do not broadcast", field="num_gpus"
        ) from exc
    if nodes.ndim <= 2 and nodes.shape[:1] in ((), (1,)):  # one row (or scalar): every job
        nodes, gpus = (np.broadcast_to(a, (n_jobs, *a.shape[1:])) for a in (nodes, gpus))
    shape = nodes.shape
    if len(shape) not in (1, 2) or shape[0] != n_jobs:
        raise InvalidInputError(
            f"num_nodes/num_gpus must broadcast to ({n_jobs},) or ({n_jobs}, A), got {shape}",
            field="num_gpus",
        )
    for name, arr in (("num_nodes", nodes), ("num_gpus", gpus)):
        if np.any(arr < 0):
            at = tuple(int(v) for v in np.argwhere(arr < 0)[0])
            raise InvalidInputError(
                f"{name} must be >= 0, got {arr[at]} at {at}", field=f"{name}{list(at)}"
            )
    if nodes.ndim == 1:
        nodes, gpus = nodes[:, None], gpus[:, None]
    n_alloc = nodes.shape[1]
    if fixed_batch_size is None:
        fixed = np.zeros(n_jobs, dtype=np.int64)
    else:
        fixed = _int_array(fixed_batch_size, "fixed_batch_size", (n_jobs,))
        if np.any(fixed < 0):
            j = int(np.flatnonzero(fixed < 0)[0])
            raise InvalidInputError(
                f"fixed_batch_size[{j}] must be >= 1, or 0 for adaptive, got {fixed[j]}",
                field=f"fixed_batch_size[{j}]",
            )
    out_shapes = [np.zeros((n_jobs, n_alloc)) for _ in range(3)]
    out_ints = [np.zeros((n_jobs, n_alloc), dtype=np.int64) for _ in range(3)]
    if n_jobs and n_alloc:
        is_fixed = fixed > 0
        # Candidate totals per job, NaN-padded to a common width (a NaN candidate is never
        # feasible, and padding comes after every real candidate, so the first-maximiser rule
        # is unchanged).
        pairs = np.stack([jobs.init_batch_size, jobs.max_batch_size], axis=1)
        span = int(jobs.max_batch_size.max()) + 1
        if span < 1 << 31:  # each pair as one key: a 1-D unique is far faster than by rows
            keys, inverse = np.unique(pairs[:, 0] * span + pairs[:, 1], return_inverse=True)
            uniq = np.stack(np.divmod(keys, span), axis=1)
        else:
            uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        grids = [_total_grid(int(lo), int(hi)) for lo, hi in uniq]
        width = np.array([len(g) for g in grids])
        table = np.full((len(grids), int(width.max())), np.nan)
        for i, g in enumerate(grids):
            table[i, : len(g)] = g
        inverse = inverse.reshape(-1)
        target = table[inverse]
        length = np.where(is_fixed, 1, width[inverse])
        target[is_fixed, 0] = fixed[is_fixed]
        target[is_fixed, 1:] = np.nan
        lower = np.where(is_fixed, fixed, jobs.init_batch_size).astype(float)
        upper = np.where(is_fixed, np.inf, jobs.max_batch_size.astype(float))
        sqr, var = jobs.grad[:, 0], jobs.grad[:, 1]
        init_bs = jobs.init_batch_size.astype(float)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf: as scalar
            phi = np.where(sqr > 0, np.maximum(0.0, init_bs * var / sqr), np.inf)
        # Chunks of jobs with similar grid widths keep padding and memory small.
        order = np.argsort(length, kind="stable")
        per_job = n_alloc * 2 * length[order]
        work = _workspace(max(_CHUNK_ELEMENTS, int(per_job.max())))
        start = 0
        while start < n_jobs:
            stop = start + 1  # sorted widths: the chunk's width is its last job's
            while stop < n_jobs and (stop + 1 - start) * per_job[stop] <= _CHUNK_ELEMENTS:
                stop += 1
            sel = order[start:stop]
            g_width = int(length[sel[-1]])
            res = _optimize_chunk(
                work,
                jobs.perf[sel],
                phi[sel],
                init_bs[sel],
                lower[sel],
                upper[sel],
                jobs.min_local_bsz[sel].astype(float),
                jobs.max_local_bsz[sel].astype(float),
                jobs.max_accum_steps[sel].astype(float),
                target[sel, :g_width],
                nodes[sel],
                gpus[sel],
            )
            for dst, src in zip([*out_shapes, *out_ints], res, strict=True):
                dst[sel] = src
            start = stop
    return BatchOptimum(
        goodput=out_shapes[0].reshape(shape),
        throughput=out_shapes[1].reshape(shape),
        efficiency=out_shapes[2].reshape(shape),
        batch_size=out_ints[0].reshape(shape),
        local_bsz=out_ints[1].reshape(shape),
        accum_steps=out_ints[2].reshape(shape),
    )


# --------------------------------------------------------------------------------------------
# Fitting many jobs at once
# --------------------------------------------------------------------------------------------

_TINY = 1e-8
_LO = np.array([LOG_FLOOR] * 6 + [1.0])
_HI = np.array([LOG_CEIL] * 6 + [GAMMA_MAX])
_SCALE2 = np.array([1.0] * 6 + [0.25])  # squared prior scale (gamma: 0.5)
# Solver settings (see _solve and fit_perf_params_many).
_MAX_ITER = 200  # iterations per start at most
_XTOL = 1e-7  # a job is done when an accepted step moved no free parameter more than this ...
_FTOL = 1e-12  # ... or lowered its objective by less than this (absolute) ...
_GTOL = 1e-12  # ... or its projected gradient is below this ...
_LAMBDA_MAX = 1e12  # ... or the damping has grown this large (no descent left)
_LAMBDA_0 = 0.1  # initial damping (relative to the Gauss-Newton diagonal)
_SHRINK_MIN = 1.0 / 3.0  # the damping shrinks at most this much after a good step
# Cold starts differ only in gamma, where the objective has separate basins (ncf-like profiles,
# sync about as long as compute, where one start now and then ends in a clearly worse basin than
# the scalar fit): each job with free gamma is solved from each, the best kept.
_COLD_GAMMAS = (1.0, 2.0)
# A warm job with fewer samples than this also gets the cold starts: its previous optimum says
# little about the new one.
_WARM_ALONE_MIN_SAMPLES = 8


def _listed(sample_sets: Sequence[Sequence[ProfileSample]]) -> list[list[ProfileSample]]:
    if isinstance(sample_sets, (str, bytes)) or not isinstance(sample_sets, Sequence):
        raise InvalidInputError(
            "sample_sets must be a sequence of sequences of ProfileSample", field="sample_sets"
        )
    out = []
    for j, samples in enumerate(sample_sets):
        if isinstance(samples, (str, bytes, ProfileSample)) or not isinstance(samples, Sequence):
            raise InvalidInputError(
                f"sample_sets[{j}] must be a sequence of ProfileSample, got {samples!r}",
                field=f"sample_sets[{j}]",
            )
        out.append(list(samples))
    return out


def _validate_all(sets: list[list[ProfileSample]]) -> None:
    """Every check, job by job and sample by sample: raises the first error in that order."""
    for j, samples in enumerate(sets):
        if not samples:
            raise InvalidInputError(
                f"sample_sets[{j}]: at least one profile sample is needed",
                field=f"sample_sets[{j}]",
            )
        for i, s in enumerate(samples):
            validate_sample(s, f"sample_sets[{j}][{i}]")


@dataclass(frozen=True)
class _Profiles:
    """Samples of ``J`` jobs padded to ``S`` columns (padding: 1 GPU, weight 0); ``(J, S)``."""

    nodes: np.ndarray
    gpus: np.ndarray
    lbsz: np.ndarray
    accum: np.ndarray
    step: np.ndarray
    sync: np.ndarray
    valid: np.ndarray  # bool
    count: np.ndarray  # (J,) samples per job


def _pack(sets: list[list[ProfileSample]]) -> _Profiles:
    """Validated, padded arrays of ``sets``.

    Bulk checks on flat lists cover the common case; anything they do not vouch for is
    re-checked sample by sample (``_validate_all``), which raises the scalar error.
    """
    counts = np.array([len(s) for s in sets], dtype=np.int64)
    flat: list[ProfileSample] = list(chain.from_iterable(sets))
    checked = (
        bool(counts.size) and int(counts.min()) >= 1 and set(map(type, flat)) <= {ProfileSample}
    )
    if checked:
        placements = [s.placement for s in flat]
        lbsz_l = [s.local_bsz for s in flat]
        accum_l = [s.accum_steps for s in flat]
        step_l = [s.step_time_s for s in flat]
        sync_l = [s.sync_time_s for s in flat]
        checked = (
            set(map(type, placements)) <= {tuple}
            and min(map(len, placements)) >= 1
            and set(map(type, chain.from_iterable(placements))) <= {int}
            and set(map(type, lbsz_l)) <= {int}
            and set(map(type, accum_l)) <= {int}
            and set(map(type, step_l)) <= {float, int}
            and set(map(type, sync_l)) <= {float, int}
        )
    if not checked:
        _validate_all(sets)  # raises, or vouches for the unusual (e.g. int subclasses)
        placements = [s.placement for s in flat]
        lbsz_l = [s.local_bsz for s in flat]
        accum_l = [s.accum_steps for s in flat]
        step_l = [s.step_time_s for s in flat]
        sync_l = [s.sync_time_s for s in flat]
    lengths = np.fromiter(map(len, placements), dtype=np.int64, count=len(placements))
    per_node = np.array(list(chain.from_iterable(placements)), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]) if len(lengths) else lengths
    if per_node.size:
        gpus_f = np.add.reduceat(per_node, starts)
        nodes_f = np.add.reduceat((per_node > 0).astype(np.int64), starts)
        neg = np.minimum.reduceat(per_node, starts) < 0
    else:
        gpus_f = nodes_f = np.zeros(0, dtype=np.int64)
        neg = np.zeros(0, dtype=bool)
    lbsz_f = np.array(lbsz_l, dtype=np.int64)
    accum_f = np.array(accum_l, dtype=np.int64)
    step_f = np.array(step_l, dtype=float)
    sync_f = np.array(sync_l, dtype=float)
    bad = (
        neg
        | (gpus_f < 1)
        | (lbsz_f < 1)
        | (accum_f < 1)
        | ~np.isfinite(step_f)
        | ~(step_f > 0)
        | ~np.isfinite(sync_f)
        | ~(sync_f >= 0)
    )
    if bad.any():
        _validate_all(sets)  # raises the first error in job and sample order
    n_jobs = len(sets)
    width = int(counts.max()) if n_jobs else 0
    rows = np.repeat(np.arange(n_jobs), counts)
    cols = np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)

    def padded(values: np.ndarray, fill: float) -> np.ndarray:
        out = np.full((n_jobs, width), fill)
        out[rows, cols] = values
        return out

    valid = np.zeros((n_jobs, width), dtype=bool)
    valid[rows, cols] = True
    return _Profiles(
        nodes=padded(nodes_f, 1.0),
        gpus=padded(gpus_f, 1.0),
        lbsz=padded(lbsz_f, 1.0),
        accum=padded(accum_f, 1.0),
        step=padded(step_f, 1.0),
        sync=padded(sync_f, 0.0),
        valid=valid,
        count=counts,
    )


@dataclass(frozen=True)
class _Problem:
    """Per-job fit data, ``(J, S)`` or ``(J, 7)``: the objective of ``fit_perf_params``."""

    lbsz: np.ndarray
    accum_m1: np.ndarray  # accum_steps - 1
    log_k: np.ndarray  # log2(num_gpus)
    multi: np.ndarray  # bool: 2+ GPUs
    inter: np.ndarray  # bool: 2+ nodes
    log_step: np.ndarray
    log_sync: np.ndarray  # log of the sync time where sync_mask, else 0
    sync_mask: np.ndarray  # bool: sync residual counts
    w_step: np.ndarray  # 1 / n where valid, else 0
    w_sync: np.ndarray  # 1 / n_sync where sync_mask, else 0
    log_k_inter: np.ndarray  # log_k where inter, else 0
    w_both: np.ndarray  # (J, 2S): w_step then w_sync
    center: np.ndarray  # (J, 7) prior centre = cold start (pinned entries: pinned values)
    free: np.ndarray  # (J, 7) bool
    count: np.ndarray  # (J,) samples

    def take(self, rows: np.ndarray, width: int | None = None) -> _Problem:
        """Rows ``rows``; sample columns cut to ``width`` (``None``: all)."""
        cut = slice(None) if width is None else slice(0, width)
        return _Problem(
            lbsz=self.lbsz[rows, cut],
            accum_m1=self.accum_m1[rows, cut],
            log_k=self.log_k[rows, cut],
            multi=self.multi[rows, cut],
            inter=self.inter[rows, cut],
            log_step=self.log_step[rows, cut],
            log_sync=self.log_sync[rows, cut],
            sync_mask=self.sync_mask[rows, cut],
            w_step=self.w_step[rows, cut],
            w_sync=self.w_sync[rows, cut],
            log_k_inter=self.log_k_inter[rows, cut],
            w_both=np.concatenate([self.w_step[rows, cut], self.w_sync[rows, cut]], axis=1),
            center=self.center[rows],
            free=self.free[rows],
            count=self.count[rows],
        )


def _problem(prof: _Profiles) -> _Problem:
    """The objective's data and the cold start, as ``fit_perf_params`` derives them."""
    valid = prof.valid
    gpus, nodes, step, sync = prof.gpus, prof.nodes, prof.step, prof.sync
    multi = (gpus > 1) & valid
    multi_node = (nodes > 1) & valid
    has_multi = multi.any(axis=1)
    has_multi_node = multi_node.any(axis=1)
    # default_prior: the first sample with the fewest GPUs, then the smallest micro-batch.
    key = np.where(valid, gpus * (prof.lbsz.max(initial=1.0) + 1.0) + prof.lbsz, np.inf)
    first = np.argmin(key, axis=1)
    rows = np.arange(len(first))
    s_step, s_sync = step[rows, first], sync[rows, first]
    t_c = np.maximum(s_step - s_sync, 0.5 * s_step) / prof.accum[rows, first]
    x = np.empty((len(first), 7))
    x[:, 0] = np.log(np.maximum(0.1 * t_c, _TINY))
    x[:, 1] = np.log(np.maximum(0.9 * t_c / prof.lbsz[rows, first], _TINY))
    x[:, 2] = x[:, 3] = math.log(1e-6)
    x[:, 4] = x[:, 5] = LOG_FLOOR
    x[:, 6] = 1.0

    def mean(mask: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(np.where(mask, sync, 0.0), axis=1) / np.sum(mask, axis=1)

    intra = multi & (nodes == 1)
    any_sync = np.where(has_multi, mean(multi), 0.0)
    intra_sync = np.where(intra.any(axis=1), mean(intra), 0.5 * any_sync)
    inter_sync = np.where(has_multi_node, mean(multi_node), intra_sync)
    log_intra = np.log(np.maximum(0.25 * intra_sync, _TINY))
    log_inter = np.log(np.maximum(0.25 * np.maximum(inter_sync - intra_sync, 0.0), 1e-6))
    for c in (2, 3):
        x[:, c] = np.where(has_multi, log_intra, LOG_FLOOR)
    for c in (4, 5):
        x[:, c] = np.where(has_multi_node, log_inter, LOG_FLOOR)
    x[:, 6] = np.where(has_multi, 1.5, 1.0)
    free = np.stack(
        [
            *(np.ones_like(has_multi),) * 2,
            *(has_multi,) * 2,
            *(has_multi_node,) * 2,
            has_multi,
        ],
        axis=1,
    )
    sync_mask = multi & (sync > SYNC_FLOOR_FRAC * step)
    n_sync = np.maximum(sync_mask.sum(axis=1), 1)
    w_step = valid / prof.count[:, None].astype(float)
    w_sync = sync_mask / n_sync[:, None].astype(float)
    log_k = np.log2(gpus)
    inter = multi & (nodes > 1)
    return _Problem(
        lbsz=prof.lbsz,
        accum_m1=prof.accum - 1.0,
        log_k=log_k,
        multi=multi,
        inter=inter,
        log_step=np.log(step),
        log_sync=np.log(np.where(sync_mask, sync, 1.0)),
        sync_mask=sync_mask,
        w_step=w_step,
        w_sync=w_sync,
        log_k_inter=np.where(inter, log_k, 0.0),
        w_both=np.concatenate([w_step, w_sync], axis=1),
        center=x,
        free=free,
        count=prof.count,
    )


class _FitWorkspace:
    """Reused buffers of ``_evaluate`` for up to ``n_jobs`` jobs of ``width`` samples."""

    def __init__(self, n_jobs: int, width: int) -> None:
        self.feat = np.empty((n_jobs, 7, 3 * width))
        self.scaled = np.empty((n_jobs, 7, 3 * width))
        self.weights = np.empty((n_jobs, 3 * width))


def _evaluate(
    x: np.ndarray, d: _Problem, derivatives: bool, work: _FitWorkspace | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Objective ``(J,)`` at ``x`` and, with ``derivatives``, half its gradient ``(J, 7)``, half
    its exact Hessian ``(J, 7, 7)`` and the diagonal of the Gauss-Newton half-Hessian ``(J, 7)``;
    else empty arrays. Entries of pinned parameters are meaningless (the solver holds them).

    With ``u = (t_c, t_s, gamma)`` and ``L = (t_c^g + t_s^g)^(1/g)``, ``p_c = (t_c / L)^g``,
    ``p_s = 1 - p_c``, ``Phi = p_c ln t_c + p_s ln t_s - ln L`` and ``D = ln t_c - ln t_s``:
    ``dL/du = (p_c L / t_c, p_s L / t_s, L Phi / g)`` and the second derivatives are
    ``k v v^T`` on ``(t_c, t_s)`` with ``k = (g - 1) p_c p_s L``, ``v = (1 / t_c, -1 / t_s)``,
    ``d2L/dt_c dg = L / t_c (p_c p_s D + p_c Phi / g)``,
    ``d2L/dt_s dg = L / t_s (-p_c p_s D + p_s Phi / g)`` and
    ``d2L/dg2 = L Phi^2 / g^2 - 2 L Phi / g^2 + L p_c p_s D^2 / g``. Every time parameter
    ``e_k = exp(x_k)`` enters ``t_c`` or ``t_s`` linearly, so ``d2u/dx_k2 = du/dx_k``.
    """
    e = np.exp(x[:, :6])
    gam = x[:, 6:7]
    e0, e1, e2, e3, e4, e5 = (e[:, i : i + 1] for i in range(6))
    t_c = e0 + e1 * d.lbsz
    t_s = np.where(d.multi, e2 + e3 * d.log_k + np.where(d.inter, e4 + e5 * d.log_k, 0.0), 0.0)
    hi = np.maximum(t_c, t_s)
    ratio = np.minimum(t_c, t_s) / hi
    rg = ratio**gam
    last = hi * (1.0 + rg) ** (1.0 / gam)
    t = d.accum_m1 * t_c + last
    err = np.log(t) - d.log_step
    log_ts = np.log(np.where(d.multi, t_s, 1.0))
    err_s = np.where(d.sync_mask, log_ts - d.log_sync, 0.0)
    dx = np.where(d.free, x - d.center, 0.0)
    f = (
        np.sum(d.w_step * err * err, axis=1)
        + np.sum(d.w_sync * err_s * err_s, axis=1)
        + PRIOR_WEIGHT * np.sum(_SCALE2 * dx * dx, axis=1)
    )
    if not derivatives:
        empty = np.empty(0)
        return f, empty, empty, empty
    # Shares of the last micro-step, p_c = (t_c / L)^g and p_s, from rg: no more powers.
    q = 1.0 / (1.0 + rg)
    c_hi = t_c >= t_s
    p_c = np.where(c_hi, q, rg * q)
    p_s = np.where(c_hi, rg * q, q)
    has_s = t_s > 0
    ts_safe = np.where(has_s, t_s, 1.0)
    log_tc = np.log(t_c)
    log_last = np.log(last)
    diff = np.where(has_s, log_tc - log_ts, 0.0)  # D
    phi = p_c * log_tc + np.where(has_s, p_s * log_ts, 0.0) - log_last
    pcs = p_c * p_s
    inv_t = 1.0 / t
    # First derivatives of t in u, and of u in x (phi_k: d u(k) / d x_k).
    dt_dtc = d.accum_m1 + p_c * last / t_c
    dt_dts = p_s * last / ts_safe
    dt_dg = last * phi / gam
    n_jobs, width = t.shape
    if work is None:
        work = _FitWorkspace(n_jobs, width)
    feat = work.feat[:n_jobs]  # columns: d err | d err_s | z (see below)
    du = feat[:, :, width : 2 * width]  # scratch first: d u(k) / d x_k
    du[:, 0] = e0
    np.multiply(e1, d.lbsz, out=du[:, 1])
    np.multiply(e2, d.multi, out=du[:, 2])
    np.multiply(e3, d.log_k, out=du[:, 3])
    np.multiply(e4, d.inter, out=du[:, 4])
    np.multiply(e5, d.log_k_inter, out=du[:, 5])
    du[:, 6] = 1.0
    z = feat[:, :, 2 * width :]
    np.multiply(du[:, :2], (-1.0 / t_c)[:, None, :], out=z[:, :2])
    np.multiply(du[:, 2:6], (1.0 / ts_safe)[:, None, :], out=z[:, 2:6])
    z[:, 6] = 0.0
    dr = feat[:, :, :width]  # d err / d x = d t / d x / t
    np.multiply(du[:, :2], (dt_dtc * inv_t)[:, None, :], out=dr[:, :2])
    np.multiply(du[:, 2:6], (dt_dts * inv_t)[:, None, :], out=dr[:, 2:6])
    np.multiply(dt_dg, inv_t, out=dr[:, 6])
    # Second-order coefficients of t in u, scaled by w * err / t (the residual's weight).
    omega = d.w_step * err * inv_t
    m_cg = (last / t_c) * (pcs * diff + p_c * phi / gam)
    m_sg = (last / ts_safe) * (-pcs * diff + p_s * phi / gam)
    m_gg = last * phi * (phi - 2.0) / (gam * gam) + last * pcs * diff * diff / gam
    cross = np.empty((n_jobs, 6))
    cross[:, :2] = np.einsum("jks,js->jk", du[:, :2], omega * m_cg)
    cross[:, 2:] = np.einsum("jks,js->jk", du[:, 2:6], omega * m_sg)
    h_gg = np.sum(omega * m_gg, axis=1)
    # d err_s / d x (sync residuals): d t_s / d x / t_s; overwrites the scratch.
    du[:, :2] = 0.0
    du[:, 2:6] *= np.where(d.sync_mask, 1.0 / ts_safe, 0.0)[:, None, :]
    du[:, 6] = 0.0
    # Half gradient; half Hessian = sum w (1 - r) g g^T (+ diag(w r g) where d2u/dx2 = du/dx)
    # + omega (g - 1) p_c p_s L z z^T + the gamma cross terms.
    weights = work.weights[:n_jobs]
    np.multiply(d.w_step, err, out=weights[:, :width])
    np.multiply(d.w_sync, err_s, out=weights[:, width : 2 * width])
    g_data = np.einsum("jkr,jr->jk", feat[:, :, : 2 * width], weights[:, : 2 * width])
    grad = g_data + PRIOR_WEIGHT * _SCALE2 * dx
    np.subtract(d.w_both, weights[:, : 2 * width], out=weights[:, : 2 * width])
    np.multiply(omega * (gam - 1.0) * pcs, last, out=weights[:, 2 * width :])
    scaled = np.multiply(feat, weights[:, None, :], out=work.scaled[:n_jobs])
    hess = np.matmul(scaled, feat.transpose(0, 2, 1))
    diag = np.einsum("jkk->jk", hess)
    diag[:, :6] += g_data[:, :6]
    diag += PRIOR_WEIGHT * _SCALE2 * d.free
    hess[:, 6, :6] += cross
    hess[:, :6, 6] += cross
    hess[:, 6, 6] += h_gg
    gn_diag = np.einsum(
        "jkr,jkr,jr->jk", feat[:, :, : 2 * width], feat[:, :, : 2 * width], d.w_both
    )
    gn_diag += PRIOR_WEIGHT * _SCALE2 * d.free
    return f, grad, hess, gn_diag


def _solve_systems(a: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``a[j] @ step[j] = rhs[j]`` for stacked 7x7 systems; a (numerically) singular one gets a
    zero step (the solver then rejects it and damps harder) instead of failing the batch."""
    try:
        return np.asarray(np.linalg.solve(a, rhs[:, :, None])[:, :, 0])
    except np.linalg.LinAlgError:
        step = np.zeros_like(rhs)
        for j in range(len(rhs)):
            with contextlib.suppress(np.linalg.LinAlgError):
                step[j] = np.linalg.solve(a[j], rhs[j])
        return step


def _solve(
    x: np.ndarray,
    d: _Problem,
    max_iter: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Projected, damped Newton (Levenberg-Marquardt style) from ``x`` (``(J, 7)``, inside the
    bounds) for all jobs at once.

    Returns (x, objective, iterations). Each iteration solves, for every job still moving,
    ``(H + lam * diag(G)) step = -grad`` (``H`` the exact Hessian, ``G`` the Gauss-Newton one,
    whose diagonal is positive) over the free parameters that are not held at a bound (one at a
    bound whose gradient points out of the box is held), clips the step into the box and accepts
    it if the objective fell by a fair share of the predicted fall; the damping ``lam`` shrinks
    after good steps and grows geometrically after bad ones (Nielsen), so an indefinite ``H``
    only costs rejected steps. Jobs that are done leave the working set.
    """
    n_jobs = x.shape[0]
    x = x.copy()
    work = _FitWorkspace(n_jobs, d.lbsz.shape[1])
    f, grad, hess, gn = _evaluate(x, d, True, work)
    iters = np.zeros(n_jobs, dtype=np.int64)
    active = np.arange(n_jobs)
    da = d
    xa, fa, ga, ha, gna = x, f, grad, hess, gn
    lama = np.full(n_jobs, _LAMBDA_0)
    nua = np.full(n_jobs, 2.0)
    for _ in range(max_iter):
        if active.size == 0:
            break
        held = ~da.free | ((xa <= _LO) & (ga > 0)) | ((xa >= _HI) & (ga < 0))
        move = ~held
        a = ha * (move[:, :, None] & move[:, None, :])
        diag = np.einsum("jkk->jk", a)
        diag += lama[:, None] * gna
        diag[held] = 1.0
        step = _solve_systems(a, np.where(move, -ga, 0.0))
        x_new = np.clip(xa + step, _LO, _HI)
        x_new = np.where(da.free, x_new, xa)
        step = x_new - xa
        pred = -(2.0 * np.sum(ga * step, axis=1) + np.einsum("jk,jkl,jl->j", step, ha, step))
        f_new, g_new, h_new, gn_new = _evaluate(x_new, da, True, work)
        gain = fa - f_new
        ok = np.isfinite(f_new) & (gain > 0) & (pred > 0)
        rho = np.where(ok, gain / np.where(pred > 0, pred, 1.0), 0.0)
        ok &= rho > 1e-4
        shrink = np.maximum(_SHRINK_MIN, 1.0 - (2.0 * rho - 1.0) ** 3)
        lama = np.where(ok, lama * shrink, lama * nua)
        nua = np.where(ok, 2.0, nua * 2.0)
        xa = np.where(ok[:, None], x_new, xa)
        fa = np.where(ok, f_new, fa)
        ga = np.where(ok[:, None], g_new, ga)
        ha = np.where(ok[:, None, None], h_new, ha)
        gna = np.where(ok[:, None], gn_new, gna)
        small_step = np.max(np.abs(step), axis=1) <= _XTOL
        pg = np.where(move, ga, 0.0)
        done = (ok & (small_step | (gain <= _FTOL))) | (lama > _LAMBDA_MAX)
        done |= np.max(np.abs(pg), axis=1) <= _GTOL
        iters[active] += 1
        if done.any():
            fin = active[done]
            x[fin] = xa[done]
            f[fin] = fa[done]
            keep = ~done
            active = active[keep]
            da = da.take(np.flatnonzero(keep))
            xa, fa, ga, ha, gna = xa[keep], fa[keep], ga[keep], ha[keep], gna[keep]
            lama, nua = lama[keep], nua[keep]
    x[active] = xa
    f[active] = fa
    return x, f, iters


# Sample slots (rows x padded samples, a row being one start of one job) per solver chunk:
# bounds each of the solver's two (rows, 7, 3 x samples) buffers to 21 MiB whatever the mix of
# profile sizes.
_FIT_CHUNK_SLOTS = 1 << 17


def _x_of(params: np.ndarray, prob: _Problem) -> np.ndarray:
    """Free-vector form of ``PerfParams`` rows ``(J, 7)``, mapped into the bounds; pinned
    entries take their pinned values."""
    v = np.column_stack([params[:, :4], params[:, 4] - params[:, 2], params[:, 5] - params[:, 3]])
    x = np.empty_like(params)
    x[:, :6] = np.log(np.maximum(v, _TINY))
    x[:, 6] = params[:, 6]
    x = np.clip(x, _LO, _HI)
    return np.where(prob.free, x, prob.center)


def _params_of(x: np.ndarray) -> np.ndarray:
    """``PerfParams`` rows ``(J, 7)`` of free vectors, as ``fit_perf_params`` unpacks them."""
    x = np.clip(x, _LO, _HI)
    e = np.exp(x[:, :6])
    p = np.column_stack([e[:, :4], e[:, 2] + e[:, 4], e[:, 3] + e[:, 5], x[:, 6]])
    p[:, 4] = np.maximum(p[:, 4], p[:, 2])
    p[:, 5] = np.maximum(p[:, 5], p[:, 3])
    p[:, 6] = np.clip(p[:, 6], 1.0, GAMMA_MAX)
    return p


def _perf_rows(params: Sequence[PerfParams | None], name: str, n_jobs: int) -> np.ndarray:
    """``(n_jobs, 7)`` rows of ``params`` (NaN rows for ``None``), validated."""
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise InvalidInputError(f"{name} must be a sequence of PerfParams", field=name)
    if len(params) != n_jobs:
        raise InvalidInputError(
            f"{name} must have one entry per job ({n_jobs}), got {len(params)}", field=name
        )
    out = np.full((n_jobs, 7), np.nan)
    for j, p in enumerate(params):
        if p is None:
            continue
        if not isinstance(p, PerfParams):
            raise InvalidInputError(
                f"{name}[{j}] must be PerfParams or None, got {p!r}", field=f"{name}[{j}]"
            )
        out[j] = p.as_array()
    return out


def _chunks(count: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """Jobs grouped by similar sample counts: (rows, padded width) per chunk."""
    order = np.argsort(count, kind="stable")
    out = []
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * int(count[order[stop]]) <= (
            _FIT_CHUNK_SLOTS
        ):
            stop += 1
        rows = order[start:stop]
        out.append((rows, int(count[rows].max())))
        start = stop
    return out


def _best_of(prob: _Problem, starts: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Solve every (jobs, start) pair together; per job, the lowest objective (earliest start
    on ties)."""
    job = np.concatenate([rows for rows, _ in starts])
    x0 = np.concatenate([x for _, x in starts])
    x = np.empty_like(x0)
    f = np.empty(len(job))
    for sel, width in _chunks(prob.count[job]):
        x[sel], f[sel], _ = _solve(x0[sel], prob.take(job[sel], width), _MAX_ITER)
    best_x = np.empty_like(prob.center)
    order = np.lexsort((np.arange(len(job)), f, job))  # by job, then objective, then start
    first = np.ones(len(job), dtype=bool)
    first[1:] = job[order][1:] != job[order][:-1]
    best_x[job[order[first]]] = x[order[first]]
    return best_x


def fit_objective_many(
    sample_sets: Sequence[Sequence[ProfileSample]], params: Sequence[PerfParams]
) -> np.ndarray:
    """The objective of ``fit_perf_params`` on each job's samples at ``params[j]``, ``(J,)``.

    The value ``fit_perf_params`` minimises: mean squared log-error of step times, plus that of
    sync times, plus the weak prior; ``params`` is first mapped into the fit's bounds and pinned
    values (so a fit's result maps to itself). Compares fitters on equal terms.
    """
    sets = _listed(sample_sets)
    rows = _perf_rows(params, "params", len(sets))
    if not sets:
        return np.zeros(0)
    if np.isnan(rows).any():
        j = int(np.flatnonzero(np.isnan(rows).any(axis=1))[0])
        raise InvalidInputError(f"params[{j}] must be PerfParams", field=f"params[{j}]")
    prob = _problem(_pack(sets))
    f, _, _, _ = _evaluate(_x_of(rows, prob), prob, False)
    return f


def fit_perf_params_many(
    sample_sets: Sequence[Sequence[ProfileSample]],
    warm: Sequence[PerfParams | None] | None = None,
) -> list[PerfParams]:
    """``fit_perf_params`` for every job of ``sample_sets`` at once (default prior).

    ``sample_sets[j]`` is job ``j``'s profile (at least one sample, each checked as
    ``fit_perf_params`` checks it, with the same messages; errors name
    ``sample_sets[j][i].<field>``, the first bad sample in job order). Returns one
    ``PerfParams`` per job, in order (``[]`` for no jobs), unpacked and bounded exactly as
    ``fit_perf_params`` unpacks its optimum.

    Every job minimises the scalar fit's objective (see the module docstring) with ``_solve``;
    a job whose gamma is free (it has a multi-GPU sample) is solved from two cold starts, gamma
    1 and 2 (the scalar fit's cold start otherwise), keeping the better (the earlier on a tie).
    ``warm[j]``, when given and not ``None``, is job ``j``'s previous fit: the job is solved from
    there alone (sync terms that sat at their floor, i.e. were pinned or unknown, start cold; a
    first multi-GPU sample makes the whole job cold), and from the cold starts too while its
    profile has fewer than 8 samples. The objective does not depend on ``warm`` (the prior stays
    centred on the cold start): warm starting only saves iterations. Deterministic.
    """
    sets = _listed(sample_sets)
    warm_rows = None if warm is None else _perf_rows(warm, "warm", len(sets))
    if not sets:
        return []
    prob = _problem(_pack(sets))
    cold = np.clip(prob.center, _LO, _HI)
    n_jobs = cold.shape[0]
    first = cold.copy()
    first[:, 6] = np.where(prob.free[:, 6], _COLD_GAMMAS[0], first[:, 6])
    has_warm = np.zeros(n_jobs, dtype=bool)
    if warm_rows is not None and not np.isnan(warm_rows[:, 0]).all():
        has_warm = ~np.isnan(warm_rows[:, 0])
        xw = _x_of(np.where(has_warm[:, None], warm_rows, 1.0), prob)
        # A sync group at its floor was pinned (or is unknown) in the previous fit. Intra-node
        # sync newly free: the profile changed in kind (first multi-GPU sample), start cold.
        # Inter-node increments newly free: start those two where a cold fit would.
        floor = math.log(1.5 * _TINY)
        has_warm &= ~((xw[:, 2] <= floor) & (xw[:, 3] <= floor) & prob.free[:, 2])
        inter_unknown = (xw[:, 4] <= floor) & (xw[:, 5] <= floor)
        for c in (4, 5):
            xw[:, c] = np.where(inter_unknown, cold[:, c], xw[:, c])
        first = np.where(has_warm[:, None], xw, first)
    starts = [(np.arange(n_jobs), first)]
    # Further starts for jobs with free gamma (where the objective has several basins): the
    # other cold gammas; for a warm job with a small profile, whose previous optimum says little
    # about the new one, every cold start.
    count = prob.count
    few = has_warm & (count < _WARM_ALONE_MIN_SAMPLES)
    for rows, gammas in (
        (np.flatnonzero(prob.free[:, 6] & ~has_warm), _COLD_GAMMAS[1:]),
        (np.flatnonzero(prob.free[:, 6] & few), _COLD_GAMMAS),
    ):
        for g0 in gammas:
            if rows.size:
                x0 = cold[rows].copy()
                x0[:, 6] = g0
                starts.append((rows, x0))
    x = _best_of(prob, starts)
    p = _params_of(x)
    return [
        PerfParams(*(float(v) for v in row))  # type: ignore[arg-type]
        for row in p.tolist()
    ]
