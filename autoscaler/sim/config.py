"""The simulator's cluster and simulation settings (:class:`SimConfig`).

Its own module so that the engine (:mod:`autoscaler.sim.engine`) and the results it produces
(:mod:`autoscaler.sim.results`, which records the config) both import it, and neither imports
the other back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.errors import InvalidInputError

__all__ = ["SimConfig"]


@dataclass(frozen=True)
class SimConfig:
    """Cluster and simulation settings.

    ``interference`` is the fractional slowdown of a multi-node job that shares a node with
    another multi-node job; ``interference_avoidance`` asks policies that support it to keep
    such sharing away. ``max_time_s`` bounds the simulated time (a policy that starves a job
    forever fails instead of looping). ``seed`` seeds randomised policies.
    ``refit_tolerance``: a job's throughput model is refitted when it runs a new configuration
    whose iteration time the current model mispredicts by more than this fraction (0 = refit
    on every new configuration). ``fixed_applications``: jobs of these applications are
    opted out of adaptation (they keep their user's GPU count as a cap, and batch size) — the
    paper's simulator runs NCF this way under Pollux and Optimus; pass ``()`` to adapt all.
    """

    num_nodes: int = 16
    gpus_per_node: int = 4
    interval_s: float = 60.0
    restart_delay_s: float = 30.0
    interference: float = 0.0
    interference_avoidance: bool = True
    seed: int = 0
    max_time_s: float = 30 * 24 * 3600.0
    refit_tolerance: float = 0.05
    fixed_applications: tuple[str, ...] = ("ncf",)

    def __post_init__(self) -> None:
        if self.num_nodes < 1 or self.gpus_per_node < 1:
            raise InvalidInputError("need at least one node with one GPU", field="num_nodes")
        if not self.interval_s > 0 or not math.isfinite(self.interval_s):
            raise InvalidInputError("interval_s must be > 0", field="interval_s")
        if self.restart_delay_s < 0:
            raise InvalidInputError("restart_delay_s must be >= 0", field="restart_delay_s")
        if self.refit_tolerance < 0:
            raise InvalidInputError("refit_tolerance must be >= 0", field="refit_tolerance")
        if not 0 <= self.interference < 1:
            raise InvalidInputError("interference must be in [0, 1)", field="interference")

    @property
    def total_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node
