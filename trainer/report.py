"""The trainer → controller report: a typed, versioned payload, defined once, torch-free.

A running job's rank 0 sends a :class:`TrainerReport` every ``report_interval_s`` (default 30 s)
to the controller (``POST {controller_url}`` + :func:`report_path`) or, in standalone mode,
appends it as one JSON line to a local file. The controller answers with a :class:`ReportReply`.
Both sides import this module; it must never import torch (the controller does not have it).

Conventions shared with ``autoscaler.model.goodput``:

* Gradient statistics are expressed at the job's *initial* (total) batch size ``M0``:
  ``grad_sqr`` = |G|^2, the squared norm of the true gradient, and ``grad_var`` = the trace of the
  covariance of the mini-batch gradient at batch size ``M0`` (per-sample variance / ``M0``).
  For Adam-type optimisers both are measured on the preconditioned gradient.
* Progress is counted in initial-batch-size iterations (see :mod:`trainer.scaling`).
* **When a job is done** is one rule, :func:`is_done`, over that same unit: the script declares
  its length (``ElasticJob.epochs(total)`` declares ``total x samples per epoch / M0``, the
  progress ``total`` epochs make at ``M0``), the report carries it as ``target_progress``, and
  the job is done once ``progress`` reaches it (:func:`remaining_progress` is what is left). The
  trainer stops its loop by this rule, the controller derives each job's remaining work from
  it, and the simulator finishes its jobs by it. A job that declared nothing has no target:
  it ends when its script returns, and nobody knows how much is left.
* Profiles are cumulative over the life of one set of worker processes (one launch, identified
  by ``started_at_s``, the wall-clock start of rank 0); a new launch starts from zero. The
  controller keys them by ``(job_id, started_at_s)``. ``attempt`` counts launches of this job by
  its launcher (failure restarts and rescales alike).

Schema evolution: adding an optional field keeps ``SCHEMA_VERSION``; removing or changing the
meaning of a field bumps it. ``from_dict`` rejects any version it does not know.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.errors import ReportSchemaError

SCHEMA_VERSION = 1
"""Version of the report and reply payloads."""

REPORT_PATH_TEMPLATE = "/v1/jobs/{job_id}/reports"
"""HTTP path (relative to the controller URL) that receives ``POST`` reports."""


def report_path(job_id: str) -> str:
    """The path a job posts its reports to."""
    return REPORT_PATH_TEMPLATE.format(job_id=job_id)


DONE_TOLERANCE: float = 1e-9
"""Relative slack of :func:`is_done`: progress sums many per-step gains, so a job whose last
step lands exactly on its target may read a hair below it."""


def is_done(progress: float, target_progress: float | None) -> bool:
    """The one "done" rule (see the module docstring): a declared target is reached. A job
    without a target (``None``) is never done by this rule (its script decides)."""
    if target_progress is None:
        return False
    return progress >= target_progress * (1.0 - DONE_TOLERANCE)


def epochs_progress(epochs: float, num_samples: int, initial_batch_size: int) -> float | None:
    """The length of ``epochs`` passes over ``num_samples`` samples in the unit of progress:
    ``epochs x num_samples / initial_batch_size`` initial-batch-size iterations, the progress
    those epochs make at the initial batch size (``None`` for an empty length)."""
    if not (epochs > 0 and num_samples > 0):
        return None
    return epochs * num_samples / initial_batch_size


def remaining_progress(progress: float, target_progress: float | None) -> float | None:
    """Progress still to make before :func:`is_done` (``>= 0``, in initial-batch-size
    iterations); ``None`` when no target was declared."""
    if target_progress is None:
        return None
    return 0.0 if is_done(progress, target_progress) else max(0.0, target_progress - progress)


# --------------------------------------------------------------------------- helpers


def _get(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in data:
        raise ReportSchemaError(f"{where}: missing field {name!r}")
    value = data[name]
    # bool is an int subclass: never accept it where a number is expected, and vice versa.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ReportSchemaError(f"{where}.{name}: expected {kind}, got bool")
    if not isinstance(value, kind):
        raise ReportSchemaError(f"{where}.{name}: expected {kind}, got {type(value).__name__}")
    return value


def _get_float(data: Mapping[str, Any], name: str, where: str) -> float:
    value = float(_get(data, name, (int, float), where))
    if not math.isfinite(value):
        raise ReportSchemaError(f"{where}.{name}: not finite")
    return value


def _get_optional_float(
    data: Mapping[str, Any], name: str, where: str, *, positive: bool = False
) -> float | None:
    """An optional field: absent or ``null`` is ``None`` (a report of an older trainer)."""
    if data.get(name) is None:
        return None
    value = _get_float(data, name, where)
    if positive and not value > 0:
        raise ReportSchemaError(f"{where}.{name}: must be > 0, got {value}")
    return value


def _get_optional_bool(data: Mapping[str, Any], name: str, where: str) -> bool:
    """An optional flag: absent or ``null`` is false."""
    if data.get(name) is None:
        return False
    return bool(_get(data, name, bool, where))


def _get_int(data: Mapping[str, Any], name: str, where: str, minimum: int = 0) -> int:
    value = _get(data, name, int, where)
    if value < minimum:
        raise ReportSchemaError(f"{where}.{name}: {value} < {minimum}")
    return value


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class BatchConfig:
    """How one optimizer step is batched.

    ``global_batch_size`` samples (over all replicas) feed each optimizer step; each replica
    splits its share into ``accum_steps`` micro-batches whose gradients it accumulates before the
    gradient all-reduce. The split over replicas is done by the trainer and may be uneven when the
    batch does not divide evenly (the update is still the mean over the global batch).
    """

    global_batch_size: int
    accum_steps: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.global_batch_size, bool) or not isinstance(self.global_batch_size, int):
            raise ReportSchemaError("BatchConfig.global_batch_size must be an int")
        if isinstance(self.accum_steps, bool) or not isinstance(self.accum_steps, int):
            raise ReportSchemaError("BatchConfig.accum_steps must be an int")
        if self.global_batch_size < 1:
            raise ReportSchemaError(f"BatchConfig.global_batch_size {self.global_batch_size} < 1")
        if self.accum_steps < 1:
            raise ReportSchemaError(f"BatchConfig.accum_steps {self.accum_steps} < 1")

    def local_batch_size(self, world_size: int) -> int:
        """Largest micro-batch a replica runs (samples per replica per micro-step)."""
        per_replica = -(-self.global_batch_size // world_size)
        return -(-per_replica // self.accum_steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "batch") -> BatchConfig:
        return cls(
            global_batch_size=_get_int(data, "global_batch_size", where, 1),
            accum_steps=_get_int(data, "accum_steps", where, 1),
        )


@dataclass(frozen=True)
class ProfileEntry:
    """Mean step timing for one configuration, over ``steps`` measured optimizer steps.

    ``step_s`` is the wall time between consecutive optimizer-step ends (data loading, all
    micro-steps' forward/backward, exposed gradient sync, optimizer update). ``sync_s`` is the
    exposed gradient-synchronisation time: from the moment the last gradient bucket was ready to
    the end of the backward pass (all-reduce time not hidden behind compute).
    ``compute_s = step_s - sync_s``. The first steps after each (re)configuration are not counted.
    """

    num_nodes: int
    num_replicas: int
    local_batch_size: int
    accum_steps: int
    steps: int
    step_s: float
    compute_s: float
    sync_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> ProfileEntry:
        return cls(
            num_nodes=_get_int(data, "num_nodes", where, 1),
            num_replicas=_get_int(data, "num_replicas", where, 1),
            local_batch_size=_get_int(data, "local_batch_size", where, 1),
            accum_steps=_get_int(data, "accum_steps", where, 1),
            steps=_get_int(data, "steps", where, 1),
            step_s=_get_float(data, "step_s", where),
            compute_s=_get_float(data, "compute_s", where),
            sync_s=_get_float(data, "sync_s", where),
        )


@dataclass(frozen=True)
class GradientStats:
    """Smoothed gradient statistics at the initial batch size (see module docstring).

    ``grad_sqr`` may be reported as a small or even negative number early on or when the noise
    dominates: it is an unbiased estimate, not clamped. ``noise_scale`` clamps for convenience.
    """

    initial_batch_size: int
    grad_sqr: float
    grad_var: float
    measurements: int
    preconditioned: bool

    @property
    def noise_scale(self) -> float:
        """Gradient noise scale phi = M0 * grad_var / grad_sqr (inf when grad_sqr <= 0)."""
        if self.grad_sqr <= 0.0:
            return math.inf
        return self.initial_batch_size * max(self.grad_var, 0.0) / self.grad_sqr

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "gradient") -> GradientStats:
        return cls(
            initial_batch_size=_get_int(data, "initial_batch_size", where, 1),
            grad_sqr=_get_float(data, "grad_sqr", where),
            grad_var=_get_float(data, "grad_var", where),
            measurements=_get_int(data, "measurements", where, 0),
            preconditioned=_get(data, "preconditioned", bool, where),
        )


@dataclass(frozen=True)
class JobHints:
    """Limits the user gave for batch-size decisions (``None`` = no limit)."""

    initial_batch_size: int
    max_batch_size: int | None = None
    min_local_batch_size: int | None = None
    max_local_batch_size: int | None = None
    max_accum_steps: int | None = None
    scaling_rule: str = "adascale"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "hints") -> JobHints:
        def optional(name: str) -> int | None:
            if data.get(name) is None:
                return None
            return _get_int(data, name, where, 1)

        return cls(
            initial_batch_size=_get_int(data, "initial_batch_size", where, 1),
            max_batch_size=optional("max_batch_size"),
            min_local_batch_size=optional("min_local_batch_size"),
            max_local_batch_size=optional("max_local_batch_size"),
            max_accum_steps=optional("max_accum_steps"),
            scaling_rule=_get(data, "scaling_rule", str, where),
        )


@dataclass(frozen=True)
class TrainerReport:
    """One periodic report from a job's rank 0.

    ``step`` counts optimizer steps (attempted, including skipped ones), ``skipped_steps`` those
    whose gradients were not finite, ``progress`` initial-batch-size iterations, ``epoch`` and
    ``epoch_position`` the data position (samples of ``epoch`` already consumed).

    Optional fields (absent in an older trainer's reports): ``target_progress``, the length the
    script declared, in the unit of ``progress`` (``None``: undeclared; see :func:`is_done`);
    ``done``, the script finished training (its final checkpoint is saved: nothing is left to
    run); ``lr_scale``, the factor the scaling rule applied to the learning rate on the last
    applied step (``None`` before the first); ``checkpoint_progress``, the ``progress`` of the
    newest checkpoint this run has saved or resumed from (``None``: none yet; a run stopped
    now would resume there, losing ``progress - checkpoint_progress``).
    """

    job_id: str
    attempt: int
    started_at_s: float
    sent_at_s: float
    world_size: int
    num_nodes: int
    batch: BatchConfig
    step: int
    skipped_steps: int
    epoch: int
    epoch_position: int
    progress: float
    gradient: GradientStats | None
    profiles: tuple[ProfileEntry, ...]
    hints: JobHints
    standalone: bool = False
    target_progress: float | None = None
    done: bool = False
    lr_scale: float | None = None
    checkpoint_progress: float | None = None
    schema_version: int = field(default=SCHEMA_VERSION)

    @property
    def remaining_progress(self) -> float | None:
        """:func:`remaining_progress` of this report (``None``: no declared length)."""
        return remaining_progress(self.progress, self.target_progress)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "started_at_s": self.started_at_s,
            "sent_at_s": self.sent_at_s,
            "world_size": self.world_size,
            "num_nodes": self.num_nodes,
            "batch": self.batch.to_dict(),
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "epoch": self.epoch,
            "epoch_position": self.epoch_position,
            "progress": self.progress,
            "gradient": None if self.gradient is None else self.gradient.to_dict(),
            "profiles": [p.to_dict() for p in self.profiles],
            "hints": self.hints.to_dict(),
            "standalone": self.standalone,
            "target_progress": self.target_progress,
            "done": self.done,
            "lr_scale": self.lr_scale,
            "checkpoint_progress": self.checkpoint_progress,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainerReport:
        where = "report"
        if not isinstance(data, Mapping):
            raise ReportSchemaError("report: expected a JSON object")
        version = _get_int(data, "schema_version", where, 1)
        if version != SCHEMA_VERSION:
            raise ReportSchemaError(f"report: schema_version {version} != {SCHEMA_VERSION}")
        gradient = data.get("gradient")
        profiles = _get(data, "profiles", list, where)
        progress = _get_float(data, "progress", where)
        saved = _get_optional_float(data, "checkpoint_progress", where)
        if saved is not None and not 0 <= saved <= progress:
            raise ReportSchemaError(
                f"{where}.checkpoint_progress: {saved} is not within [0, progress {progress}]"
            )
        return cls(
            schema_version=version,
            job_id=_get(data, "job_id", str, where),
            attempt=_get_int(data, "attempt", where),
            started_at_s=_get_float(data, "started_at_s", where),
            sent_at_s=_get_float(data, "sent_at_s", where),
            world_size=_get_int(data, "world_size", where, 1),
            num_nodes=_get_int(data, "num_nodes", where, 1),
            batch=BatchConfig.from_dict(_get(data, "batch", Mapping, where)),
            step=_get_int(data, "step", where),
            skipped_steps=_get_int(data, "skipped_steps", where),
            epoch=_get_int(data, "epoch", where),
            epoch_position=_get_int(data, "epoch_position", where),
            progress=progress,
            gradient=None if gradient is None else GradientStats.from_dict(gradient),
            profiles=tuple(
                ProfileEntry.from_dict(p, f"profiles[{i}]") for i, p in enumerate(profiles)
            ),
            hints=JobHints.from_dict(_get(data, "hints", Mapping, where)),
            standalone=bool(data.get("standalone", False)),
            target_progress=_get_optional_float(data, "target_progress", where, positive=True),
            done=_get_optional_bool(data, "done", where),
            lr_scale=_get_optional_float(data, "lr_scale", where, positive=True),
            checkpoint_progress=saved,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> TrainerReport:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ReportSchemaError(f"report: invalid JSON: {e}") from e
        return cls.from_dict(data)


@dataclass(frozen=True)
class ReportReply:
    """The controller's answer to a report.

    ``batch``: the batch configuration to use from the next step the ranks agree on, without a
    restart (``None`` = keep; :mod:`trainer.stepping`, "Batch changes").
    ``stop``: checkpoint and stop now (all ranks agree on a step, save once, exit).
    """

    batch: BatchConfig | None = None
    stop: bool = False
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema_version": self.schema_version,
                "batch": None if self.batch is None else self.batch.to_dict(),
                "stop": self.stop,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> ReportReply:
        """Parse a reply; an empty body means "no instructions"."""
        if not text or not str(text if isinstance(text, str) else text.decode()).strip():
            return cls()
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ReportSchemaError(f"reply: invalid JSON: {e}") from e
        if not isinstance(data, Mapping):
            raise ReportSchemaError("reply: expected a JSON object")
        version = _get_int(data, "schema_version", "reply", 1)
        if version != SCHEMA_VERSION:
            raise ReportSchemaError(f"reply: schema_version {version} != {SCHEMA_VERSION}")
        batch = data.get("batch")
        stop = data.get("stop", False)
        if not isinstance(stop, bool):
            raise ReportSchemaError("reply.stop: expected bool")
        return cls(
            batch=None if batch is None else BatchConfig.from_dict(batch, "reply.batch"),
            stop=stop,
            schema_version=version,
        )
