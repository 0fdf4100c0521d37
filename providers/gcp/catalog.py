"""Built-in catalogue of GCE GPU machine shapes and their list prices (pure data, no I/O).

What is here
============

* ``ACCELERATORS``: the GPU models coadapt knows, by their GCE ``acceleratorType`` name, with
  the neutral ``gpu_type`` name coadapt uses across clouds and, for GPUs that are *attached* to
  an N1 machine (``guestAccelerators``), the per-GPU price.
* ``MACHINE_SHAPES``: machine types, with vCPUs and memory, the GPUs built into
  accelerator-optimised shapes (G2 = L4, A2 = A100), and the machine price. For G2/A2 the
  machine price already includes the built-in GPUs; for N1 the GPU price is added per attached
  GPU.

Prices: source, date and caveats
================================

On-demand prices are the **us-central1** list prices of
https://cloud.google.com/compute/vm-instance-pricing and https://cloud.google.com/compute/gpus-pricing
as they stood around June 2024 (``PRICES_RECORDED``); spot prices are from
https://cloud.google.com/spot-vms/pricing around the same time, rounded. The figures were typed
in by hand from those public pages, not fetched by code, and could not be re-verified from the
offline build machine. GCE spot prices are *variable* (Google may change them up to once a day),
so treat them as a planning estimate; before relying on them for money decisions, check the pages
and pass ``GcpConfig.price_overrides``.

Other regions are priced like us-central1 (a documented simplification: most US regions match
it, EU/Asia regions are typically 5-25% higher). GCE has no spot-price *history* API in the
Compute API (unlike EC2's ``DescribeSpotPriceHistory``); historic prices are only visible in
Cloud Billing exports, so ``GcpProvider.spot_prices()`` reports these catalogue prices, stamped
with ``PRICES_RECORDED_EPOCH_S``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

PRICES_RECORDED = "2024-06-01"
PRICES_RECORDED_EPOCH_S = datetime(2024, 6, 1, tzinfo=UTC).timestamp()
PRICE_REGION = "us-central1"


@dataclass(frozen=True)
class Accelerator:
    """A GPU model as GCE names it (``name``) and as coadapt names it (``gpu_type``).

    ``on_demand_usd_per_gpu_hour`` / ``spot_usd_per_gpu_hour`` are the prices of one GPU
    attached to an N1 machine; ``None`` for GPUs that only come built into a machine shape
    (their price is part of the machine price). ``allowed_counts`` are the GPU counts GCE
    accepts for an N1 attachment.
    """

    name: str
    gpu_type: str
    gpu_memory_gib: float
    on_demand_usd_per_gpu_hour: float | None = None
    spot_usd_per_gpu_hour: float | None = None
    allowed_counts: tuple[int, ...] = ()


@dataclass(frozen=True)
class MachineShape:
    """A GCE machine type. ``builtin_accelerator`` is set for G2/A2 shapes (GPUs included).

    Prices are per machine-hour, excluding disks and network; for G2/A2 they include the
    built-in GPUs.
    """

    machine_type: str
    vcpus: int
    memory_gib: float
    on_demand_usd_per_hour: float
    spot_usd_per_hour: float
    builtin_accelerator: str | None = None
    builtin_accelerator_count: int = 0

    @property
    def family(self) -> str:
        return self.machine_type.split("-", 1)[0]


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator("nvidia-tesla-t4", "T4", 16.0, 0.35, 0.11, (1, 2, 4)),
        Accelerator("nvidia-tesla-v100", "V100", 16.0, 2.48, 0.74, (1, 2, 4, 8)),
        Accelerator("nvidia-tesla-p100", "P100", 16.0, 1.46, 0.43, (1, 2, 4)),
        Accelerator("nvidia-l4", "L4", 24.0),
        Accelerator("nvidia-tesla-a100", "A100", 40.0),
        Accelerator("nvidia-a100-80gb", "A100-80GB", 80.0),
    )
}

# N1 on-demand: $0.031611 per vCPU-hour + $0.004237 per GiB-hour (us-central1).
# N1 spot: ~$0.00698 per vCPU-hour + ~$0.000936 per GiB-hour.
MACHINE_SHAPES: dict[str, MachineShape] = {
    m.machine_type: m
    for m in (
        MachineShape("n1-standard-4", 4, 15.0, 0.189999, 0.0420),
        MachineShape("n1-standard-8", 8, 30.0, 0.379998, 0.0839),
        MachineShape("n1-standard-16", 16, 60.0, 0.759996, 0.1678),
        MachineShape("n1-standard-32", 32, 120.0, 1.519992, 0.3357),
        MachineShape("g2-standard-4", 4, 16.0, 0.706832, 0.2821, "nvidia-l4", 1),
        MachineShape("g2-standard-8", 8, 32.0, 0.853624, 0.3407, "nvidia-l4", 1),
        MachineShape("g2-standard-12", 12, 48.0, 1.000416, 0.3993, "nvidia-l4", 1),
        MachineShape("g2-standard-16", 16, 64.0, 1.147208, 0.4579, "nvidia-l4", 1),
        MachineShape("g2-standard-24", 24, 96.0, 2.000833, 0.7986, "nvidia-l4", 2),
        MachineShape("g2-standard-48", 48, 192.0, 4.001665, 1.5972, "nvidia-l4", 4),
        MachineShape("a2-highgpu-1g", 12, 85.0, 3.673385, 1.1019, "nvidia-tesla-a100", 1),
        MachineShape("a2-highgpu-2g", 24, 170.0, 7.346770, 2.2038, "nvidia-tesla-a100", 2),
        MachineShape("a2-highgpu-4g", 48, 340.0, 14.693540, 4.4076, "nvidia-tesla-a100", 4),
        MachineShape("a2-highgpu-8g", 96, 680.0, 29.387080, 8.8152, "nvidia-tesla-a100", 8),
        MachineShape("a2-ultragpu-1g", 12, 170.0, 5.068800, 2.0275, "nvidia-a100-80gb", 1),
    )
}


def machine_shape(machine_type: str) -> MachineShape:
    """The catalogue entry for ``machine_type``; ``KeyError`` when unknown."""
    return MACHINE_SHAPES[machine_type]


def accelerator(name: str) -> Accelerator:
    """The catalogue entry for an ``acceleratorType`` name; ``KeyError`` when unknown."""
    return ACCELERATORS[name]


def region_of(zone: str) -> str:
    """``us-central1-a`` -> ``us-central1`` (a GCE zone is its region plus ``-<letter>``)."""
    region, sep, suffix = zone.rpartition("-")
    if not sep or not region or not suffix:
        raise ValueError(f"not a GCE zone name: {zone!r}")
    return region
