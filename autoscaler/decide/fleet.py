"""What a fleet strategy sees and returns: the decision core's side of fleet sizing.

A :class:`FleetStrategy` (goodput-per-dollar sizing, a fixed fleet, the baselines in
:mod:`autoscaler.decide.strategies`) is asked once per round, by the controller's round
(:mod:`autoscaler.controller.loop`), which the simulator runs unmodified: it sees a
:class:`FleetView` and returns instance counts per offering key. Pure data; no cloud call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from autoscaler.decide.sizing import FleetOption
from autoscaler.decide.views import ClusterView, JobView

__all__ = ["FleetStrategy", "FleetView"]


@dataclass(frozen=True)
class FleetView:
    """What a fleet strategy sees each round: the time, the active jobs as the policy sees
    them, the ready nodes, the instances held per offering key (pending included), and one
    :class:`~autoscaler.decide.sizing.FleetOption` per offering at the prices in effect."""

    now_s: float
    jobs: tuple[JobView, ...]
    cluster: ClusterView
    held: Mapping[str, int]
    options: tuple[FleetOption, ...]


class FleetStrategy(Protocol):
    """Decides the fleet: instance counts per offering key (missing keys: 0)."""

    @property
    def name(self) -> str: ...

    def propose(self, view: FleetView) -> Mapping[str, int]: ...
