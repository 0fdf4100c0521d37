"""The fleet sizing under the user's market and offering limits: a job limited to on demand is
bought on-demand capacity (never given spot GPUs in the model), a job limited to one offering
is bought that offering, a job no offering on sale allows is given nothing, and demands that
set no limit are sized exactly as before (the strategies' demands carry the limit from the
job's view, by the rule the policies place by)."""

from __future__ import annotations

import dataclasses

from autoscaler.decide.fleet import FleetView
from autoscaler.decide.sizing import FleetOption, JobDemand, SizingConfig, size_fleet
from autoscaler.decide.strategies import GoodputSizing, PerJobCheapest, demands_of
from autoscaler.decide.views import ClusterView, OfferingRef
from autoscaler.model.gputypes import default_speed_table
from tests.decide.policy.conftest import model, view

SPEEDS = default_speed_table()
SPOT = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
OD = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "on-demand")
SPOT_B = OfferingRef("aws", "g4dn.12xlarge", "use1-az2", "spot")
# The options' keys (provider/instance_type/zone/market, as the controller's options have): the
# limits are judged on ``ref``, never on the key.
OPTIONS = (
    FleetOption("aws/g4dn.12xlarge/use1-az1/spot", "T4", 4, "spot", 1.3, 0.01, ref=SPOT),
    FleetOption("aws/g4dn.12xlarge/use1-az1/on-demand", "T4", 4, "on-demand", 3.912, ref=OD),
    FleetOption("aws/g4dn.12xlarge/use1-az2/spot", "T4", 4, "spot", 1.5, 0.01, ref=SPOT_B),
)
KEY = {o.ref: o.key for o in OPTIONS}


def _linear(name: str, gpus: int, options: frozenset[str] | None = None) -> JobDemand:
    curve = tuple(float(min(g, gpus)) for g in range(1, 33))
    return JobDemand(name, {("T4", 4): curve}, options=options)


def test_each_job_is_bought_what_it_may_use() -> None:
    free = _linear("free", 4)
    od = _linear("od", 4, frozenset({KEY[OD]}))
    zone_b = _linear("zone-b", 4, frozenset({KEY[SPOT_B]}))
    p = size_fleet([free, od, zone_b], OPTIONS, {}, SizingConfig(), SPEEDS)
    assert dict(p.counts) == {KEY[SPOT]: 1, KEY[OD]: 1, KEY[SPOT_B]: 1}
    assert p.gpus_by_job == {"free": 4, "od": 4, "zone-b": 4}
    # Without the limits the same jobs share the cheapest spot offering.
    p = size_fleet(
        [_linear(n, 4) for n in ("free", "od", "zone-b")], OPTIONS, {}, SizingConfig(), SPEEDS
    )
    assert dict(p.counts) == {KEY[SPOT]: 3}


def test_a_job_nothing_on_sale_allows_is_given_nothing() -> None:
    nowhere = _linear("nowhere", 4, frozenset())
    p = size_fleet([nowhere, _linear("free", 4)], OPTIONS, {}, SizingConfig(), SPEEDS)
    assert p.gpus_by_job == {"free": 4}
    assert dict(p.counts) == {KEY[SPOT]: 1}


def _view(*jobs) -> FleetView:
    return FleetView(600.0, tuple(jobs), ClusterView((), 600.0, 0), {}, OPTIONS)


def test_strategies_read_the_limits_from_the_job_view() -> None:
    """The demands carry the offerings each job's view allows (``FleetOption.allows``), only
    for a job that limits them; GoodputSizing and PerJobCheapest buy accordingly."""
    base = view("od", requested=4, profiled=4, model=model(0.001))
    od = dataclasses.replace(base, markets=frozenset({"on-demand"}))
    zone_b = dataclasses.replace(base, name="zone-b", offerings=frozenset({SPOT_B}))
    free = dataclasses.replace(base, name="free", submit_time_s=1.0)
    demands = {d.name: d for d in demands_of(_view(od, zone_b, free), SPEEDS)}
    assert demands["od"].options == {KEY[OD]}
    assert demands["zone-b"].options == {KEY[SPOT_B]}
    assert demands["free"].options is None
    counts = GoodputSizing("g").propose(_view(od, zone_b, free))
    assert counts.get(KEY[OD], 0) >= 1 and counts.get(KEY[SPOT_B], 0) >= 1
    assert PerJobCheapest("c").propose(_view(od, zone_b, free)) == {
        KEY[OD]: 1,
        KEY[SPOT_B]: 1,
        KEY[SPOT]: 1,
    }
