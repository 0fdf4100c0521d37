"""Nodes by identity: allocations keyed by instance key survive the fleet changing under them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoscaler.decide.policy.pollux import PolluxPolicy, PolluxState
from autoscaler.decide.policy.tiresias import TiresiasPolicy
from autoscaler.decide.views import (
    Allocation,
    BatchChoice,
    ClusterView,
    NodeView,
    OfferingRef,
    Plan,
    RoundInput,
)
from autoscaler.errors import InvalidInputError
from tests.decide.policy.conftest import model, view


def _cluster(*nodes: NodeView, **kw) -> ClusterView:
    return ClusterView(tuple(nodes), now_s=600.0, round_index=3, **kw)


def test_allocation_is_an_immutable_mapping_without_zeros() -> None:
    a = Allocation({"b": 2, "a": 0, "c": 1})
    assert dict(a) == {"b": 2, "c": 1}
    assert a == {"c": 1, "b": 2, "x": 0}
    assert hash(a) == hash(Allocation([("c", 1), ("b", 2)]))
    assert (a.num_gpus, a.num_nodes, a.placement) == (3, 2, (2, 1))
    assert a.without(["b"]) == {"c": 1}
    assert Allocation() == {} and Allocation().num_gpus == 0
    for bad in ({"": 1}, {"a": -1}, {"a": 1.5}):
        with pytest.raises(InvalidInputError):
            Allocation(bad)


def test_cluster_view_dense_and_sparse_by_id() -> None:
    c = _cluster(NodeView("x", "T4", 4), NodeView("y", "A100", 8))
    assert c.gpus_per_node == (4, 8) and c.total_gpus == 12 and c.gpu_types == ("A100", "T4")
    assert c.dense({"y": 3, "gone": 5}) == (0, 3)  # nodes not in the fleet are dropped
    assert c.sparse((1, 0)) == {"x": 1}
    with pytest.raises(InvalidInputError, match="duplicate"):
        _cluster(NodeView("x", "T4", 4), NodeView("x", "T4", 4))
    with pytest.raises(InvalidInputError):
        NodeView("z", "T4", 0)


def test_fleet_counts_instances_per_offering() -> None:
    spot = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
    c = _cluster(
        NodeView("a", "T4", 4, spot), NodeView("b", "T4", 4, spot), NodeView("local", "T4", 1)
    )
    assert dict(c.fleet()) == {"aws/g4dn.12xlarge/use1-az1/spot": 2}


def _plan_round(c: ClusterView, allocations: dict) -> tuple[Plan, RoundInput]:
    jobs = tuple(view(name, alloc=None) for name in allocations)
    plan = Plan(
        allocations,
        {n: BatchChoice(sum(a.values()) * 32, 32, 1) for n, a in allocations.items() if a},
    )
    return plan, RoundInput(c, jobs)


def test_plan_validation_by_node_id() -> None:
    c = _cluster(NodeView("t", "T4", 4), NodeView("a", "A100", 8))
    plan, ri = _plan_round(c, {"j": {"t": 2}, "k": {"a": 8}})
    plan.validate(ri, single_type=True)
    plan, ri = _plan_round(c, {"j": {"gone": 2}, "k": {}})
    with pytest.raises(InvalidInputError, match="not in the fleet"):
        plan.validate(ri)
    plan, ri = _plan_round(c, {"j": {"t": 2, "a": 2}, "k": {}})
    plan.validate(ri)  # type-unaware policies may mix types
    with pytest.raises(InvalidInputError, match="spans GPU types"):
        plan.validate(ri, single_type=True)
    plan, ri = _plan_round(c, {"j": {"a": 5}, "k": {"a": 4}})
    with pytest.raises(InvalidInputError, match="node a over-allocated"):
        plan.validate(ri)


def test_removing_a_node_changes_nothing_for_jobs_on_other_nodes() -> None:
    """Tiresias keeps running jobs where they are; with positions instead of ids, removing the
    first node would have shifted every other job onto the wrong node."""
    nodes = [NodeView(f"i-{k}", "T4", 4) for k in range(5)]
    before = _cluster(*nodes)
    policy = TiresiasPolicy()
    jobs = [
        view("on0", requested=4),
        view("on1", requested=4),
        view("on2", requested=4),
        view("on3", requested=4),
    ]
    d = policy.decide(RoundInput(before, tuple(jobs)), policy.initial_state())
    placed = dict(d.plan.allocations)
    assert {a.num_gpus for a in placed.values()} == {4}
    lost = next(n for n, a in placed.items() if "i-0" in a)
    after = _cluster(*nodes[1:])  # i-0 preempted
    survivors = [replace(job, allocation=placed[job.name].without(["i-0"])) for job in jobs]
    d2 = policy.decide(RoundInput(after, tuple(survivors)), d.state)
    for name, alloc in placed.items():
        if name != lost:
            assert d2.plan.allocations[name] == alloc
    # The job that lost its node restarts on the node left free, not on anyone else's.
    assert d2.plan.allocations[lost] == {"i-4": 4}


def test_pollux_warm_start_maps_population_by_node_id() -> None:
    nodes = [NodeView(f"n{k}", "T4", 4) for k in range(3)]
    policy = PolluxPolicy(seed=1, population=8, generations=4)
    jobs = (view("a", model=model(0.001), profiled=4), view("b", model=model(0.001), profiled=4))
    d = policy.decide(RoundInput(_cluster(*nodes), jobs), policy.initial_state())
    state = d.state
    assert isinstance(state, PolluxState) and state.instance_keys == ("n0", "n1", "n2")
    # Drop n0 and add n9: the columns of n1 and n2 must follow their ids.
    after = _cluster(nodes[1], nodes[2], NodeView("n9", "T4", 4))
    pop = policy._initial_population(
        [jobs[0], jobs[1]], after.instance_keys, state.population[0] * 0, state
    )
    prev = state.population
    assert (pop[1:, :, 0] == prev[1:, :, 1]).all()
    assert (pop[1:, :, 1] == prev[1:, :, 2]).all()
    assert (pop[1:, :, 2] == 0).all()
