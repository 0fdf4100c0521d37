"""Instance interconnects, and how gradient sync time scales with them.

A job's gradient sync moves the same bytes whatever the GPU; its time depends on the links of
the instance it runs on: between the GPUs of one node (``intra_gbytes_per_s``) and between nodes
(``network_gbps``). coadapt models sync time as inversely proportional to the link's bandwidth,
relative to the instance the reference traces were measured on (:data:`REFERENCE_INSTANCE`),
with a floor: a sync never takes less than :data:`MIN_SYNC_FACTOR` of the reference's time
(latency does not shrink with bandwidth). :func:`sync_factors` gives the factors that carry a
sync time measured on one GPU type's instances to another's. The simulator's true speeds of
unmeasured types follow the same law (:mod:`autoscaler.sim.cluster`). Pure data and functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "DEFAULT_INSTANCE",
    "INTERCONNECTS",
    "MIN_SYNC_FACTOR",
    "REFERENCE_GPUS_PER_NODE",
    "REFERENCE_INSTANCE",
    "Interconnect",
    "sync_factor",
    "sync_factors",
]


@dataclass(frozen=True)
class Interconnect:
    """An instance type's links: ``intra_gbytes_per_s`` between GPUs of one node (per GPU, one
    direction) and ``network_gbps`` between nodes."""

    intra_gbytes_per_s: float
    network_gbps: float


#: Published figures: PCIe 3.0 x16 ~16 GB/s; NVLink 2 (V100, p3) 150 GB/s and NVLink 3 via
#: NVSwitch (A100, p4d) 300 GB/s, NVLink 4 (H100, p5) 450 GB/s per GPU and direction; instance
#: networks as AWS lists them.
INTERCONNECTS: Mapping[str, Interconnect] = MappingProxyType(
    {
        "g4dn.12xlarge": Interconnect(16.0, 50.0),
        "g4dn.metal": Interconnect(16.0, 100.0),
        "p3.8xlarge": Interconnect(150.0, 10.0),
        "p3.16xlarge": Interconnect(150.0, 25.0),
        "p3dn.24xlarge": Interconnect(150.0, 100.0),
        "p4d.24xlarge": Interconnect(300.0, 400.0),
        "p5.48xlarge": Interconnect(450.0, 3200.0),
    }
)

#: The instance a GPU type's nodes are assumed to be when a cluster file names none.
DEFAULT_INSTANCE: Mapping[str, str] = MappingProxyType(
    {"T4": "g4dn.12xlarge", "V100": "p3.16xlarge", "A100": "p4d.24xlarge", "H100": "p5.48xlarge"}
)

#: The instance the T4 traces were measured on, and its GPUs per node.
REFERENCE_INSTANCE = "g4dn.12xlarge"
REFERENCE_GPUS_PER_NODE = 4
#: Floor of the sync-time factors (latency does not shrink with bandwidth).
MIN_SYNC_FACTOR = 0.1


def sync_factor(reference: float, bandwidth: float) -> float:
    """Sync time on a link of ``bandwidth`` over that on the reference link of ``reference``
    (same units): ``max(MIN_SYNC_FACTOR, reference / bandwidth)``."""
    return max(MIN_SYNC_FACTOR, reference / bandwidth)


def sync_factors(source_type: str, target_type: str) -> tuple[float, float]:
    """``(intra, inter)``: the factors that turn a job's intra-node and inter-node sync times
    on ``source_type``'s instances into those on ``target_type``'s, each GPU type taken on its
    :data:`DEFAULT_INSTANCE`. ``(1, 1)`` when either type has no known instance (nothing is
    known of its links, so the sync is kept as measured)."""
    src, tgt = (INTERCONNECTS.get(DEFAULT_INSTANCE.get(t, "")) for t in (source_type, target_type))
    if src is None or tgt is None:
        return 1.0, 1.0
    ref = INTERCONNECTS[REFERENCE_INSTANCE]
    intra = sync_factor(ref.intra_gbytes_per_s, tgt.intra_gbytes_per_s) / sync_factor(
        ref.intra_gbytes_per_s, src.intra_gbytes_per_s
    )
    inter = sync_factor(ref.network_gbps, tgt.network_gbps) / sync_factor(
        ref.network_gbps, src.network_gbps
    )
    return intra, inter
