"""Access to the measured traces of the Pollux paper's six training jobs.

One :class:`AppTrace` per application is loaded from ``data_root()/traces/<name>/`` and cached by
:func:`load_app`. It answers the two questions a trace-driven simulator asks about a job:

- **How long does one iteration take** at a placement (GPUs per node) and per-GPU micro-batch?
  :meth:`AppTrace.step_time_s` — interpolated from ``placements.csv`` and ``scalability.csv``.
- **What are the true gradient statistics** at a statistical progress and total batch size?
  :meth:`AppTrace.grad_stats` — interpolated from ``validation-<M>.csv``.

and, built on the second, how statistical progress relates to real iterations at a fixed batch
size (:meth:`AppTrace.progress_curve`), which is what the simulator integrates and what an oracle
baseline uses to know a job's remaining iterations.

Units: seconds (``_s``), batch sizes in samples, progress in initial-batch-size iterations
(one unit = one iteration at batch size ``M0`` under AdaScale).

Every malformed trace file fails with :class:`~autoscaler.errors.TraceFormatError` naming the
file, the 1-based line and the field. This module does file I/O only when loading; the query
methods are pure and deterministic.
"""

from __future__ import annotations

import csv
import functools
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.errors import InvalidInputError, TraceFormatError

__all__ = [
    "APPLICATIONS",
    "DATA_DIR_ENV",
    "AppTrace",
    "ProgressCurve",
    "ThroughputRow",
    "ValidationTrace",
    "data_root",
    "even_placement",
    "has_type_traces",
    "load_app",
    "parse_float",
    "parse_int",
    "read_csv_rows",
    "traces_folder",
]

#: The six measured applications, in alphabetical order.
APPLICATIONS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

#: Environment variable that overrides :func:`data_root`.
DATA_DIR_ENV = "COADAPT_DATA_DIR"

# Number of epochs each job trains for (the paper's setup); its target progress is the progress
# recorded at the end of the last of these epochs.
_MAX_EPOCHS: Mapping[str, int] = {
    "bert": 2,
    "cifar10": 100,
    "deepspeech2": 80,
    "imagenet": 90,
    "ncf": 10,
    "yolov3": 50,
}
# Per-GPU micro-batch caps tighter than the largest measured one (GPU memory).
_MAX_LOCAL_BSZ_OVERRIDE: Mapping[str, int] = {"yolov3": 8}

# Sub-intervals per epoch of the progress grid on which progress curves are tabulated.
_CURVE_POINTS_PER_EPOCH = 8

_VALIDATION_NAME = re.compile(r"^validation-(\d+)\.csv$")


def data_root() -> Path:
    """The Pollux data folder: ``$COADAPT_DATA_DIR`` if set, else the package's copy.

    The folder holds ``traces/``, ``workloads/``, ``workloads-0.5/`` and ``reference/``.
    """
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[1] / "data" / "pollux"


# --------------------------------------------------------------------------------------------
# Rows and parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ThroughputRow:
    """One measured throughput sample.

    ``placement`` is GPUs per node, sorted descending (``(2, 1)`` = one node with 2 GPUs and one
    with 1); ``step_time_s`` is the time of one iteration at per-GPU batch ``local_bsz``, of
    which ``sync_time_s`` is gradient synchronisation; ``source`` names the file the row came
    from (``"placements"`` or ``"scalability"``).
    """

    placement: tuple[int, ...]
    local_bsz: int
    step_time_s: float
    sync_time_s: float
    source: str

    @property
    def num_nodes(self) -> int:
        return len(self.placement)

    @property
    def num_gpus(self) -> int:
        return sum(self.placement)


def even_placement(num_nodes: int, num_gpus: int) -> tuple[int, ...]:
    """``num_gpus`` spread as evenly as possible over ``num_nodes``, sorted descending.

    ``even_placement(6, 7) == (2, 1, 1, 1, 1, 1)``. Requires ``1 <= num_nodes <= num_gpus``.
    """
    if num_nodes < 1 or num_gpus < num_nodes:
        raise InvalidInputError(
            f"cannot place {num_gpus} GPUs on {num_nodes} nodes", field="num_nodes"
        )
    base, extra = divmod(num_gpus, num_nodes)
    return tuple([base + 1] * extra + [base] * (num_nodes - extra))


