"""Deadlines: what a job's deadline asks of the fleet and the policy (pure).

A job may carry a deadline (:attr:`JobView.deadline_s <autoscaler.decide.views.JobView.deadline_s>`,
on the clock of its submission time). Once its script has declared its length (its first
report), its remaining work is known (:attr:`JobView.remaining_work`, ``M0``-equivalent
samples) and, with a goodput model, so is how fast it could finish. The rules here are shared
by the fleet sizing (:func:`autoscaler.decide.strategies.demands_of`), the ``coadapt`` policy and
the controller's warning, so that they mean one thing everywhere:

- :func:`required_rate` -- the goodput (samples per second) the job needs from now on to be
  done ``margin_s`` before its deadline;
- :func:`assess` -- given the job's goodput on each instance kind and GPU count: the fastest
  it could be done (``fastest_s``), whether it can still make it at all (``feasible``),
  whether its *slack* (time left minus the fastest time, start-up included) is below
  ``margin_s`` (``urgent``: it can no longer afford a preemption, so it runs on demand), and
  per kind the fewest GPUs that finish it ``margin_s`` early (``gpus``);
- :func:`length_in_force` -- the length a job is known to have: its trainer's declaration
  (``target_progress`` in its reports) once it comes, else the one its spec declared
  (``length:``), so the remaining work, :func:`remaining_s` and the ETA exist from the job's
  first report even when its script declares nothing;
- :func:`length_estimate_s` -- at submission, the fewest seconds a declared length could
  take on any GPU type the job may use (start-up included), for the refusal of a deadline
  no offering can meet;
- :func:`remaining_s` -- the seconds a running job has left at the allocation it holds, by
  its fitted model (its remaining work over its goodput there): the fleet sizing's
  ``JobDemand.remaining_s`` and the ETA the controller records for ``coadapt status``;
- :func:`uniform_progress_ahead` -- Can't Be Late's uniform-progress rule (Wu et al.,
  NSDI'24), the ``uniform-progress`` baseline: a job is *ahead* while the share of its work
  done is at least the share of its time to the deadline gone, and then may run on spot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

import numpy as np

from autoscaler.decide.bounds import gpu_ceiling
from autoscaler.decide.sizing import with_unseen_hope
from autoscaler.decide.views import ClusterView, JobView
from autoscaler.model.goodput import GoodputModel, optimistic_internode
from autoscaler.model.gputypes import REFERENCE_GPU_TYPE, SpeedTable, estimate_model, limits_on

__all__ = [
    "MAX_REMAINING_S",
    "DeadlineNeed",
    "assess",
    "fastest_finish_s",
    "goodput_bound",
    "goodput_curves",
    "held_gpu_type",
    "length_estimate_s",
    "length_in_force",
    "remaining_s",
    "required_rate",
    "time_left_s",
    "uniform_progress_ahead",
]

Kind = tuple[str, int]

MAX_REMAINING_S: Final = 30 * 86_400.0
"""The longest time left :func:`remaining_s` answers (30 days, the store's retention of
reports): a fit that predicts next to no goodput gives no estimate rather than years."""


def held_gpu_type(job: JobView, cluster: ClusterView) -> str | None:
    """The GPU type of the nodes of ``cluster`` the job holds GPUs on (``None``: it holds
    none there, or holds GPUs of more than one type)."""
    types = {cluster.node(n).gpu_type for n in job.allocation if cluster.index_of(n) is not None}
    return next(iter(types)) if len(types) == 1 else None


def length_in_force(declared: float | None, spec: float | None) -> float | None:
    """A job's length in the unit of progress (initial-batch-size iterations): the one its
    trainer declared (``declared``, the ``target_progress`` of its latest report), which
    replaces the one its spec declared (``spec``, :attr:`~autoscaler.controller.jobbook.
    JobSubmission.length_progress`) as soon as it comes; ``None``: neither declared one. The
    one rule: the controller's job views (their ``remaining_progress`` and
    ``target_progress``) take their length from it."""
    return declared if declared is not None else spec


def length_estimate_s(
    job: JobView,
    kinds: Iterable[Kind],
    speeds: SpeedTable,
    *,
    most_gpus: int,
    start_s: float,
) -> float | None:
    """The fewest seconds ``job`` could take from now, its start (``start_s``) included: its
    remaining work (:attr:`JobView.remaining_work`, at submission its declared length) over
    :func:`goodput_bound` on up to ``most_gpus`` GPUs of the ``kinds`` it may use, the same
    bound as the controller's deadline warning (:func:`fastest_finish_s`). For a lower bound
    at submission, ``job.models`` are the application's measured throughput fits with an
    efficiency of 1 (no gradient statistics are known before the job runs). ``None``: its
    length or any model is unknown."""
    fastest = fastest_finish_s(job, kinds, speeds, most_gpus=most_gpus)
    return None if fastest is None else start_s + fastest


def remaining_s(job: JobView, gpu_type: str | None) -> float | None:
    """Seconds the job has left at the allocation it holds now, by its fitted model on
    ``gpu_type``, the type it runs on (:func:`held_gpu_type`): the remaining work its trainer
    reports (:attr:`JobView.remaining_work`) over the model's goodput at its nodes and GPUs.

    ``None`` when it holds no GPUs, its script declared no length, it has no model on that
    type (``job.models``, filled for a type-aware policy), or the estimate is not below
    :data:`MAX_REMAINING_S` (a goodput of zero or next to it): an unknown time, never years.
    The one rule of a job's time left: the fleet sizing and the controller's ETA use it."""
    work = job.remaining_work
    if work is None or gpu_type is None or job.num_gpus == 0:
        return None
    model = job.models.get(gpu_type)
    if model is None:
        return None
    goodput = float(np.ravel(model.optimize(job.num_nodes, job.num_gpus).goodput)[0])
    if not goodput > 0:
        return None
    left = work / goodput
    return left if left < MAX_REMAINING_S else None


def time_left_s(job: JobView) -> float | None:
    """Seconds from now (the job's submission time plus its age) to its deadline (negative
    once it has passed); ``None`` without a deadline."""
    if job.deadline_s is None:
        return None
    return job.deadline_s - (job.submit_time_s + job.age_s)


def required_rate(job: JobView, margin_s: float) -> float | None:
    """Goodput (``M0``-equivalent samples per second) the job needs from now on to be done
    ``margin_s`` before its deadline (``inf`` when that moment has passed); ``None`` without a
    deadline or a known remaining work."""
    left = time_left_s(job)
    work = job.remaining_work
    if left is None or work is None:
        return None
    usable = left - margin_s
    return math.inf if usable <= 0 else work / usable


@dataclass(frozen=True)
class DeadlineNeed:
    """What a deadline asks (see :func:`assess`): ``time_left_s`` to the deadline,
    ``fastest_s`` the fastest the job could be done from now (start-up included; ``inf`` if it
    cannot run on any kind), ``feasible`` whether that is before the deadline, ``urgent``
    whether the slack is below the margin, ``gpus`` per instance kind the fewest GPUs that
    finish it ``margin_s`` before the deadline (the most useful count where none does)."""

    time_left_s: float
    fastest_s: float
    feasible: bool
    urgent: bool
    gpus: Mapping[Kind, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", MappingProxyType(dict(self.gpus)))


def assess(
    work: float,
    time_left: float,
    goodput: Mapping[Kind, Sequence[float]],
    *,
    start_s: float,
    margin_s: float,
    running_kind: Kind | None = None,
    restart_s: float = 0.0,
    tight_s: float = 60.0,
) -> DeadlineNeed:
    """The :class:`DeadlineNeed` of a job with ``work`` left (samples) and ``time_left``
    seconds to its deadline, whose goodput on ``g`` GPUs of each kind is
    ``goodput[kind][g - 1]`` (samples per second). Starting on a kind costs ``start_s``
    (provisioning and the job's start), or ``restart_s`` on the kind it runs on
    (``running_kind``). ``urgent`` when ``time_left - fastest_s < margin_s``: on demand, it
    needs no margin for a preemption, and its ``gpus`` are the fewest done ``tight_s``
    early (else the fastest); otherwise the fewest done ``margin_s`` early (else
    ``tight_s``, else the fastest)."""
    if not (work >= 0 and math.isfinite(work)):
        raise ValueError(f"work must be finite and >= 0, got {work}")
    fastest = math.inf
    usable = {k: c for k, c in goodput.items() if c and max(c) > 0}
    for kind, curve in usable.items():
        overhead = restart_s if kind == running_kind else start_s
        fastest = min(fastest, overhead + work / max(curve))
    urgent = time_left - fastest < margin_s
    margins = (tight_s,) if urgent else (margin_s, tight_s)
    gpus: dict[Kind, int] = {}
    for kind, curve in usable.items():
        overhead = restart_s if kind == running_kind else start_s
        need = int(max(range(len(curve)), key=lambda i: (curve[i], -i))) + 1  # the fastest
        for margin in margins:
            target = time_left - overhead - margin
            fits = [g for g, rate in enumerate(curve, 1) if rate > 0 and work / rate <= target]
            if fits:
                need = fits[0]
                break
        gpus[kind] = need
    return DeadlineNeed(time_left, fastest, feasible=fastest <= time_left, urgent=urgent, gpus=gpus)


def goodput_curves(
    job: JobView,
    kinds: Iterable[Kind],
    speeds: SpeedTable,
    *,
    most_gpus: int = 64,
    optimistic: bool = True,
) -> dict[Kind, list[float]]:
    """The job's goodput (samples per second) on ``g = 1 ..`` GPUs of each instance kind
    ``(gpu_type, gpus_per_instance)`` it may use, packed onto the fewest instances, up to its
    GPU ceiling (:func:`~autoscaler.decide.bounds.gpu_ceiling`) and ``most_gpus``: by its fitted
    model there, or the ratio rule's estimate from its other types (at its fixed batch if
    it does not adapt). Empty when it has no model yet. Not capped by the policy's
    exploration: what a deadline could still be met with, not what the job has shown; with
    ``optimistic``, a shape its fit has not seen (:func:`~autoscaler.decide.sizing.
    unseen_shapes`: more instances than it has run on, or several instances with more GPUs
    than it has run on) is valued at the better of its fit and its fit with the inter-node
    sync taken as the intra-node one (:func:`~autoscaler.model.goodput.optimistic_internode`,
    the one rule the sizing's ``optimistic_nodes`` applies too):
    a fit from one instance knows nothing of the network, and a deadline judged on its
    worst guess buys on demand for nothing."""
    models = job.models or ({REFERENCE_GPU_TYPE: job.model} if job.model is not None else {})
    if not models:
        return {}
    top = max(1, min(gpu_ceiling(job), most_gpus))
    g = np.arange(1, top + 1)
    fixed = None if job.adaptive else job.fixed_batch_size
    out: dict[Kind, list[float]] = {}
    for gpu_type, per in sorted(set(kinds)):
        if not job.allows_type(gpu_type):
            continue
        model = (
            models.get(gpu_type)
            or estimate_model(
                models,
                gpu_type,
                speeds,
                limits=limits_on(job.limits, job.application, gpu_type, speeds),
            ).model
        )
        nodes = -(-g // per)
        goodput = np.ravel(model.optimize(nodes, g, fixed_batch_size=fixed).goodput)
        if optimistic:

            def hopeful(m: GoodputModel = model, n: np.ndarray = nodes) -> np.ndarray:
                return np.ravel(
                    optimistic_internode(m).optimize(n, g, fixed_batch_size=fixed).goodput
                )

            goodput = with_unseen_hope(
                goodput, nodes, g, job.max_profiled_nodes, job.max_profiled_gpus, hopeful
            )
        out[(gpu_type, per)] = [float(x) for x in goodput]
    return out


def goodput_bound(job: JobView, kinds: Iterable[Kind], speeds: SpeedTable, most_gpus: int) -> float:
    """An upper bound of the job's goodput on up to ``most_gpus`` GPUs (and its ceiling) of
    any kind it may use, by its models: that many times its best goodput on one GPU (per
    GPU, throughput falls and statistical efficiency falls with the batch, so no allocation
    beats perfect scaling of one GPU's best). 0 without a model."""
    curves = goodput_curves(job, kinds, speeds, most_gpus=1, optimistic=False)
    best = max((c[0] for c in curves.values() if c), default=0.0)
    return max(1, min(gpu_ceiling(job), most_gpus)) * best


def fastest_finish_s(
    job: JobView, kinds: Iterable[Kind], speeds: SpeedTable, *, most_gpus: int = 64
) -> float | None:
    """A lower bound of the seconds the job's remaining work takes from now on any instance
    kind it may use, on up to ``most_gpus`` GPUs (:func:`goodput_bound`); no start-up
    counted. ``None`` when its remaining work or its model is unknown."""
    work = job.remaining_work
    if work is None:
        return None
    best = goodput_bound(job, kinds, speeds, most_gpus)
    return None if best <= 0 else work / best


def uniform_progress_ahead(
    done: float, total: float, since_submit_s: float, window_s: float
) -> bool:
    """Can't Be Late's rule: with ``done`` of ``total`` work done, ``since_submit_s`` into a
    ``window_s`` from submission to deadline, whether the job is at or ahead of the uniform
    rate (``done / total >= since_submit_s / window_s``)."""
    if total <= 0 or window_s <= 0:
        return False
    return done / total >= min(1.0, max(0.0, since_submit_s / window_s))
