"""What the controller knows of its jobs: the submitted spec, and the views the policy reads.

:class:`JobSubmission` is a job as submitted (stored as JSON in the store's ``jobs`` table;
the YAML job spec of ``coadapt submit`` maps onto it). :class:`JobBook` turns trainer reports
into what the decision core reads: profiles go to a :class:`~autoscaler.fitting.ModelBook`
(one fit per job and GPU type, refit together and warm-started only when a report changed a
fit), gradient statistics are kept per job, and :meth:`JobBook.view` builds each job's
:class:`~autoscaler.jobs.JobView` with its goodput models by GPU type.

A report carries no GPU type: it is the type of the instances the job is assigned to when the
report is read (a job runs on one GPU type at a time, the policies' rule).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from autoscaler.errors import InvalidInputError
from autoscaler.fitting import ModelBook
from autoscaler.goodput import BatchLimits, GoodputModel, GradParams, PerfParams, ProfileSample
from autoscaler.jobs import Allocation, JobView
from trainer.report import TrainerReport

__all__ = ["GENERIC_APPLICATION", "JobBook", "JobSubmission"]

GENERIC_APPLICATION = "generic"
"""The application name of a job whose model the speed table does not know (its speed on
other GPU types is the generic ratio)."""


@dataclass(frozen=True)
class JobSubmission:
    """A submitted job. ``min_gpus`` is the GPUs it runs on when it does not adapt. Batch
    sizes are totals across GPUs except ``*_local_bsz`` (per GPU). ``application`` names the
    model for the speed table (``generic``: unknown). ``adaptive`` false pins the batch at
    ``init_batch_size`` and the GPUs at ``min_gpus``."""

    name: str
    init_batch_size: int
    max_batch_size: int
    max_local_bsz: int
    min_local_bsz: int = 1
    min_gpus: int = 1
    application: str = GENERIC_APPLICATION
    adaptive: bool = True
    command: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidInputError("a job needs a non-empty name", field="name")
        for name in ("init_batch_size", "max_batch_size", "max_local_bsz", "min_local_bsz"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(
                    f"job {self.name}: {name} must be a positive integer, got {value!r}",
                    field=name,
                )
        if self.max_batch_size < self.init_batch_size:
            raise InvalidInputError(
                f"job {self.name}: max_batch_size < init_batch_size", field="max_batch_size"
            )
        if self.max_local_bsz < self.min_local_bsz:
            raise InvalidInputError(
                f"job {self.name}: max_local_bsz < min_local_bsz", field="max_local_bsz"
            )
        if isinstance(self.min_gpus, bool) or not isinstance(self.min_gpus, int):
            raise InvalidInputError(
                f"job {self.name}: min_gpus must be an integer", field="min_gpus"
            )
        if self.min_gpus < 1:
            raise InvalidInputError(f"job {self.name}: min_gpus must be >= 1", field="min_gpus")
        object.__setattr__(self, "command", tuple(self.command))

    @property
    def limits(self) -> BatchLimits:
        return BatchLimits(
            self.init_batch_size, self.max_batch_size, self.max_local_bsz, self.min_local_bsz
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSubmission:
        """Parse a stored spec; :class:`InvalidInputError` names the bad field."""
        try:
            data: Any = json.loads(text)
        except ValueError as e:
            raise InvalidInputError(f"job spec is not JSON: {e}", field="spec") from e
        if not isinstance(data, Mapping):
            raise InvalidInputError("job spec must be a JSON object", field="spec")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInputError(f"unknown job spec field {unknown[0]!r}", field=unknown[0])
        try:
            return cls(**data)
        except TypeError as e:
            raise InvalidInputError(f"job spec: {e}", field="spec") from e


@dataclass
class _Known:
    grad: GradParams | None = None
    max_gpus: int = 0
    max_nodes: int = 0
    models: dict[str, GoodputModel] | None = None


class JobBook:
    """Reports in, job views out (see the module docstring)."""

    def __init__(self, refit_tolerance: float = 0.05) -> None:
        self.models = ModelBook(refit_tolerance=refit_tolerance)
        self._known: dict[str, _Known] = {}

    def record(self, report: TrainerReport, gpu_type: str | None) -> bool:
        """Take one report of a job running on ``gpu_type`` (``None``: not placed now: only
        its gradient statistics are kept); whether it added a profile sample."""
        self.record_gradient(report)
        if gpu_type is None:
            return False
        added = False
        for p in report.profiles:
            if p.step_s <= 0 or p.num_replicas < p.num_nodes:
                continue  # a malformed entry: skipped, never fitted
            placement = _placement(p.num_replicas, p.num_nodes)
            sample = ProfileSample(
                placement, p.local_batch_size, p.accum_steps, p.step_s, min(p.sync_s, p.step_s)
            )
            added |= self.add_sample(report.job_id, gpu_type, sample)
        return added

    def record_gradient(self, report: TrainerReport) -> None:
        """Keep the report's gradient statistics (the latest win)."""
        known = self._known.setdefault(report.job_id, _Known())
        if report.gradient is not None:
            g = report.gradient
            if math.isfinite(g.grad_sqr) and math.isfinite(g.grad_var):
                known.grad = GradParams(g.grad_sqr, g.grad_var)

    def add_sample(self, job: str, gpu_type: str, sample: ProfileSample) -> bool:
        """One profile sample of ``job`` on ``gpu_type``; whether it was new."""
        known = self._known.setdefault(job, _Known())
        before = self.models.profile_size(job, gpu_type)
        self.models.record(job, gpu_type, sample)
        known.max_gpus = max(known.max_gpus, sample.num_gpus)
        known.max_nodes = max(known.max_nodes, sample.num_nodes)
        return (
            self.models.profile_size(job, gpu_type) != before or before == self.models.max_samples
        )

    def profile_json(self, job: str, gpu_type: str) -> str:
        """The profile of ``(job, gpu_type)`` as stored (the store's ``models`` row), with its
        fitted parameters when fitted."""
        perf = self.models.perf(job, gpu_type)
        return json.dumps(
            {
                "samples": [dataclasses.astuple(x) for x in self.models.samples(job, gpu_type)],
                "perf": None if perf is None else dataclasses.asdict(perf),
            },
            sort_keys=True,
        )

    def restore(self, job: str, gpu_type: str, profile_json: str) -> None:
        """Take back a profile written by :meth:`profile_json` (after a restart)."""
        data = json.loads(profile_json)
        samples = [
            ProfileSample(tuple(placement), local, accum, step, sync)
            for placement, local, accum, step, sync in data.get("samples", ())
        ]
        perf = data.get("perf")
        self.models.restore(job, gpu_type, samples, None if perf is None else PerfParams(**perf))
        known = self._known.setdefault(job, _Known())
        for sample in samples:
            known.max_gpus = max(known.max_gpus, sample.num_gpus)
            known.max_nodes = max(known.max_nodes, sample.num_nodes)

    def refit(self) -> int:
        """Refit the fits that reports changed (together, warm-started); how many."""
        return self.models.refit()

    def drop(self, name: str) -> None:
        """Forget a job that ended."""
        self.models.drop(name)
        self._known.pop(name, None)

    def view(
        self, spec: JobSubmission, submitted_at_s: float, now_s: float, allocation: Allocation
    ) -> JobView:
        """The job as the policy sees it now."""
        known = self._known.get(spec.name, _Known())
        models: dict[str, GoodputModel] = {}
        if known.grad is not None:
            for key in self.models.keys(spec.name):
                perf = self.models.perf(spec.name, key)
                if key is not None and perf is not None:
                    models[key] = GoodputModel(perf, known.grad, spec.limits)
        return JobView(
            name=spec.name,
            application=spec.application,
            submit_time_s=submitted_at_s,
            age_s=max(0.0, now_s - submitted_at_s),
            attained_gpu_s=0.0,
            num_restarts=0,
            allocation=allocation,
            limits=spec.limits,
            requested_gpus=spec.min_gpus,
            fixed_batch_size=spec.init_batch_size,
            max_profiled_gpus=known.max_gpus,
            max_profiled_nodes=known.max_nodes,
            models=models,
            adaptive=spec.adaptive,
        )


def _placement(gpus: int, nodes: int) -> tuple[int, ...]:
    """GPUs per node, as even as the counts allow (a report gives only the totals)."""
    base, extra = divmod(gpus, nodes)
    return tuple(base + 1 if i < extra else base for i in range(nodes))