def read_csv_rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line_number, row)`` for each data row of a CSV file with a header line.

    Checks that every name in ``columns`` is in the header (else :class:`TraceFormatError` on
    line 1) and that each row has no missing cell in those columns. Blank lines are skipped. A
    file that is not UTF-8 text (or holds NUL bytes) is a :class:`TraceFormatError` too.
    """
    spath = str(path)
    try:
        handle = open(path, newline="")  # noqa: SIM115 - closed in finally below
    except OSError as e:
        raise TraceFormatError(f"cannot read file: {e.strerror}", path=spath) from e
    try:
        yield from _csv_rows(handle, spath, columns)
    except (UnicodeDecodeError, csv.Error) as e:
        raise TraceFormatError(f"not a CSV text file ({e})", path=spath) from e
    finally:
        handle.close()


def _csv_rows(
    handle: Iterable[str], spath: str, columns: Sequence[str]
) -> Iterator[tuple[int, dict[str, str]]]:
    reader = csv.reader(handle)
    try:
        header = next(reader)
    except StopIteration:
        raise TraceFormatError("empty file (no header)", path=spath, line=1) from None
    header = [name.strip() for name in header]
    for name in columns:
        if name not in header:
            raise TraceFormatError(
                f"missing column {name!r} (header: {','.join(header)})",
                path=spath,
                line=1,
                field=name,
            )
    index = {name: header.index(name) for name in columns}
    for cells in reader:
        line = reader.line_num
        if not cells or all(not c.strip() for c in cells):
            continue
        row: dict[str, str] = {}
        for name, i in index.items():
            if i >= len(cells) or not cells[i].strip():
                raise TraceFormatError("missing value", path=spath, line=line, field=name)
            row[name] = cells[i].strip()
        yield line, row


def parse_float(text: str, *, path: Path, line: int, name: str) -> float:
    """A finite, non-negative float, or :class:`TraceFormatError`."""
    try:
        value = float(text)
    except ValueError:
        raise TraceFormatError(
            f"not a number: {text!r}", path=str(path), line=line, field=name
        ) from None
    if not math.isfinite(value):
        raise TraceFormatError(f"not finite: {text!r}", path=str(path), line=line, field=name)
    if value < 0:
        raise TraceFormatError(f"negative: {text!r}", path=str(path), line=line, field=name)
    return value


def parse_int(text: str, *, path: Path, line: int, name: str, minimum: int = 0) -> int:
    """An integer >= ``minimum`` (``"12.0"`` accepted), or :class:`TraceFormatError`."""
    value = parse_float(text, path=path, line=line, name=name)
    if value != int(value):
        raise TraceFormatError(f"not an integer: {text!r}", path=str(path), line=line, field=name)
    if value < minimum:
        raise TraceFormatError(
            f"must be >= {minimum}: {text!r}", path=str(path), line=line, field=name
        )
    return int(value)


def _parse_placement(text: str, *, path: Path, line: int) -> tuple[int, ...]:
    if not text.isdigit() or "0" in text:
        raise TraceFormatError(
            f"placement must be digits 1-9 (GPUs per node): {text!r}",
            path=str(path),
            line=line,
            field="placement",
        )
    return tuple(sorted((int(c) for c in text), reverse=True))


def _read_placements(path: Path) -> list[ThroughputRow]:
    cols = ("placement", "local_bsz", "step_time", "sync_time")
    rows = []
    for line, raw in read_csv_rows(path, cols):
        placement = _parse_placement(raw["placement"], path=path, line=line)
        rows.append(_make_row(path, line, raw, placement, "placements"))
    return rows


def _read_scalability(path: Path) -> list[ThroughputRow]:
    cols = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
    rows = []
    for line, raw in read_csv_rows(path, cols):
        nodes = parse_int(raw["num_nodes"], path=path, line=line, name="num_nodes", minimum=1)
        gpus = parse_int(raw["num_replicas"], path=path, line=line, name="num_replicas")
        if gpus < nodes:
            raise TraceFormatError(
                f"num_replicas {gpus} < num_nodes {nodes}",
                path=str(path),
                line=line,
                field="num_replicas",
            )
        rows.append(_make_row(path, line, raw, even_placement(nodes, gpus), "scalability"))
    return rows


def _make_row(
    path: Path, line: int, raw: dict[str, str], placement: tuple[int, ...], source: str
) -> ThroughputRow:
    local_bsz = parse_int(raw["local_bsz"], path=path, line=line, name="local_bsz", minimum=1)
    step = parse_float(raw["step_time"], path=path, line=line, name="step_time")
    sync = parse_float(raw["sync_time"], path=path, line=line, name="sync_time")
    if step <= 0:
        raise TraceFormatError(
            "step_time must be > 0", path=str(path), line=line, field="step_time"
        )
    return ThroughputRow(placement, local_bsz, step, min(sync, step), source)


@dataclass(frozen=True, eq=False)
class ValidationTrace:
    """One ``validation-<M>.csv``: a training run at total batch size ``batch_size``.

    Arrays are indexed by epoch (row); ``progress[i]`` is the statistical progress at the end of
    epoch ``i`` (strictly increasing), ``grad_sqr[i]``/``grad_var[i]`` the gradient statistics
    measured during that epoch.
    """

    batch_size: int
    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


def _read_validation(path: Path, batch_size: int) -> ValidationTrace:
    cols = ("progress", "iteration", "metric", "grad_sqr", "grad_var")
    values: dict[str, list[float]] = {c: [] for c in cols}
    prev_progress = 0.0
    for line, raw in read_csv_rows(path, cols):
        for c in cols:
            if c == "metric":  # A metric may legitimately be negative (a loss, a log-prob).
                try:
                    v = float(raw[c])
                except ValueError:
                    raise TraceFormatError(
                        f"not a number: {raw[c]!r}", path=str(path), line=line, field=c
                    ) from None
                if not math.isfinite(v):
                    raise TraceFormatError(
                        f"not finite: {raw[c]!r}", path=str(path), line=line, field=c
                    )
            else:
                v = parse_float(raw[c], path=path, line=line, name=c)
            values[c].append(v)
        if values["progress"][-1] <= prev_progress:
            raise TraceFormatError(
                "progress must increase from row to row",
                path=str(path),
                line=line,
                field="progress",
            )
        if values["grad_sqr"][-1] + values["grad_var"][-1] <= 0:
            raise TraceFormatError(
                "grad_sqr and grad_var are both 0", path=str(path), line=line, field="grad_var"
            )
        prev_progress = values["progress"][-1]
    if not values["progress"]:
        raise TraceFormatError("no data rows", path=str(path), line=2)
    arrays = {c: np.asarray(v, dtype=float) for c, v in values.items()}
    for arr in arrays.values():
        arr.setflags(write=False)
    return ValidationTrace(batch_size=batch_size, **arrays)


# --------------------------------------------------------------------------------------------
# Interpolation helpers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class _BszCurve:
    """Step and sync time over measured per-GPU batch sizes, for one configuration."""

    local_bsz: np.ndarray  # increasing, unique
    step_time_s: np.ndarray
    sync_time_s: np.ndarray

    def at(self, local_bsz: float) -> tuple[float, float]:
        """Linear interpolation inside the measured range; outside it, the rule of
        :meth:`AppTrace.step_time_s`: below, the smallest batch's times; above, sync time held
        and compute time grown in proportion to the batch."""
        b = self.local_bsz
        if local_bsz <= b[0]:
            return float(self.step_time_s[0]), float(self.sync_time_s[0])
        if local_bsz >= b[-1]:
            sync = float(self.sync_time_s[-1])
            compute = float(self.step_time_s[-1]) - sync
            return sync + compute * local_bsz / float(b[-1]), sync
        step = float(np.interp(local_bsz, b, self.step_time_s))
        sync = float(np.interp(local_bsz, b, self.sync_time_s))
        return step, min(sync, step)

    def at_many(self, local_bsz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`at` of each of ``local_bsz`` (float array), the same numbers."""
        b = self.local_bsz
        x = np.asarray(local_bsz, dtype=float)
        step = np.interp(x, b, self.step_time_s)
        sync = np.minimum(np.interp(x, b, self.sync_time_s), step)
        high = x >= b[-1]
        top_sync = float(self.sync_time_s[-1])
        top_compute = float(self.step_time_s[-1]) - top_sync
        step[high] = top_sync + top_compute * x[high] / float(b[-1])
        sync[high] = top_sync
        low = x <= b[0]
        step[low], sync[low] = self.step_time_s[0], self.sync_time_s[0]
        return step, sync


