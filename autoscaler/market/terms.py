"""The market's terms: the two markets, spot preemption notices and the providers' billing.

Pure constants and the billing arithmetic (:func:`billed_seconds`, :func:`instance_cost_usd`)
that the catalogue, the simulated cloud, the controller's cost records and the bill share.
Units: seconds (``_s``), USD per instance-hour (``_usd_per_hour``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from autoscaler.errors import InvalidInputError

__all__ = [
    "AWS_SPOT_NOTICE_S",
    "BILLING_INCREMENT_S",
    "BILLING_MINIMUM_S",
    "GCP_SPOT_NOTICE_S",
    "MARKETS",
    "ON_DEMAND",
    "SPOT",
    "SPOT_NOTICE_S",
    "OfferingRef",
    "billed_seconds",
    "check_market",
    "instance_cost_usd",
]

SPOT = "spot"
ON_DEMAND = "on-demand"
#: The two markets, as spelled in offering keys (``providers.base.Market`` values).
MARKETS: tuple[str, ...] = (SPOT, ON_DEMAND)

#: Warning an AWS spot instance gets before EC2 reclaims it (the 2-minute interruption notice).
AWS_SPOT_NOTICE_S = 120.0
#: Time between a GCP Spot VM's preemption notice (soft off) and its hard off.
GCP_SPOT_NOTICE_S = 30.0
#: Spot preemption notice per provider.
SPOT_NOTICE_S: Mapping[str, float] = MappingProxyType(
    {"aws": AWS_SPOT_NOTICE_S, "gcp": GCP_SPOT_NOTICE_S}
)

#: Billing granularity of both AWS (Linux instances) and GCP VMs: per second ...
BILLING_INCREMENT_S = 1.0
#: ... with a minimum charge of one minute per instance launched.
BILLING_MINIMUM_S = 60.0


def billed_seconds(runtime_s: float) -> float:
    """Seconds billed for an instance that ran ``runtime_s``: whole seconds, at least
    :data:`BILLING_MINIMUM_S` once it ran at all (``0`` for ``runtime_s <= 0``)."""
    if not math.isfinite(runtime_s):
        raise InvalidInputError(f"runtime must be finite, got {runtime_s!r}", field="runtime_s")
    if runtime_s <= 0:
        return 0.0
    return max(BILLING_MINIMUM_S, math.ceil(runtime_s / BILLING_INCREMENT_S) * BILLING_INCREMENT_S)


def instance_cost_usd(usd_per_hour: float, runtime_s: float) -> float:
    """What one instance at a constant ``usd_per_hour`` costs for ``runtime_s`` of life."""
    if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
        raise InvalidInputError(
            f"price must be finite and >= 0, got {usd_per_hour!r}", field="usd_per_hour"
        )
    return usd_per_hour * billed_seconds(runtime_s) / 3600.0


def check_market(market: str) -> str:
    """``market`` if it is one of :data:`MARKETS`, else :class:`InvalidInputError`."""
    if market not in MARKETS:
        raise InvalidInputError(
            f"market must be one of {', '.join(MARKETS)}, got {market!r}", field="market"
        )
    return str(market)


@dataclass(frozen=True)
class OfferingRef:
    """Where a node came from: one pool of one provider (provider, instance type, zone,
    market). ``key`` names the pool across the system (plans, sizing, ledgers, the controller's
    rows), in the one format ``provider/instance_type/zone/market`` of
    :func:`providers.base.offering_key` (the provider's ``Offering.key``) that a job spec's
    ``offerings`` use too (:meth:`parse` reads it back; the decision core imports no provider,
    so it spells the format here, and a test holds the two equal)."""

    provider: str
    instance_type: str
    zone: str
    market: str

    @property
    def key(self) -> str:
        return f"{self.provider}/{self.instance_type}/{self.zone}/{self.market}"

    @classmethod
    def parse(cls, key: str) -> OfferingRef:
        """The offering named by ``key`` (``provider/instance_type/zone/market``, the format
        of :attr:`key`); :class:`InvalidInputError` for a key of another shape or market."""
        parts = key.split("/") if isinstance(key, str) else []
        if len(parts) != 4 or not all(parts):
            raise InvalidInputError(
                f"must be an offering key provider/instance_type/zone/market, got {key!r}",
                field="offerings",
            )
        if parts[3] not in MARKETS:
            raise InvalidInputError(
                f"market must be one of {', '.join(MARKETS)}, got {parts[3]!r} (in {key!r})",
                field="offerings",
            )
        return cls(*parts)
