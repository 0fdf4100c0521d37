"""The simulator's cluster and simulation settings (:class:`SimConfig`).

Its own module so that the engine (:mod:`autoscaler.sim.engine`) and the results it produces
(:mod:`autoscaler.sim.results`, which records the config) both import it, and neither imports
the other back.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

from autoscaler.decide.views import PolicyName
from autoscaler.errors import InvalidInputError
from autoscaler.sim.cloud_config import CloudConfig
from autoscaler.sim.cluster import ClusterSpec, uniform_cluster
from autoscaler.sim.truths import WORLDS, check_speed_error

__all__ = ["PAPER_POLICIES", "SimConfig"]

#: The policies the Pollux paper compares, whose simulator results it published. They run as
#: published: without the controller's hold (:mod:`autoscaler.controller.hold`), which none
#: of them had (their fidelity pins compare them with the paper's figures).
PAPER_POLICIES: tuple[PolicyName, ...] = (
    PolicyName.POLLUX,
    PolicyName.TIRESIAS,
    PolicyName.OPTIMUS,
)


LENGTHS: tuple[str, ...] = ("declared", "none")
"""What a simulated policy may know of job lengths (``SimConfig.lengths``)."""


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
    ``cluster``: node groups of several GPU types (overrides ``num_nodes`` and
    ``gpus_per_node``, which describe a uniform T4 cluster); ``traces_dir``: a data folder
    holding one ``<application>/`` folder each, used instead of the shipped Pollux traces.
    ``cloud``: run on a fleet of priced instances that a fleet strategy sizes every round
    (:mod:`autoscaler.sim.cloud_config`); the cluster above then only sets the fair share that
    finish-time fairness is measured against. ``lengths``: what the policy may know of a job's
    length, as a controller would: ``"declared"`` (every job's script declares its length, the
    workload's target; the policy gets the remaining work by the trainer's rule,
    :func:`trainer.report.remaining_progress`) or ``"none"`` (no job declares: no remaining
    work is known). Jobs end at their true length either way. ``job_markets`` and
    ``job_offerings``: per job name, the ``markets`` and ``offerings`` its spec gives (the
    controller's :class:`~autoscaler.controller.jobbook.JobSubmission` fields; jobs not named
    set neither). ``world``: the world's own truths, ``"ideal"`` (the paper's simulator's:
    restarts of exactly ``restart_delay_s``, exact reports), ``"measured"``, or one of its
    two ablations (:data:`~autoscaler.sim.truths.WORLDS`); ``speed_error``:
    how far the true speed of a type derived from the speed table may stray from it (see
    :mod:`autoscaler.sim.truths`).
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
    cluster: ClusterSpec | None = None
    traces_dir: str | None = None
    cloud: CloudConfig | None = None
    lengths: str = "declared"
    job_markets: tuple[tuple[str, tuple[str, ...]], ...] = ()
    job_offerings: tuple[tuple[str, tuple[str, ...]], ...] = ()
    world: str = "ideal"
    speed_error: float = 0.0

    def __post_init__(self) -> None:
        if self.world not in WORLDS:
            raise InvalidInputError(
                f"world must be one of {', '.join(WORLDS)}, got {self.world!r}", field="world"
            )
        check_speed_error(self.speed_error)
        if self.lengths not in LENGTHS:
            raise InvalidInputError(
                f"lengths must be one of {', '.join(LENGTHS)}, got {self.lengths!r}",
                field="lengths",
            )
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

    @functools.cached_property
    def cluster_spec(self) -> ClusterSpec:
        """The node groups simulated (a uniform T4 cluster unless ``cluster`` is given);
        built once per config."""
        if self.cluster is not None:
            return self.cluster
        return uniform_cluster(self.num_nodes, self.gpus_per_node)

    @property
    def total_gpus(self) -> int:
        return self.cluster_spec.total_gpus

    @property
    def max_gpus_per_node(self) -> int:
        return self.cluster_spec.max_gpus_per_node

    @property
    def traces_root(self) -> Path | None:
        """The trace folder (one sub-folder per application), ``None`` for the shipped one."""
        return None if self.traces_dir is None else Path(self.traces_dir)