def _curves_by_key(
    rows: Sequence[ThroughputRow], key_fn: object
) -> dict[tuple[int, ...], _BszCurve]:
    """Group rows by ``key_fn(row)``, averaging duplicate (key, local_bsz) measurements."""
    groups: dict[tuple[int, ...], dict[int, list[tuple[float, float]]]] = {}
    for row in rows:
        key = key_fn(row)  # type: ignore[operator]
        groups.setdefault(key, {}).setdefault(row.local_bsz, []).append(
            (row.step_time_s, row.sync_time_s)
        )
    curves = {}
    for key, by_bsz in groups.items():
        bszs = sorted(by_bsz)
        step = [float(np.mean([s for s, _ in by_bsz[b]])) for b in bszs]
        sync = [float(np.mean([y for _, y in by_bsz[b]])) for b in bszs]
        curves[key] = _BszCurve(np.asarray(bszs, dtype=float), np.asarray(step), np.asarray(sync))
    return curves


@dataclass(frozen=True, eq=False)
class ProgressCurve:
    """Statistical progress versus real iterations for one application at one total batch size.

    Tabulated on a fine progress grid (``_CURVE_POINTS_PER_EPOCH`` points per epoch); between grid
    points the number of iterations is linear in progress. ``iterations(p)`` is the number of real
    iterations at batch ``batch_size`` needed to go from progress 0 to ``p``: the integral of
    ``1 / gain(q)`` with ``gain(q)`` the AdaScale gain at progress ``q``.
    """

    batch_size: float
    progress_grid: np.ndarray
    iteration_grid: np.ndarray

    def iterations(self, progress: float | np.ndarray) -> np.ndarray:
        """Real iterations from progress 0 to ``progress`` (clamped to the tabulated range)."""
        return np.interp(progress, self.progress_grid, self.iteration_grid)

    def progress_after(self, progress: float, iterations: float) -> float:
        """The progress reached after ``iterations`` more real iterations from ``progress``.

        Beyond the tabulated range, progress grows at the last tabulated gain.
        """
        start = float(np.interp(progress, self.progress_grid, self.iteration_grid))
        target = start + iterations
        if target <= self.iteration_grid[-1]:
            return float(np.interp(target, self.iteration_grid, self.progress_grid))
        slope = (self.progress_grid[-1] - self.progress_grid[-2]) / (
            self.iteration_grid[-1] - self.iteration_grid[-2]
        )
        return float(self.progress_grid[-1] + (target - self.iteration_grid[-1]) * slope)


