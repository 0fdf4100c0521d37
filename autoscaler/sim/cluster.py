"""Simulated clusters of several GPU types, and the true speed of a job on each type.

A cluster file (YAML) lists node groups::

    groups:
      - {gpu_type: T4,   gpus_per_node: 4, count: 6}                  # g4dn.12xlarge
      - {gpu_type: V100, gpus_per_node: 8, count: 3}                  # p3.16xlarge
      - {gpu_type: A100, gpus_per_node: 8, count: 2, instance_type: p4d.24xlarge}

``instance_type`` defaults per GPU type (:data:`DEFAULT_INSTANCE`); ``network_gbps`` and
``intra_gbytes_per_s`` may override (or, for an instance type not in :data:`INTERCONNECTS`,
must give) its interconnect.

**True speed of a type** (what the simulator replays; policies never see it). Where an
application has measured files for the type (``placements-<gpu>.csv``, see
:func:`autoscaler.model.traces.load_app`), they are used as they are. Otherwise the speed is derived
from the T4 traces — the model below (the instances' links and the floor of the sync factors
are in :mod:`autoscaler.model.interconnects`, which the policies' type estimates share):

- compute (step - sync) at a per-GPU batch = the T4 trace's compute at that batch and the same
  node and GPU counts, divided by the application's single-GPU speed ratio from
  ``speed_vs_t4.csv`` (:meth:`~autoscaler.model.gputypes.SpeedTable.model_speed`);
- sync on one node = the T4 trace's one-node sync at ``min(GPUs, 4)`` GPUs (a T4 node holds 4;
  a ring all-reduce's bandwidth term saturates in the GPU count) x ``16 / intra_gbytes_per_s``
  (PCIe 3.0 x16 of the g4dn.12xlarge the traces ran on vs the instance's GPU link);
- sync across nodes = the T4 trace's sync at the same node and GPU counts x
  ``50 / network_gbps`` (the g4dn.12xlarge's 50 Gb/s network vs the instance's);
- neither sync factor goes below :data:`MIN_SYNC_FACTOR` (latency does not scale with
  bandwidth);
- the largest per-GPU batch is the one measured on that type in ``speed_vs_t4.csv``.

Loading reads files; :class:`TypeSpeed` queries are pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.decide.views import NodeView, OfferingRef
from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.model.gputypes import KNOWN_GPU_TYPES, REFERENCE_GPU_TYPE, SpeedTable
from autoscaler.model.interconnects import (
    DEFAULT_INSTANCE,
    INTERCONNECTS,
    MIN_SYNC_FACTOR,
    REFERENCE_GPUS_PER_NODE,
    REFERENCE_INSTANCE,
    Interconnect,
    sync_factor,
)
from autoscaler.model.traces import AppTrace, has_type_traces, load_app

__all__ = [
    "DEFAULT_INSTANCE",
    "INTERCONNECTS",
    "MIN_SYNC_FACTOR",
    "ClusterSpec",
    "Interconnect",
    "NodeGroup",
    "TypeSpeed",
    "load_cluster",
    "uniform_cluster",
]


@dataclass(frozen=True)
class NodeGroup:
    """``count`` nodes of ``gpus_per_node`` GPUs of ``gpu_type`` on ``instance_type``."""

    gpu_type: str
    gpus_per_node: int
    count: int
    instance_type: str
    intra_gbytes_per_s: float
    network_gbps: float


@dataclass(frozen=True)
class ClusterSpec:
    """A simulated cluster: node groups, in file order (nodes are numbered in that order)."""

    groups: tuple[NodeGroup, ...]
    source: str = "<memory>"

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus_per_node * g.count for g in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def max_gpus_per_node(self) -> int:
        return max(g.gpus_per_node for g in self.groups)

    def nodes(self) -> tuple[NodeView, ...]:
        """The nodes, ids ``<type>-<n>`` numbered per GPU type in group order."""
        seen: dict[str, int] = {}
        width = max(2, len(str(self.num_nodes - 1)))
        out = []
        for group in self.groups:
            offering = OfferingRef("sim", group.instance_type, "sim", "on-demand")
            for _ in range(group.count):
                k = seen.get(group.gpu_type, 0)
                seen[group.gpu_type] = k + 1
                instance_key = f"{group.gpu_type.lower()}-{k:0{width}d}"
                out.append(NodeView(instance_key, group.gpu_type, group.gpus_per_node, offering))
        return tuple(out)

    def group_of(self) -> dict[str, NodeGroup]:
        """Instance key -> its group."""
        return {
            node.instance_key: group
            for node, group in zip(
                self.nodes(), [g for g in self.groups for _ in range(g.count)], strict=True
            )
        }


def uniform_cluster(num_nodes: int, gpus_per_node: int, gpu_type: str = "T4") -> ClusterSpec:
    """``num_nodes`` identical nodes (the paper's cluster is ``uniform_cluster(16, 4)``)."""
    instance = DEFAULT_INSTANCE.get(gpu_type, REFERENCE_INSTANCE)
    link = INTERCONNECTS[instance]
    group = NodeGroup(
        gpu_type, gpus_per_node, num_nodes, instance, link.intra_gbytes_per_s, link.network_gbps
    )
    return ClusterSpec((group,), source="uniform")


def _positive(value: Any, *, path: str, name: str, integer: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not math.isfinite(float(value)) or value <= 0:
        kind = "an integer" if integer else "a number"
        raise TraceFormatError(f"must be {kind} > 0, got {value!r}", path=path, field=name)
    return float(value)


def load_cluster(
    path: str | Path,
    *,
    speeds: SpeedTable,
    applications: Sequence[str] = (),
    traces_root: Path | None = None,
) -> ClusterSpec:
    """Read and validate a cluster file (see the module docstring).

    Raises :class:`TraceFormatError` naming the file and the field (``groups[i].<name>``) on
    malformed YAML, a missing or non-positive number, an unknown GPU type, an instance type
    with no known interconnect, or — for each of ``applications`` — a GPU type that has neither
    trace files nor a speed row.
    """
    import yaml

    path = Path(path)
    spath = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceFormatError(f"cannot read file: {e.strerror}", path=spath) from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"not valid YAML: {e}".splitlines()[0], path=spath) from e
    if not isinstance(data, Mapping) or not isinstance(data.get("groups"), list):
        raise TraceFormatError(
            "expected a mapping with a 'groups' list", path=spath, field="groups"
        )
    if not data["groups"]:
        raise TraceFormatError("no node groups", path=spath, field="groups")
    groups = []
    for i, raw in enumerate(data["groups"]):
        where = f"groups[{i}]"
        if not isinstance(raw, Mapping):
            raise TraceFormatError("expected a mapping", path=spath, field=where)
        unknown = sorted(
            set(raw)
            - {
                "gpu_type",
                "gpus_per_node",
                "count",
                "instance_type",
                "intra_gbytes_per_s",
                "network_gbps",
            }
        )
        if unknown:
            raise TraceFormatError(f"unknown keys {unknown}", path=spath, field=where)
        gpu_type = raw.get("gpu_type")
        if gpu_type not in KNOWN_GPU_TYPES:
            raise TraceFormatError(
                f"unknown GPU type {gpu_type!r}; known: {', '.join(KNOWN_GPU_TYPES)}",
                path=spath,
                field=f"{where}.gpu_type",
            )
        gpus = int(
            _positive(
                raw.get("gpus_per_node"), path=spath, name=f"{where}.gpus_per_node", integer=True
            )
        )
        count = int(_positive(raw.get("count"), path=spath, name=f"{where}.count", integer=True))
        instance = raw.get("instance_type", DEFAULT_INSTANCE.get(gpu_type))
        link = INTERCONNECTS.get(instance) if isinstance(instance, str) else None
        intra = raw.get("intra_gbytes_per_s", link.intra_gbytes_per_s if link else None)
        net = raw.get("network_gbps", link.network_gbps if link else None)
        if intra is None or net is None:
            raise TraceFormatError(
                f"no interconnect known for instance type {instance!r}: give "
                "intra_gbytes_per_s and network_gbps",
                path=spath,
                field=f"{where}.instance_type",
            )
        intra = _positive(intra, path=spath, name=f"{where}.intra_gbytes_per_s", integer=False)
        net = _positive(net, path=spath, name=f"{where}.network_gbps", integer=False)
        for app in applications:
            if gpu_type == REFERENCE_GPU_TYPE or has_type_traces(app, gpu_type, traces_root):
                continue
            if speeds.has_type(gpu_type):
                continue
            raise TraceFormatError(
                f"GPU type {gpu_type} has neither trace files (placements-{gpu_type}.csv for "
                f"{app}) nor a speed row in {speeds.source}",
                path=spath,
                field=f"{where}.gpu_type",
            )
        groups.append(NodeGroup(gpu_type, gpus, count, str(instance), intra, net))
    return ClusterSpec(tuple(groups), source=spath)


class TypeSpeed:
    """True iteration times of one application on one node group's GPU type and instance.
    ``ratio_factor`` multiplies the speed table's ratio of a type derived from it (not the
    reference type, not a type with its own traces): the world's speed error."""

    def __init__(
        self,
        base: AppTrace,
        group: NodeGroup,
        speeds: SpeedTable,
        traces_root: Path | None = None,
        ratio_factor: float = 1.0,
    ) -> None:
        self.base = base
        self.group = group
        self.measured: AppTrace | None = None
        if group.gpu_type != REFERENCE_GPU_TYPE and has_type_traces(
            base.name, group.gpu_type, traces_root
        ):
            self.measured = load_app(base.name, None, group.gpu_type, traces_dir=traces_root)
        ref = INTERCONNECTS[REFERENCE_INSTANCE]
        self.identity = self.measured is None and (
            group.gpu_type == REFERENCE_GPU_TYPE
            and math.isclose(group.intra_gbytes_per_s, ref.intra_gbytes_per_s)
            and math.isclose(group.network_gbps, ref.network_gbps)
        )
        self.ratio = 1.0 if self.measured else speeds.model_speed(base.name, group.gpu_type)
        if self.measured is None and group.gpu_type != REFERENCE_GPU_TYPE:
            self.ratio *= ratio_factor  # the world's error on the table (SimConfig.speed_error)
        self.intra_factor = sync_factor(ref.intra_gbytes_per_s, group.intra_gbytes_per_s)
        self.inter_factor = sync_factor(ref.network_gbps, group.network_gbps)
        if self.measured is not None:
            self.max_local_bsz = self.measured.max_local_bsz
        elif group.gpu_type == REFERENCE_GPU_TYPE:
            self.max_local_bsz = base.max_local_bsz
        else:
            measured_bsz = speeds.max_local_bsz(base.name, group.gpu_type)
            self.max_local_bsz = max(base.max_local_bsz, measured_bsz or base.max_local_bsz)

    def step_time_s(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """True ``(step_time_s, sync_time_s)`` (see the module docstring)."""
        if self.measured is not None:
            return self.measured.step_time_s(placement, local_bsz)
        if self.identity:
            return self.base.step_time_s(placement, local_bsz)
        key = sorted((int(g) for g in placement if g), reverse=True)
        if not key:
            raise InvalidInputError(f"invalid placement {tuple(placement)}", field="placement")
        if len(key) == 1:
            ref_step, ref_sync = self.base.step_time_s(
                (min(key[0], REFERENCE_GPUS_PER_NODE),), local_bsz
            )
            sync = ref_sync * self.intra_factor if key[0] > 1 else ref_sync
        else:
            ref_step, ref_sync = self.base.step_time_s(key, local_bsz)
            sync = ref_sync * self.inter_factor
        compute = (ref_step - ref_sync) / self.ratio
        return compute + sync, sync

    def step_times_s(
        self, placement: Sequence[int], local_bsz: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`step_time_s` at each per-GPU batch of ``local_bsz`` (an array, all > 0):
        ``(step_time_s, sync_time_s)`` arrays, the same numbers."""
        if self.measured is not None:
            return self.measured.step_times_s(placement, local_bsz)
        if self.identity:
            return self.base.step_times_s(placement, local_bsz)
        key = sorted((int(g) for g in placement if g), reverse=True)
        if not key:
            raise InvalidInputError(f"invalid placement {tuple(placement)}", field="placement")
        if len(key) == 1:
            ref_step, ref_sync = self.base.step_times_s(
                (min(key[0], REFERENCE_GPUS_PER_NODE),), local_bsz
            )
            sync = ref_sync * self.intra_factor if key[0] > 1 else ref_sync
        else:
            ref_step, ref_sync = self.base.step_times_s(key, local_bsz)
            sync = ref_sync * self.inter_factor
        compute = (ref_step - ref_sync) / self.ratio
        return compute + sync, sync
