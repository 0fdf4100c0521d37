"""What the fleet has cost so far and costs per hour now, read from the controller's store: the
one rule behind ``GET /v1/costs`` (the dashboard's cost chart) and the ``/metrics`` families
``coadapt_spend_usd_total`` and ``coadapt_fleet_cost_usd_per_hour``.

The closed cost records (each instance's bill, written by the round when it ended: per-second
billing with the provider minimum), plus what each instance still billing (``running``,
``draining`` or ``terminating``) has accrued at its price since it was first seen running;
the series is :func:`~autoscaler.accounting.costs.cost_series_usd` (the cost ledger's
arithmetic), its last point the total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from autoscaler.accounting.costs import cost_series_usd
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import Store

__all__ = ["BILLING", "FleetCost", "fleet_cost"]

BILLING: Final = (InstanceStatus.RUNNING, InstanceStatus.DRAINING, InstanceStatus.TERMINATING)
"""The statuses of an instance that bills now (it ran, and has not been seen gone)."""


@dataclass(frozen=True)
class FleetCost:
    """The fleet's cost at ``at_s``: ``total_usd`` spent so far, ``usd_per_hour`` the sum of
    the prices of the instances billing now, ``points`` the cumulative cost over time
    (``(t_s, usd)``, oldest first, the last one ``(at_s, total_usd)``; empty while nothing
    ever ran)."""

    at_s: float
    total_usd: float
    usd_per_hour: float
    points: tuple[tuple[float, float], ...]


def fleet_cost(store: Store, now_s: float) -> FleetCost:
    """The fleet's cost at ``now_s`` (see the module docstring). Reads the cost records and
    the instances billing now (one query for each, and one status history read per billing
    instance)."""
    closed = [(c.start_s, c.end_s, c.price_usd_per_hour, c.usd) for c in store.cost_records()]
    running: list[tuple[float, float]] = []
    for row in store.list_instances(statuses=BILLING):
        _, started = store.status_times(row.instance_key)
        if started is not None:
            running.append((started, row.price_usd_per_hour))
    series = tuple(cost_series_usd(closed, running, now_s))
    total = series[-1][1] if series else 0.0
    usd_per_hour = math.fsum(price for _, price in running)
    return FleetCost(now_s, total, usd_per_hour, series)