# --------------------------------------------------------------------------------------------
# AppTrace
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class AppTrace:
    """Measured traces of one application, with the interpolation a simulator needs.

    Attributes:
        name: application name (one of :data:`APPLICATIONS`).
        init_batch_size: ``M0``, the smallest validated total batch size.
        max_batch_size: the largest validated total batch size.
        min_local_bsz, max_local_bsz: smallest / largest measured per-GPU batch
            (``max_local_bsz`` capped at 8 for yolov3, its GPU memory limit).
        max_epochs: epochs the job trains for.
        target_progress: statistical progress at the end of the last epoch, read from the
            validation trace at ``M0``; a job is complete when it reaches it.
        rows: every throughput row, ``placements.csv`` then ``scalability.csv``, in file order.
        validation: validation traces by total batch size, ascending.
    """

    name: str
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: int
    max_epochs: int
    target_progress: float
    rows: tuple[ThroughputRow, ...]
    validation: Mapping[int, ValidationTrace]
    _exact: dict[tuple[int, ...], _BszCurve] = field(repr=False)
    _configs: dict[tuple[int, ...], _BszCurve] = field(repr=False)
    _config_points: np.ndarray = field(repr=False)
    _triangulation: object = field(repr=False)
    _val_bsz: np.ndarray = field(repr=False)
    _val_anchor: tuple[np.ndarray, ...] = field(repr=False)
    _step_cache: dict[tuple[tuple[int, ...], int], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )
    _curve_cache: dict[float, ProgressCurve] = field(default_factory=dict, repr=False)
    _weight_cache: dict[tuple[int, int], tuple] = field(default_factory=dict, repr=False)

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_dir(cls, name: str, trace_dir: Path, gpu_type: str | None = None) -> AppTrace:
        """Load and validate ``trace_dir`` (``placements.csv``, ``scalability.csv``,
        ``validation-<M>.csv``). With ``gpu_type``, the throughput files are that type's
        ``placements-<gpu_type>.csv`` and (optional) ``scalability-<gpu_type>.csv``, same
        columns; the validation traces are shared by all types. Columns are matched by header
        name, in any order. Raises :class:`TraceFormatError` on any malformed file."""
        suffix = "" if gpu_type is None else f"-{gpu_type}"
        placements = _read_placements(trace_dir / f"placements{suffix}.csv")
        scal_path = trace_dir / f"scalability{suffix}.csv"
        scalability = [] if gpu_type and not scal_path.exists() else _read_scalability(scal_path)
        if not placements:
            raise TraceFormatError(
                "no data rows", path=str(trace_dir / f"placements{suffix}.csv"), line=2
            )
        validation: dict[int, ValidationTrace] = {}
        for path in sorted(trace_dir.glob("validation-*.csv")):
            match = _VALIDATION_NAME.match(path.name)
            if match is None or int(match.group(1)) < 1:
                raise TraceFormatError(
                    "expected a name validation-<batch size>.csv", path=str(path)
                )
            validation[int(match.group(1))] = _read_validation(path, int(match.group(1)))
        if not validation:
            raise TraceFormatError("no validation-<M>.csv files", path=str(trace_dir))
        validation = dict(sorted(validation.items()))
        init_bsz = min(validation)
        max_epochs = _MAX_EPOCHS.get(name, min(len(v.progress) for v in validation.values()))
        m0 = validation[init_bsz]
        if len(m0.progress) < max_epochs:
            raise TraceFormatError(
                f"{len(m0.progress)} epochs recorded, {max_epochs} needed",
                path=str(trace_dir / f"validation-{init_bsz}.csv"),
                line=len(m0.progress) + 1,
                field="progress",
            )
        measured = [r.local_bsz for r in placements]
        max_local = max(measured)
        if name in _MAX_LOCAL_BSZ_OVERRIDE and gpu_type is None:
            max_local = min(max_local, _MAX_LOCAL_BSZ_OVERRIDE[name])
        rows = tuple(placements + scalability)

        exact = _curves_by_key(placements, lambda r: r.placement)
        configs = _curves_by_key(rows, lambda r: (r.num_nodes, r.num_gpus))
        points = np.array(sorted(configs), dtype=float)
        triangulation = None
        if len(points) >= 3 and np.linalg.matrix_rank(points[1:] - points[0]) == 2:
            from scipy.spatial import Delaunay

            triangulation = Delaunay(points)

        # Gradient statistics of each validated batch size, anchored at the start of the epoch
        # they describe (row i holds for epoch i, as in the paper's simulator).
        anchors = []
        for v in validation.values():
            anchors.append(np.concatenate(([0.0], v.progress[:-1])))
        return cls(
            name=name,
            init_batch_size=init_bsz,
            max_batch_size=max(validation),
            min_local_bsz=min(measured),
            max_local_bsz=max_local,
            max_epochs=max_epochs,
            target_progress=float(m0.progress[max_epochs - 1]),
            rows=rows,
            validation=validation,
            _exact=exact,
            _configs=configs,
            _config_points=points,
            _triangulation=triangulation,
            _val_bsz=np.array(list(validation), dtype=float),
            _val_anchor=tuple(anchors),
        )

    # ---- throughput ------------------------------------------------------------------------

    def step_time_s(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """True ``(step_time_s, sync_time_s)`` of one iteration at ``placement`` and per-GPU
        batch ``local_bsz``.

        ``placement`` lists GPUs per node (order and zero entries ignored). The rule:

        1. If this exact placement (as a multiset of GPUs per node) was measured in
           ``placements.csv``, interpolate linearly in ``local_bsz`` between its measured batch
           sizes (several measurements of one multiset are averaged).
        2. Otherwise, for each measured configuration ``(num_nodes, num_gpus)`` (from both
           files, averaged per configuration and batch size) take its value at ``local_bsz`` as
           in 1, and interpolate linearly in ``(num_nodes, num_gpus)`` over the Delaunay
           triangulation of the measured configurations (``num_nodes`` clamped to the largest
           measured). Outside their convex hull, use the nearest measured configuration.

        In ``local_bsz``, outside the measured range of a configuration: below it, the times at
        the smallest measured batch (fixed per-iteration overhead dominates); above it, the sync
        time at the largest batch and a compute time (step - sync) growing in proportion to
        the batch.

        Raises :class:`InvalidInputError` on an empty placement or a non-positive batch.
        """
        key = tuple(sorted((int(g) for g in placement if g), reverse=True))
        if not key or min(key) < 0:
            raise InvalidInputError(f"invalid placement {tuple(placement)}", field="placement")
        if not local_bsz > 0:
            raise InvalidInputError(f"local_bsz must be > 0, got {local_bsz}", field="local_bsz")
        cache_key = (key, local_bsz)
        hit = self._step_cache.get(cache_key)  # type: ignore[arg-type]
        if hit is not None:
            return hit
        curve = self._exact.get(key)
        if curve is not None:
            result = curve.at(local_bsz)
        else:
            result = self._interpolate_config(len(key), sum(key), local_bsz)
        if len(self._step_cache) > 200_000:
            self._step_cache.clear()
        self._step_cache[cache_key] = result  # type: ignore[index]
        return result

    def step_times_s(
        self, placement: Sequence[int], local_bsz: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step_time_s` at each per-GPU batch of ``local_bsz`` (an array, all > 0):
        ``(step_time_s, sync_time_s)`` arrays, the same numbers, without the cache."""
        key = tuple(sorted((int(g) for g in placement if g), reverse=True))
        x = np.asarray(local_bsz, dtype=float)
        if not key or min(key) < 0:
            raise InvalidInputError(f"invalid placement {tuple(placement)}", field="placement")
        if x.size and not float(x.min()) > 0:
            raise InvalidInputError("local_bsz must be > 0", field="local_bsz")
        curve = self._exact.get(key)
        if curve is not None:
            return curve.at_many(x)
        return self._interpolate_config(len(key), sum(key), x)

    def _interpolate_config(self, num_nodes: int, num_gpus: int, local_bsz: Any):
        """:meth:`step_time_s` off the measured placements; ``local_bsz`` a float or an
        array (then arrays back)."""
        many = isinstance(local_bsz, np.ndarray)
        max_nodes = int(self._config_points[:, 0].max())
        if num_nodes > max_nodes:
            # Beyond the largest measured cluster: keep GPUs per node, cap the node count.
            num_gpus = max(max_nodes, round(num_gpus * max_nodes / num_nodes))
            num_nodes = max_nodes
        exact = self._configs.get((num_nodes, num_gpus))
        if exact is not None:
            return exact.at_many(local_bsz) if many else exact.at(local_bsz)
        step: Any = 0.0
        sync: Any = 0.0
        for w, key in self._config_weights(num_nodes, num_gpus):
            curve = self._configs[key]
            s, y = curve.at_many(local_bsz) if many else curve.at(local_bsz)
            if w is None:  # outside the measured hull: the nearest configuration's times
                return s, y
            step = step + w * s
            sync = sync + w * y
        if many:
            return step, np.minimum(sync, step)
        return step, min(sync, step)

    def _config_weights(
        self, num_nodes: int, num_gpus: int
    ) -> tuple[tuple[float | None, tuple[int, ...]], ...]:
        """The measured configurations ``(num_nodes, num_gpus)`` is interpolated from, with
        their barycentric weights (one with weight ``None``: the nearest, outside the hull);
        memoised (a Delaunay point location costs milliseconds)."""
        hit = self._weight_cache.get((num_nodes, num_gpus))
        if hit is not None:
            return hit
        query = np.array([num_nodes, num_gpus], dtype=float)
        simplex = -1
        tri = self._triangulation
        if tri is not None:
            # One point as a (1, 2) array: a bare (2,) one costs tens of milliseconds.
            simplex = int(tri.find_simplex(query[None, :])[0])  # type: ignore[attr-defined]
        out: tuple[tuple[float | None, tuple[int, ...]], ...]
        if simplex < 0:
            nearest = np.argmin(((self._config_points - query) ** 2).sum(axis=1))
            out = ((None, tuple(int(v) for v in self._config_points[nearest])),)
        else:
            transform = tri.transform[simplex]  # type: ignore[attr-defined]
            bary = transform[:2] @ (query - transform[2])
            weights = np.append(bary, 1.0 - bary.sum())
            vertices = tri.simplices[simplex]  # type: ignore[attr-defined]
            out = tuple(
                (float(w), tuple(int(x) for x in self._config_points[v]))
                for w, v in zip(weights, vertices, strict=True)
            )
        if len(self._weight_cache) > 100_000:
            self._weight_cache.clear()
        self._weight_cache[(num_nodes, num_gpus)] = out
        return out

    # ---- statistical efficiency ------------------------------------------------------------

    def grad_stats(
        self, progress: float | np.ndarray, batch_size: float | np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """True ``(grad_sqr, grad_var)`` at statistical ``progress`` and total ``batch_size``.

        Row ``i`` of a validation trace describes epoch ``i`` (the paper's simulator applies it
        throughout that epoch); here it is anchored at the start of epoch ``i`` and interpolated
        linearly in progress towards row ``i + 1`` (held after the last row). Between validated
        batch sizes the statistics are interpolated linearly in batch size, and held at the
        nearest validated batch size outside that range. Integrated over a run, this gives
        iteration counts within 4% of the paper's piecewise-constant rule, and never more (worst
        measured: 3.9% fewer, deepspeech2 at its largest batch; most batch sizes within 1%;
        ``tests/model/test_traces.py::test_progress_interpolation_matches_paper_rule``).
        Vectorised: ``progress`` and ``batch_size`` broadcast; returns float arrays (0-d for
        scalars).
        """
        p0, m0 = np.asarray(progress, float), np.asarray(batch_size, float)
        shape = np.broadcast_shapes(p0.shape, m0.shape)
        bsz = self._val_bsz
        m = np.clip(m0, bsz[0], bsz[-1])
        hi = np.clip(np.searchsorted(bsz, m, side="left"), 1, max(len(bsz) - 1, 1))
        lo = hi - 1
        if len(bsz) == 1:
            lo = hi = np.zeros_like(hi)
            frac = np.zeros(m.shape)
        else:
            frac = (m - bsz[lo]) / (bsz[hi] - bsz[lo])
        # (1 - frac) * at[lo] + frac * at[hi], summed over the validated sizes in order (the
        # other terms are exact zeros), each size's statistics interpolated on the progress
        # array before broadcasting: the same numbers as indexing, at a fraction of the cost.
        sqr = np.zeros(shape)
        var = np.zeros(shape)
        for i, v in enumerate(self.validation.values()):
            s_i = np.interp(p0, self._val_anchor[i], v.grad_sqr)
            v_i = np.interp(p0, self._val_anchor[i], v.grad_var)
            w_lo = np.where(lo == i, 1 - frac, 0.0)
            w_hi = np.where(hi == i, frac, 0.0)
            sqr = sqr + w_lo * s_i
            var = var + w_lo * v_i
            sqr = sqr + w_hi * s_i
            var = var + w_hi * v_i
        return sqr, var

    def gain(self, progress: float | np.ndarray, batch_size: float | np.ndarray) -> np.ndarray:
        """True AdaScale gain ``(var + sqr) / (var / (M / M0) + sqr)`` at ``progress``, ``M``:
        the statistical progress made by one real iteration at total batch ``M``."""
        sqr, var = self.grad_stats(progress, batch_size)
        scale = np.asarray(batch_size, float) / self.init_batch_size
        return (var + sqr) / (var / scale + sqr)

    def progress_curve(self, batch_size: float) -> ProgressCurve:
        """Cached :class:`ProgressCurve` at total batch size ``batch_size`` (> 0).

        The grid runs from 0 to ``target_progress`` with ``_CURVE_POINTS_PER_EPOCH`` points per
        epoch of the ``M0`` trace; iterations are integrated with the trapezoid rule.
        """
        if not batch_size > 0:
            raise InvalidInputError(f"batch_size must be > 0, got {batch_size}", field="batch_size")
        key = float(batch_size)
        curve = self._curve_cache.get(key)
        if curve is None:
            ends = self.validation[self.init_batch_size].progress[: self.max_epochs]
            starts = np.concatenate(([0.0], ends[:-1]))
            k = _CURVE_POINTS_PER_EPOCH
            frac = np.arange(k) / k
            grid = (starts[:, None] + (ends - starts)[:, None] * frac[None, :]).ravel()
            grid = np.append(grid, ends[-1])
            inv_gain = 1.0 / self.gain(grid, key)
            steps = np.diff(grid) * (inv_gain[1:] + inv_gain[:-1]) / 2
            iters = np.concatenate(([0.0], np.cumsum(steps)))
            grid.setflags(write=False)
            iters.setflags(write=False)
            curve = ProgressCurve(key, grid, iters)
            if len(self._curve_cache) > 4096:
                self._curve_cache.clear()
            self._curve_cache[key] = curve
        return curve

    def epoch_of(self, progress: float) -> int:
        """Number of whole epochs completed at ``progress`` (per the ``M0`` trace)."""
        ends = self.validation[self.init_batch_size].progress
        return int(np.searchsorted(ends, progress, side="right"))


@functools.lru_cache(maxsize=64)
def _load_cached(name: str, traces_dir: str, gpu_type: str | None) -> AppTrace:
    return AppTrace.from_dir(name, Path(traces_dir) / name, gpu_type)


def traces_folder(root: Path | None = None) -> Path:
    """The folder holding one sub-folder per application: ``root/traces`` (``root`` defaults to
    :func:`data_root`)."""
    return (Path(root) if root is not None else data_root()) / "traces"


def has_type_traces(name: str, gpu_type: str, traces_dir: Path | None = None) -> bool:
    """Whether application ``name`` has measured throughput files for ``gpu_type``
    (``placements-<gpu_type>.csv``) in ``traces_dir`` (default :func:`traces_folder`)."""
    folder = Path(traces_dir) if traces_dir is not None else traces_folder()
    return (folder / name / f"placements-{gpu_type}.csv").is_file()


def load_app(
    name: str,
    root: Path | None = None,
    gpu_type: str | None = None,
    *,
    traces_dir: Path | None = None,
) -> AppTrace:
    """The :class:`AppTrace` of application ``name``, loaded once per folder and cached.

    The files are read from ``traces_dir/<name>/`` if given, else from
    ``traces_folder(root)/<name>/``. ``gpu_type`` selects that type's throughput files (see
    :meth:`AppTrace.from_dir`; ``None``: the default files, measured on T4). Raises
    :class:`InvalidInputError` for a name not in :data:`APPLICATIONS` and
    :class:`TraceFormatError` for a malformed or missing trace file.
    """
    if name not in APPLICATIONS:
        raise InvalidInputError(
            f"unknown application {name!r}; expected one of {', '.join(APPLICATIONS)}",
            field="application",
        )
    folder = Path(traces_dir) if traces_dir is not None else traces_folder(root)
    return _load_cached(name, str(folder.resolve()), gpu_type)
