"""Built-in EC2 on-demand price catalogue and GPU naming (pure data, no I/O).

Prices: source, date and caveats
================================

``ON_DEMAND_USD_PER_HOUR`` holds the **us-east-1, Linux, shared-tenancy** on-demand list prices
of the GPU types coadapt launches by default, as published on https://aws.amazon.com/ec2/pricing/on-demand/
around June 2024 (``PRICES_RECORDED``). They were typed in by hand from that public page (the
AWS Price List / Pricing API cannot be reached offline, and moto does not model it) and could
not be re-verified from the offline build machine. AWS cut the P4d/P5 prices in June 2025 (by
roughly a third and a half); the figures here are the earlier ones. Types not listed
(``p5.4xlarge``, newer sizes) have no catalogue price: their on-demand offerings report
``price_usd_per_hour=None``. Other regions are not priced (``None``) unless
``AwsConfig.on_demand_prices_usd_per_hour`` supplies prices: EC2 prices differ by region.

Spot prices never come from here: they are read from ``DescribeSpotPriceHistory``.

GPU naming
==========

``gpu_type_name`` gives the neutral GPU name coadapt uses across clouds (the same names as the
GCP catalogue: ``T4``, ``A10G``, ``L4``, ``A100``, ``A100-80GB``, ``H100``), derived from EC2's
``GpuInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from types import MappingProxyType

PRICES_RECORDED = "2024-06-01"
PRICES_RECORDED_EPOCH_S = datetime(2024, 6, 1, tzinfo=UTC).timestamp()
PRICE_REGION = "us-east-1"

# Instance-type patterns (EC2 ``instance-type`` filter syntax) launched by default.
DEFAULT_GPU_INSTANCE_TYPES: tuple[str, ...] = ("g4dn.*", "g5.*", "g6.*", "p4d.*", "p5.*")

ON_DEMAND_USD_PER_HOUR: Mapping[str, float] = MappingProxyType(
    {
        # g4dn: NVIDIA T4 (16 GiB)
        "g4dn.xlarge": 0.526,
        "g4dn.2xlarge": 0.752,
        "g4dn.4xlarge": 1.204,
        "g4dn.8xlarge": 2.176,
        "g4dn.12xlarge": 3.912,
        "g4dn.16xlarge": 4.352,
        "g4dn.metal": 7.824,
        # g5: NVIDIA A10G (24 GiB)
        "g5.xlarge": 1.006,
        "g5.2xlarge": 1.212,
        "g5.4xlarge": 1.624,
        "g5.8xlarge": 2.448,
        "g5.12xlarge": 5.672,
        "g5.16xlarge": 4.096,
        "g5.24xlarge": 8.144,
        "g5.48xlarge": 16.288,
        # g6: NVIDIA L4 (24 GiB)
        "g6.xlarge": 0.8048,
        "g6.2xlarge": 0.9776,
        "g6.4xlarge": 1.3232,
        "g6.8xlarge": 2.0144,
        "g6.12xlarge": 4.6016,
        "g6.16xlarge": 3.3968,
        "g6.24xlarge": 6.6752,
        "g6.48xlarge": 13.3504,
        # p4d: 8 x NVIDIA A100 40 GiB (price before the June 2025 reduction)
        "p4d.24xlarge": 32.7726,
        # p5: 8 x NVIDIA H100 80 GiB (price before the June 2025 reduction)
        "p5.48xlarge": 98.32,
    }
)


def on_demand_price_usd_per_hour(
    instance_type: str, region: str, overrides: Mapping[str, float] | None = None
) -> float | None:
    """On-demand price of ``instance_type`` in ``region``, or ``None`` when unknown.

    ``overrides`` (from config) win in every region; the built-in catalogue answers only for
    ``PRICE_REGION``.
    """
    if overrides and instance_type in overrides:
        return float(overrides[instance_type])
    if region == PRICE_REGION:
        return ON_DEMAND_USD_PER_HOUR.get(instance_type)
    return None


def gpu_type_name(manufacturer_name: str, memory_mib_per_gpu: int | None) -> str:
    """Neutral GPU name from EC2 ``GpuInfo.Gpus[].Name`` and per-GPU memory.

    EC2 calls both the 40 GiB (p4d) and 80 GiB (p4de) parts ``A100``; coadapt names the larger
    one ``A100-80GB``, as the GCP catalogue does.
    """
    name = manufacturer_name.strip().upper().replace(" ", "-")
    if name == "A100" and memory_mib_per_gpu is not None and memory_mib_per_gpu >= 80 * 1024:
        return "A100-80GB"
    return name
