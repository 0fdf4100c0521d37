"""GPU types: relative speeds, interconnects, and goodput estimates for unprofiled types.

A job trains on one GPU type at a time. Its throughput model is fitted per (job, GPU type) from
its own profiles on that type (:mod:`autoscaler.model.goodput`). For a type the job has not run on,
:func:`estimate_model` derives one from a type it has run on with **the ratio rule**:

    compute time on the target type = compute time on the source type / r,
    r = relative_speed(target) / relative_speed(source)          (single-GPU compute speeds)
    sync time: carried to the target's links (the interconnect is the instance's, not the GPU's)

i.e. ``alpha_c`` and ``beta_c`` are divided by ``r``; the intra-node sync parameters are
multiplied by the intra-node factor and the inter-node ones by the network factor of
:func:`autoscaler.model.interconnects.sync_factors` (each type on its usual instance: T4 on
g4dn.12xlarge, V100 on p3.16xlarge, A100 on p4d.24xlarge); ``gamma`` is kept. The estimate is
exact when the job's true compute speeds follow the ratio and its sync follows the links (tested).
How far real jobs stray from one ratio per type is made explicit:
:attr:`TypeEstimate.relative_uncertainty` is ``exp(sd) - 1`` where ``sd`` is the spread (sample
standard deviation of the log) of the per-model ratios the speeds were computed from, combined
over target and source. A policy may use it to decide when exploring a type is worth a restart.

A job fitted on several types is fitted on each from that type's profiles alone, so a type it
has only run on one GPU still has its sync at the fit's prior (about zero: perfect scaling).
:func:`estimate_model` therefore returns a fitted model with each sync parameter raised to the
largest that the job's other fits carry to its links (a job that scaled poorly across p4d's
400 Gb/s is not taken to scale perfectly across p3's 25 Gb/s because it ran one V100).

:class:`SpeedTable` holds the measured per-model ratios of ``speed_vs_t4.csv`` (derived from the
Sia paper's per-type measurements) and the generic per-type speed (geometric mean over the
models, excluding rows flagged as not representative). Loading reads a file; everything else in
this module is pure.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.model.goodput import BatchLimits, GoodputModel, PerfParams
from autoscaler.model.interconnects import sync_factors
from autoscaler.model.traces import parse_float, parse_int, read_csv_rows

__all__ = [
    "KNOWN_GPU_TYPES",
    "REFERENCE_GPU_TYPE",
    "SpeedRow",
    "SpeedTable",
    "TypeEstimate",
    "default_speed_table",
    "estimate_model",
    "load_speed_table",
]

#: The GPU type the Pollux traces were measured on (AWS g4dn.12xlarge).
REFERENCE_GPU_TYPE = "T4"

#: GPU model names coadapt knows (as in the price catalogues); anything else is a typo.
KNOWN_GPU_TYPES: tuple[str, ...] = (
    "A100",
    "A10G",
    "H100",
    "H200",
    "L4",
    "L40S",
    "T4",
    "V100",
)

_SPEED_COLUMNS = (
    "model",
    "gpu_type",
    "best_1gpu_samples_per_s_vs_t4",
    "max_local_bsz_measured",
    "max_local_bsz_measured_t4",
)


@dataclass(frozen=True)
class SpeedRow:
    """One measured (model, GPU type): single-GPU speed relative to the T4 trace and the largest
    per-GPU batch measured on that type. ``usable`` is false for rows flagged in the file's
    ``note`` column as not representative (e.g. an input-bound host)."""

    model: str
    gpu_type: str
    speed_vs_t4: float
    max_local_bsz: int
    usable: bool = True


@dataclass(frozen=True)
class SpeedTable:
    """Per-model and generic speeds of GPU types relative to :data:`REFERENCE_GPU_TYPE`.

    ``rows`` maps ``(model, gpu_type)`` to its :class:`SpeedRow`. The reference type has speed
    1 and spread 0 by definition.
    """

    rows: Mapping[tuple[str, str], SpeedRow] = field(default_factory=dict)
    source: str = "<memory>"

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", MappingProxyType(dict(self.rows)))
        object.__setattr__(self, "_memo", {})  # (method, type) -> value; rows never change

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """Types with a speed: the reference and every type with at least one usable row."""
        types = {t for (_, t), row in self.rows.items() if row.usable}
        return tuple(sorted(types | {REFERENCE_GPU_TYPE}))

    def has_type(self, gpu_type: str) -> bool:
        return gpu_type in self.gpu_types

    def _usable(self, gpu_type: str) -> list[SpeedRow]:
        return [r for (_, t), r in self.rows.items() if t == gpu_type and r.usable]

    def relative_speed(self, gpu_type: str) -> float:
        """Generic single-GPU speed of ``gpu_type`` vs the reference: the geometric mean of the
        usable per-model ratios. Raises :class:`InvalidInputError` for a type without any."""
        if gpu_type == REFERENCE_GPU_TYPE:
            return 1.0
        memo: dict[tuple[str, str], float] = self._memo  # type: ignore[attr-defined]
        hit = memo.get(("speed", gpu_type))
        if hit is not None:
            return hit
        rows = self._usable(gpu_type)
        if not rows:
            raise InvalidInputError(
                f"no speed known for GPU type {gpu_type!r} (in {self.source})", field="gpu_type"
            )
        memo[("speed", gpu_type)] = math.exp(sum(math.log(r.speed_vs_t4) for r in rows) / len(rows))
        return memo[("speed", gpu_type)]

    def log_spread(self, gpu_type: str) -> float:
        """Sample standard deviation of the log per-model ratios of ``gpu_type`` (0 for the
        reference type or a single row)."""
        if gpu_type == REFERENCE_GPU_TYPE:
            return 0.0
        logs = [math.log(r.speed_vs_t4) for r in self._usable(gpu_type)]
        if len(logs) < 2:
            return 0.0
        mean = sum(logs) / len(logs)
        return math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))

    def model_speed(self, model: str, gpu_type: str) -> float:
        """Speed of ``gpu_type`` vs the reference for one model: its own usable row, else the
        generic :meth:`relative_speed`."""
        if gpu_type == REFERENCE_GPU_TYPE:
            return 1.0
        row = self.rows.get((model, gpu_type))
        if row is not None and row.usable:
            return row.speed_vs_t4
        return self.relative_speed(gpu_type)

    def max_local_bsz(self, model: str, gpu_type: str) -> int | None:
        """Largest per-GPU batch measured for ``model`` on ``gpu_type`` (``None`` if unknown).
        The batch limit is a memory fact, so a flagged (slow-host) row still gives it."""
        row = self.rows.get((model, gpu_type))
        return None if row is None else row.max_local_bsz


def load_speed_table(path: str | Path) -> SpeedTable:
    """Read a ``speed_vs_t4.csv`` (columns matched by header name, any order). Raises
    :class:`TraceFormatError` naming the file, line and field on a missing column or value, a
    non-positive speed or batch, an unknown GPU type, or a duplicate (model, type) row."""
    path = Path(path)
    flagged = _flagged(path)
    rows: dict[tuple[str, str], SpeedRow] = {}
    for line, row in read_csv_rows(path, _SPEED_COLUMNS):
        gpu_type = row["gpu_type"]
        if gpu_type not in KNOWN_GPU_TYPES:
            raise TraceFormatError(
                f"unknown GPU type {gpu_type!r}; known: {', '.join(KNOWN_GPU_TYPES)}",
                path=str(path),
                line=line,
                field="gpu_type",
            )
        name = "best_1gpu_samples_per_s_vs_t4"
        speed = parse_float(row[name], path=path, line=line, name=name)
        if speed <= 0:
            raise TraceFormatError("speed must be > 0", path=str(path), line=line, field=name)
        name = "max_local_bsz_measured"
        bsz = parse_int(row[name], path=path, line=line, name=name, minimum=1)
        key = (row["model"], gpu_type)
        if key in rows:
            raise TraceFormatError(
                f"duplicate row for {key[0]} on {key[1]}", path=str(path), line=line, field="model"
            )
        rows[key] = SpeedRow(key[0], gpu_type, speed, bsz, usable=key not in flagged)
    return SpeedTable(rows, source=str(path))


def _flagged(path: Path) -> set[tuple[str, str]]:
    """(model, gpu_type) rows whose optional ``note`` column says not to use them as a speed."""
    try:
        handle = open(path, newline="")  # noqa: SIM115 - closed below
    except OSError:
        return set()  # read_csv_rows reports it with the file name
    with handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or "note" not in [f.strip() for f in reader.fieldnames]:
            return set()
        out = set()
        for r in reader:
            note = {k.strip(): (v or "").strip() for k, v in r.items() if k}.get("note", "")
            if "do not use" in note.lower():
                out.add(((r.get("model") or "").strip(), (r.get("gpu_type") or "").strip()))
        return out


@functools.cache
def default_speed_table() -> SpeedTable:
    """The table shipped with coadapt (``autoscaler/data/gpu-types/speed_vs_t4.csv``), read
    once per process."""
    return load_speed_table(
        Path(__file__).resolve().parents[1] / "data" / "gpu-types" / "speed_vs_t4.csv"
    )


@dataclass(frozen=True)
class TypeEstimate:
    """A job's goodput model on one GPU type, fitted or estimated.

    ``source_type`` is ``None`` when the model was fitted on ``gpu_type`` itself; otherwise the
    type it was derived from with the ratio rule, ``speed_ratio`` the compute-speed ratio applied
    (target / source) and ``relative_uncertainty`` the one-sigma relative error expected of that
    ratio (0 for a fitted model)."""

    gpu_type: str
    model: GoodputModel
    source_type: str | None = None
    speed_ratio: float = 1.0
    relative_uncertainty: float = 0.0

    @property
    def profiled(self) -> bool:
        return self.source_type is None


def limits_on(
    limits: BatchLimits, application: str, gpu_type: str, speeds: SpeedTable
) -> BatchLimits:
    """A job's batch limits on ``gpu_type``: ``limits`` (its own, on the reference type) with
    the per-GPU batch measured for ``application`` on that type when ``speeds`` knows it (a
    memory fact: a bigger GPU holds a bigger micro-batch)."""
    if gpu_type == REFERENCE_GPU_TYPE:
        return limits
    measured = speeds.max_local_bsz(application, gpu_type)
    if measured is None:
        return limits
    return replace(limits, max_local_bsz=max(limits.min_local_bsz, measured))


def estimate_model(
    models: Mapping[str, GoodputModel],
    gpu_type: str,
    speeds: SpeedTable,
    *,
    limits: BatchLimits | None = None,
) -> TypeEstimate:
    """The job's model on ``gpu_type`` (see the module docstring for the rule).

    ``models`` are the job's fitted models by GPU type. If ``gpu_type`` is among them it is
    returned as fitted, its sync raised to what the other fits carry (see the module
    docstring). Otherwise the source is the fitted type closest in generic speed to the
    target (ties: by name), and ``limits`` (the job's batch limits on the target type, e.g. a
    larger per-GPU batch on a bigger GPU) replace the source's if given. Raises
    :class:`InvalidInputError` when ``models`` is empty or a type has no speed.
    """
    fitted = models.get(gpu_type)
    if fitted is not None:
        return TypeEstimate(gpu_type, _with_sync_floor(fitted, gpu_type, models))
    if not models:
        raise InvalidInputError("no fitted model to estimate from", field="models")
    target = speeds.relative_speed(gpu_type)
    source = min(models, key=lambda t: (abs(math.log(target / speeds.relative_speed(t))), t))
    ratio = target / speeds.relative_speed(source)
    base = models[source]
    perf = replace(base.perf, alpha_c=base.perf.alpha_c / ratio, beta_c=base.perf.beta_c / ratio)
    perf = _scaled_sync(perf, base.perf, *sync_factors(source, gpu_type))
    sd = math.hypot(speeds.log_spread(gpu_type), speeds.log_spread(source))
    model = GoodputModel(perf, base.grad, limits if limits is not None else base.limits)
    return TypeEstimate(gpu_type, model, source, ratio, math.exp(sd) - 1.0)


def _with_sync_floor(
    fitted: GoodputModel, gpu_type: str, models: Mapping[str, GoodputModel]
) -> GoodputModel:
    """``fitted`` with each sync parameter raised to the largest of the job's other types' fits,
    carried to ``gpu_type``'s links (:func:`~autoscaler.model.interconnects.sync_factors`)."""
    perf = fitted.perf
    for other, model in models.items():
        if other != gpu_type:
            carried = _scaled_sync(perf, model.perf, *sync_factors(other, gpu_type))
            perf = replace(
                perf, **{name: max(getattr(perf, name), getattr(carried, name)) for name in _SYNC}
            )
    if perf == fitted.perf:
        return fitted
    return GoodputModel(perf, fitted.grad, fitted.limits)


#: The sync parameters of :class:`~autoscaler.model.goodput.PerfParams`.
_SYNC = ("alpha_n", "beta_n", "alpha_r", "beta_r")


def _scaled_sync(perf: PerfParams, source: PerfParams, intra: float, inter: float) -> PerfParams:
    """``perf`` with the sync parameters of ``source``, intra-node ones times ``intra`` and
    inter-node ones times ``inter`` (inter-node kept at least the intra-node, as fits keep
    them)."""
    alpha_n, beta_n = source.alpha_n * intra, source.beta_n * intra
    return replace(
        perf,
        alpha_n=alpha_n,
        beta_n=beta_n,
        alpha_r=max(source.alpha_r * inter, alpha_n),
        beta_r=max(source.beta_r * inter, beta_n),
    )
