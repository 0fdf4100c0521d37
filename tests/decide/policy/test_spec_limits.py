"""A job's market and offering limits hold under every policy: a job limited to on-demand never
holds a spot node, a job limited to some offerings holds only their nodes, on a mixed fleet
where the other jobs fill both markets; a round where no job sets a limit decides as before."""

from __future__ import annotations

import dataclasses

import pytest

from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.coadapt import pools_of
from autoscaler.decide.views import (
    Allocation,
    ClusterView,
    JobView,
    NodeView,
    OfferingRef,
    RoundInput,
)
from providers.base import Market, Offering, offering_key
from tests.decide.policy.conftest import model, view

SPOT_A = OfferingRef("fake", "g4dn.12xlarge", "us-east-1a", "spot")
SPOT_B = OfferingRef("fake", "g4dn.12xlarge", "us-east-1b", "spot")
OD_A = OfferingRef("fake", "g4dn.12xlarge", "us-east-1a", "on-demand")
POLICIES = ("coadapt", "pollux", "tiresias", "optimus")


def _fleet(*offerings: OfferingRef, now_s: float = 600.0, index: int = 10) -> ClusterView:
    """One 4-GPU T4 node per offering given, in that order."""
    nodes = tuple(NodeView(f"n{i}", "T4", 4, o) for i, o in enumerate(offerings))
    return ClusterView(nodes, now_s, index)


MIXED = (SPOT_A, OD_A, SPOT_B, OD_A, SPOT_A, SPOT_B)


def _jobs() -> list[JobView]:
    """Jobs that scale and ask for 4 GPUs each: more than the on-demand nodes hold, so a
    policy that ignored the limits would put the limited ones on spot too."""
    out = []
    for i, (markets, offerings) in enumerate(
        [
            (None, None),
            (frozenset({"on-demand"}), None),
            (None, frozenset({SPOT_B})),
            (frozenset({"on-demand"}), None),
            (None, None),
            (None, None),
        ]
    ):
        base = view(f"j{i}", submit=float(i), requested=4, profiled=4, model=model(0.001))
        out.append(dataclasses.replace(base, markets=markets, offerings=offerings))
    return out


def _holds(cluster: ClusterView, alloc: Allocation) -> set[OfferingRef | None]:
    return {cluster.node(n).offering for n in alloc}


@pytest.mark.parametrize("name", POLICIES)
def test_limited_jobs_hold_only_the_nodes_they_allow(name: str) -> None:
    """Four rounds, each round's allocations the next round's: ``markets: [on-demand]`` jobs
    only on on-demand nodes, the ``offerings`` job only on its offering's nodes, and each of
    them runs in some round."""
    policy = make_policy(name)
    state = policy.initial_state()
    jobs = _jobs()
    ran: set[str] = set()
    for r in range(4):
        cluster = _fleet(*MIXED, now_s=600.0 + 60 * r, index=10 + r)
        decision = policy.decide(RoundInput(cluster, tuple(jobs)), state)
        state = decision.state
        plan = decision.plan
        plan.validate(RoundInput(cluster, tuple(jobs)))
        for job in jobs:
            alloc = plan.allocations[job.name]
            held = _holds(cluster, alloc)
            if alloc:
                ran.add(job.name)
            assert all(job.allows_node(cluster.node(n)) for n in alloc), (name, job.name, held)
            if job.markets == {"on-demand"}:
                assert held <= {OD_A}, (name, r, job.name, held)
            if job.offerings is not None:
                assert held <= {SPOT_B}, (name, r, job.name, held)
        jobs = [
            dataclasses.replace(job, allocation=plan.allocations[job.name], age_s=job.age_s + 60)
            for job in jobs
        ]
    assert {"j1", "j2"} <= ran or {"j3", "j2"} <= ran, (name, ran)


@pytest.mark.parametrize("name", POLICIES)
def test_an_on_demand_job_waits_on_an_all_spot_fleet(name: str) -> None:
    """On a fleet of spot nodes only, a job limited to on-demand holds nothing (coadapt
    refuses it, naming the limit and the offerings the fleet has) while the others run."""
    policy = make_policy(name)
    cluster = _fleet(SPOT_A, SPOT_B)
    od = dataclasses.replace(
        view("od", requested=4, profiled=4, model=model(0.001)), markets=frozenset({"on-demand"})
    )
    other = view("other", submit=1.0, requested=4, profiled=4, model=model(0.001))
    plan = policy.decide(RoundInput(cluster, (od, other)), policy.initial_state()).plan
    assert not plan.allocations["od"]
    assert plan.allocations["other"]
    if name == "coadapt":
        assert plan.refused["od"] == (
            f"markets allows on-demand; the fleet can have only {SPOT_A.key}, {SPOT_B.key}"
        )


def test_pools_split_only_when_a_job_limits_its_offerings() -> None:
    """coadapt's pools: one per GPU type and node size, whatever the markets, when no job sets
    a limit (the round is the one it was before limits existed); split by which limited jobs
    allow each node when one does."""
    cluster = _fleet(*MIXED)
    free = [view("a"), view("b", submit=1.0)]
    assert [p.key for p in pools_of(cluster, free)] == ["T4x4"]
    assert pools_of(cluster, free) == pools_of(cluster)
    od = dataclasses.replace(view("od"), markets=frozenset({"on-demand"}))
    pools = pools_of(cluster, [*free, od])
    assert [(p.key, p.nodes) for p in pools] == [("T4x4/0", (0, 2, 4, 5)), ("T4x4/1", (1, 3))]
    twin = dataclasses.replace(od, name="od-2")  # the same limits: no further split
    assert pools_of(cluster, [*free, od, twin]) == pools
    zone_b = dataclasses.replace(view("zb"), offerings=frozenset({SPOT_B}))
    pools = pools_of(cluster, [od, zone_b])
    assert [p.nodes for p in pools] == [(0, 4), (1, 3), (2, 5)]
    assert [p.offerings for p in pools] == [{SPOT_A}, {OD_A}, {SPOT_B}]


def test_the_offering_rule_compares_parts_not_key_formats() -> None:
    """A spec's offering key (``provider/instance_type/zone/market``) is parsed into an
    OfferingRef, equal to the node's; its key is the provider's offering key, the one format
    of the system; a node of no known offering is never allowed to a limited job; a job without
    limits allows every node."""
    assert OfferingRef.parse("fake/g4dn.12xlarge/us-east-1b/spot") == SPOT_B
    assert OfferingRef.parse(SPOT_B.key) == SPOT_B
    parts = ("fake", "g4dn.12xlarge", "us-east-1b")
    for market in Market:
        offering = Offering(*parts[:2], "T4", 4, 48, 192.0, "us-east-1", parts[2], market)
        assert OfferingRef(*parts, market.value).key == offering.key == offering_key(*parts, market)
    job = dataclasses.replace(view("j"), offerings=frozenset({SPOT_B}))
    assert job.allows_node(NodeView("x", "T4", 4, SPOT_B))
    assert not job.allows_node(NodeView("x", "T4", 4, SPOT_A))
    assert not job.allows_node(NodeView("x", "T4", 4, None))
    od = dataclasses.replace(view("j"), markets=frozenset({"on-demand"}))
    assert od.allows_offering(None, "on-demand") and not od.allows_offering(None, "spot")
    assert not od.allows_node(NodeView("x", "T4", 4, SPOT_A))
    assert view("j").allows_node(NodeView("x", "T4", 4, None))
