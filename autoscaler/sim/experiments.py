"""The cloud experiments: which offerings, traces, strategies and policies each one uses.

Offerings come from the shipped catalogue (:func:`autoscaler.market.catalog.load_catalog`, real
AWS prices with their dates), all in one zone, ``us-east-1`` / ``use1-az1`` (the zone with
spot prices for every instance type used):

- ``g4dn.xlarge`` (1 x T4) and ``g4dn.12xlarge`` (4 x T4): spot capacity replays the Bamboo
  g4dn availability trace (each trace node is one instance of the offering; the trace is
  applied to each g4dn offering on its own);
- ``p3.16xlarge`` (8 x V100): spot capacity replays the Bamboo p3 trace;
- ``p4d.24xlarge`` (8 x A100, E3 only): no trace; spot preemptions at the Spot Advisor band's
  hazard (:class:`autoscaler.market.preemption.SpotHazardModel`), seeded.

Spot prices are constant at the catalogue's price, or (``spot_prices="stochastic"``) a seeded
mean-reverting walk around it, capped at the on-demand price. Every
strategy runs with a 60 s round, a 2 min provisioning delay, checkpoints every 10 min and a
20 s checkpoint write (so AWS's 120 s notice always suffices), per-second billing with a 60 s
minimum.

E1 and E2 offer the same instance types; the baselines use only what they are defined on
(below), the coadapt strategies all of them.

Strategies (see :mod:`autoscaler.decide.strategies` for the rules):

========================  ============================================  ========
name                      fleet                                          policy
========================  ============================================  ========
``static-ondemand``       16 x g4dn.12xlarge on demand                   pollux
``pollux-autoscale``      g4dn.12xlarge on demand, utility band          pollux
``throughput-autoscale``  g4dn.12xlarge on demand, throughput sizing     coadapt
``throughput-anytype``    every on-demand type, throughput sizing        coadapt
``cheapest-spot``         per job, cheapest spot offering that fits      tiresias
``coadapt-ondemand``      goodput-per-dollar sizing, on demand only      coadapt
``coadapt``               goodput-per-dollar sizing, spot + on demand    coadapt
``coadapt-t4`` ...        ``coadapt`` restricted to one GPU type         coadapt
``ondemand-only``         per job, cheapest on-demand offering that      tiresias
                          fits
``uniform-progress``      per job, cheapest spot while ahead of the      tiresias
                          uniform rate to its deadline, else on demand
========================  ============================================  ========

E4 (deadlines) offers E2's instance types; its jobs carry deadlines (``TraceJob.
deadline_after_s``, set by ``benchmarks/cloud_cost.py --deadline-factor``).

``throughput-autoscale`` is Or et al.'s throughput-driven elastic training: the fleet sized by
throughput gain (statistical efficiency ignored), and jobs that keep their per-GPU batch, so
their total batch grows with their GPUs (the coadapt policy with ``batch_rule="linear"``
allocates them). ``throughput-anytype`` (E1) is the same rule over every instance type
``coadapt-ondemand`` may buy, so that goodput sizing is also compared with throughput sizing
on the same menu (the paper's baseline knows one instance type).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.strategies import (
    FixedFleet,
    GoodputSizing,
    PerJobCheapest,
    UniformProgress,
    UtilityBand,
)
from autoscaler.errors import InvalidInputError
from autoscaler.market.catalog import Catalog, MarketOffering, load_catalog
from autoscaler.market.preemption import (
    AvailabilityTrace,
    SpotHazardModel,
    bamboo_trace_path,
    load_availability_trace,
    load_hazard_model,
)
from autoscaler.market.series import ConstantPrice, StochasticSpotPrice
from autoscaler.sim.boot import load_boot_times
from autoscaler.sim.cloud_config import CloudConfig, CloudOffering, FleetStrategy, PreemptionModel
from autoscaler.sim.cluster import INTERCONNECTS
from autoscaler.sim.truths import MEASURED, WORLDS
from autoscaler.sim.workload import TraceJob

__all__ = [
    "EXPERIMENTS",
    "SPOT_FAMILIES",
    "CloudRun",
    "HazardPreemption",
    "TracePreemption",
    "build_run",
    "e1_workload",
    "experiment_menu",
    "with_deadlines",
]

REGION = "us-east-1"
ZONE = "use1-az1"

#: Strategies per experiment, in the order the benchmark prints them.
EXPERIMENTS: Mapping[str, tuple[str, ...]] = {
    "E1": (
        "pollux-autoscale",
        "throughput-autoscale",
        "throughput-anytype",
        "coadapt-ondemand",
        "coadapt",
    ),
    "E2": (
        "static-ondemand",
        "pollux-autoscale",
        "throughput-autoscale",
        "cheapest-spot",
        "coadapt",
    ),
    "E3": ("coadapt", "coadapt-t4", "coadapt-v100", "coadapt-a100"),
    "E4": ("ondemand-only", "cheapest-spot", "uniform-progress", "coadapt"),
}

_INSTANCES: Mapping[str, tuple[str, ...]] = {
    "E1": ("g4dn.xlarge", "g4dn.12xlarge", "p3.16xlarge"),
    "E2": ("g4dn.xlarge", "g4dn.12xlarge", "p3.16xlarge"),
    "E3": ("g4dn.xlarge", "g4dn.12xlarge", "p3.16xlarge", "p4d.24xlarge"),
    "E4": ("g4dn.xlarge", "g4dn.12xlarge", "p3.16xlarge"),
}
_TRACE_OF: Mapping[str, str] = {"g4dn": "g4dn-trace.csv", "p3": "p3-trace.csv"}
#: Instance families whose spot capacity replays an availability trace.
SPOT_FAMILIES: tuple[str, ...] = tuple(_TRACE_OF)
#: Intra-node GPU links of instance types not in the simulator's table (one GPU: unused).
_SINGLE_GPU_INTRA_GBYTES_PER_S = 16.0


@dataclass(frozen=True)
class TracePreemption:
    """A replayed availability trace as a :class:`~autoscaler.sim.cloud_config.PreemptionModel`:
    capacity only (instances are preempted when it drops below what is held)."""

    trace: AvailabilityTrace

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return None

    def capacity_at(self, t_s: float) -> int | None:
        return self.trace.capacity_at(t_s)

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        times, caps = self.trace.times_s, self.trace.capacity
        return [(t, c) for t, c in zip(times, caps, strict=True) if t0_s < t <= t1_s]


@dataclass(frozen=True)
class HazardPreemption:
    """A constant per-instance hazard as a :class:`~autoscaler.sim.cloud_config.PreemptionModel`."""

    model: SpotHazardModel
    offering: MarketOffering

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return self.model.sample_preemption_s(self.offering, instance_id, launched_at_s)

    def capacity_at(self, t_s: float) -> int | None:
        return None

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        return []


@dataclass(frozen=True)
class CloudRun:
    """One strategy of one experiment: the policy to run and the cloud it runs on."""

    experiment: str
    strategy: str
    policy: str
    cloud: CloudConfig
    policy_options: Mapping[str, object] = field(default_factory=dict)


def e1_workload() -> tuple[TraceJob, ...]:
    """The paper's cloud experiment: one ImageNet job (the traces' own batch size and GPUs of
    an ImageNet job of workload-1), alone."""
    return (TraceJob("imagenet-0", "imagenet", 0.0, 32, 6400),)


def with_deadlines(
    jobs: Sequence[TraceJob],
    factor: float,
    *,
    provisioning_delay_s: float = 120.0,
    restart_delay_s: float = 30.0,
    interval_s: float = 60.0,
    gpus_per_node: int = 4,
) -> tuple[TraceJob, ...]:
    """E4's jobs: each with a deadline ``factor`` x its JCT alone on its requested GPUs on
    demand -- :func:`~autoscaler.sim.engine.isolated_jct_s` on T4s (its cheapest on-demand
    fit, g4dn) ``gpus_per_node`` to an instance, plus what getting them takes: the
    instance's provisioning, the job's start, and the two rounds that see the job and then
    its instance."""
    from autoscaler.sim.engine import isolated_jct_s  # the engine imports the sim's world

    if not (math.isfinite(factor) and factor > 0):
        raise InvalidInputError(f"deadline factor must be > 0, got {factor}", field="factor")
    out = []
    for spec in jobs:
        alone = isolated_jct_s(spec, max(1, spec.num_replicas), gpus_per_node)
        reference = alone + provisioning_delay_s + restart_delay_s + 2 * interval_s
        out.append(dataclasses.replace(spec, deadline_after_s=factor * reference))
    return tuple(out)


def _offerings(
    experiment: str,
    catalog: Catalog,
    *,
    markets: Sequence[str],
    gpu_types: Sequence[str] | None,
    traces: Mapping[str, AvailabilityTrace],
    hazard: SpotHazardModel,
    spot_prices: str = "constant",
    seed: int = 0,
) -> tuple[CloudOffering, ...]:
    out = []
    for instance_type in _INSTANCES[experiment]:
        priced = catalog.get("aws", instance_type, ZONE)
        if gpu_types is not None and priced.gpu_type not in gpu_types:
            continue
        link = INTERCONNECTS.get(instance_type)
        intra = link.intra_gbytes_per_s if link else _SINGLE_GPU_INTRA_GBYTES_PER_S
        network = link.network_gbps if link else float(priced.network_gbps or 25.0)
        for market in markets:
            price = priced.price_usd_per_hour(market)
            if price is None:
                continue
            market_offering = MarketOffering(priced, market, price)
            preemption: PreemptionModel | None = None
            hazard_per_hour = 0.0
            if market == "spot":
                family = instance_type.split(".")[0]
                trace = traces.get(family)
                if trace is not None:
                    preemption = TracePreemption(trace)
                else:
                    preemption = HazardPreemption(hazard, market_offering)
                    hazard_per_hour = hazard.hazard_per_hour(market_offering)
            out.append(
                CloudOffering(
                    ref=market_offering.ref,
                    gpu_type=priced.gpu_type,
                    gpus=priced.gpus,
                    price=(
                        StochasticSpotPrice.for_offering(priced, seed)
                        if market == "spot" and spot_prices == "stochastic"
                        else ConstantPrice(price)
                    ),
                    ondemand_usd_per_hour=priced.ondemand_usd_per_hour,
                    preemption=preemption,
                    notice_s=120.0,
                    hazard_per_hour=hazard_per_hour,
                    intra_gbytes_per_s=intra,
                    network_gbps=network,
                    region=REGION,
                )
            )
    if not out:
        raise InvalidInputError(f"no offerings for {experiment} {markets} {gpu_types}")
    return tuple(out)


def load_traces(paths: Mapping[str, str | Path] | None = None) -> dict[str, AvailabilityTrace]:
    """The spot availability traces by instance family: the shipped Bamboo ones (``g4dn``,
    ``p3``), each replaced by the file ``paths`` gives for its family, if any."""
    chosen: dict[str, str | Path] = {
        family: bamboo_trace_path(name) for family, name in _TRACE_OF.items()
    }
    chosen.update(paths or {})
    return {family: load_availability_trace(path) for family, path in chosen.items()}


def experiment_menu(
    experiment: str,
    *,
    catalog: Catalog | None = None,
    traces: Mapping[str, AvailabilityTrace] | None = None,
    spot_prices: str = "constant",
    seed: int = 0,
) -> tuple[CloudOffering, ...]:
    """Every offering of ``experiment`` (each instance type, spot and on demand), priced and
    preempted as :func:`build_run` gives them to any strategy: what the cost floor may buy
    from (the least *any* fleet could have paid)."""
    if experiment not in EXPERIMENTS:
        raise InvalidInputError(f"unknown experiment {experiment!r}", field="experiment")
    if spot_prices not in ("constant", "stochastic"):
        raise InvalidInputError(f"unknown spot price model {spot_prices!r}", field="spot_prices")
    return _offerings(
        experiment,
        catalog or load_catalog(),
        markets=["spot", "on-demand"],
        gpu_types=None,
        traces=load_traces() if traces is None else traces,
        hazard=load_hazard_model(seed=seed),
        spot_prices=spot_prices,
        seed=seed,
    )


def build_run(
    experiment: str,
    strategy: str,
    *,
    catalog: Catalog | None = None,
    traces: Mapping[str, AvailabilityTrace] | None = None,
    sizing: SizingConfig | None = None,
    budget_usd_per_hour: float | None = None,
    spot_prices: str = "constant",
    seed: int = 0,
    world: str = MEASURED,
) -> CloudRun:
    """The :class:`CloudRun` of ``strategy`` in ``experiment`` (see the module docstring).
    ``spot_prices``: ``"constant"`` (the catalogue's) or ``"stochastic"``
    (:class:`~autoscaler.market.series.StochasticSpotPrice` around it, capped at on-demand, seeded
    by ``seed`` and the offering). ``world``: in a ``"measured"`` one (:mod:`autoscaler.sim.
    truths`) each instance boots in a time drawn from the public measurements
    (:func:`~autoscaler.sim.boot.load_boot_times`, seeded); in the ``"ideal"`` one in the
    sizing's ``provisioning_delay_s``. The run's ``SimConfig.world`` should name the same."""
    if world not in WORLDS:
        raise InvalidInputError(f"unknown world {world!r}", field="world")
    if spot_prices not in ("constant", "stochastic"):
        raise InvalidInputError(f"unknown spot price model {spot_prices!r}", field="spot_prices")
    if experiment not in EXPERIMENTS:
        raise InvalidInputError(f"unknown experiment {experiment!r}", field="experiment")
    if strategy not in EXPERIMENTS[experiment]:
        raise InvalidInputError(
            f"{experiment} has no strategy {strategy!r}; "
            f"it has {', '.join(EXPERIMENTS[experiment])}",
            field="strategy",
        )
    catalog = catalog or load_catalog()
    traces = load_traces() if traces is None else traces
    hazard = load_hazard_model(seed=seed)
    sizing = sizing or SizingConfig(budget_usd_per_hour=budget_usd_per_hour)

    def offer(markets: Sequence[str], types: Sequence[str] | None = None, instances=None):
        found = _offerings(
            experiment,
            catalog,
            markets=markets,
            gpu_types=types,
            traces=traces,
            hazard=hazard,
            spot_prices=spot_prices,
            seed=seed,
        )
        if instances is not None:
            found = tuple(o for o in found if o.ref.instance_type in instances)
        return found

    t4_node = ("g4dn.12xlarge",)
    plan: FleetStrategy
    policy_options: dict[str, object] = {}
    if strategy == "static-ondemand":
        offerings = offer(["on-demand"], instances=t4_node)
        plan = FixedFleet(strategy, {offerings[0].key: 16})
        policy = "pollux"
    elif strategy == "pollux-autoscale":
        offerings = offer(["on-demand"], instances=t4_node)
        plan = UtilityBand(strategy, offerings[0].key)
        policy = "pollux"
    elif strategy == "throughput-autoscale":
        offerings = offer(["on-demand"], instances=t4_node)
        cfg = dataclasses.replace(sizing, value="throughput")
        plan = GoodputSizing(strategy, cfg)
        policy = "coadapt"
        policy_options = {"batch_rule": "linear"}
    elif strategy == "throughput-anytype":
        offerings = offer(["on-demand"])
        plan = GoodputSizing(strategy, dataclasses.replace(sizing, value="throughput"))
        policy = "coadapt"
        policy_options = {"batch_rule": "linear"}
    elif strategy == "ondemand-only":
        offerings = offer(["on-demand"])
        plan = PerJobCheapest(strategy)
        policy = "tiresias"
    elif strategy == "uniform-progress":
        offerings = offer(["spot", "on-demand"])
        plan = UniformProgress(strategy)
        policy = "tiresias"
    elif strategy == "cheapest-spot":
        offerings = offer(["spot"])
        plan = PerJobCheapest(strategy)
        policy = "tiresias"
    elif strategy == "coadapt-ondemand":
        offerings = offer(["on-demand"])
        plan = GoodputSizing(strategy, sizing)
        policy = "coadapt"
    elif strategy.startswith("coadapt"):
        types = None
        if strategy != "coadapt":
            types = [strategy.removeprefix("coadapt-").upper()]
        offerings = offer(["spot", "on-demand"], types)
        plan = GoodputSizing(strategy, sizing)
        policy = "coadapt"
    else:  # pragma: no cover - every listed name is handled above
        raise InvalidInputError(f"unknown strategy {strategy!r}", field="strategy")
    cloud = CloudConfig(
        offerings,
        plan,
        boot=load_boot_times(seed) if world == MEASURED else None,
        budget_usd_per_hour=sizing.budget_usd_per_hour,
    )
    return CloudRun(experiment, strategy, policy, cloud, policy_options)
