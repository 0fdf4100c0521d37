"""Tiresias and Optimus on literal rounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.optimus import OptimusPolicy
from autoscaler.decide.policy.placement import pack
from autoscaler.decide.policy.tiresias import TiresiasPolicy, TiresiasState
from autoscaler.decide.views import Oracle, fixed_batch_choice
from autoscaler.errors import InvalidInputError
from autoscaler.model.goodput import BatchLimits
from tests.decide.policy.conftest import cluster, round_input, rows, view

# ---- placement and batch helpers ----------------------------------------------------------


def test_pack_prefers_fullest_free_nodes() -> None:
    free = np.array([2, 4, 3])
    assert pack(4, free) == (0, 4, 0)
    assert pack(3, free) == (0, 0, 3)
    assert pack(2, free) == (2, 0, 0)
    with pytest.raises(InvalidInputError):
        pack(1, free)


@settings(max_examples=200)
@given(
    batch=st.integers(1, 70000),
    gpus=st.integers(1, 64),
    min_local=st.integers(1, 64),
    extra=st.integers(0, 512),
)
def test_fixed_batch_choice_respects_limits(batch, gpus, min_local, extra) -> None:
    limits = BatchLimits(
        init_batch_size=min_local,
        max_batch_size=max(min_local * gpus, 32768),
        max_local_bsz=min_local + extra,
        min_local_bsz=min_local,
    )
    c = fixed_batch_choice(batch, gpus, limits)
    assert limits.min_local_bsz <= c.local_bsz <= limits.max_local_bsz
    assert c.batch_size == gpus * c.local_bsz * c.accum_steps
    assert c.batch_size <= limits.max_batch_size
    if gpus * limits.min_local_bsz <= batch <= limits.max_batch_size:
        # At least the asked batch, unless the job's largest batch is in the way.
        step = gpus * c.accum_steps
        assert c.batch_size >= batch or c.batch_size + step > limits.max_batch_size


# ---- Tiresias -----------------------------------------------------------------------------


def test_tiresias_gangs_skip_ahead_and_keep_running_jobs() -> None:
    c = cluster(nodes=2, gpus=4)
    policy = TiresiasPolicy()
    jobs = [
        view("a", requested=4, alloc=(0, 4)),  # running, keeps its GPUs
        view("b", requested=6),  # does not fit in the 4 left
        view("c", requested=2),  # skips ahead of b
        view("d", requested=2),
    ]
    d = policy.decide(round_input(c, *jobs), policy.initial_state())
    a = rows(c, d.plan)
    assert a["a"] == (0, 4)
    assert a["b"] == (0, 0)
    assert sum(a["c"]) == 2 and sum(a["d"]) == 2
    assert a["c"] == (2, 0) and a["d"] == (2, 0)
    assert d.plan.batches["c"].batch_size == 256
    assert "b" not in d.plan.batches


def test_tiresias_demotes_after_threshold_and_preempts() -> None:
    c = cluster(nodes=1, gpus=4)
    policy = TiresiasPolicy(threshold_gpu_s=3600.0)
    old = view("old", nodes=1, requested=4, alloc=(4,), attained=4000.0)
    new = view("new", nodes=1, requested=4, submit=100.0)
    d = policy.decide(round_input(c, old, new), policy.initial_state())
    assert d.state == TiresiasState(("old",))
    assert rows(c, d.plan) == {"old": (0,), "new": (4,)}
    # Once demoted, stays in queue 1 even when alone.
    d2 = policy.decide(round_input(c, old), d.state)
    assert d2.state.demoted == ("old",)
    assert rows(c, d2.plan)["old"] == (4,)


def test_tiresias_caps_gang_at_cluster_size() -> None:
    c = cluster(nodes=1, gpus=4)
    policy = TiresiasPolicy()
    big = view("big", nodes=1, requested=16, batch=1024)
    d = policy.decide(round_input(c, big), policy.initial_state())
    assert rows(c, d.plan)["big"] == (4,)
    assert policy.gpu_bounds(big, c) == (4, 4)


def test_tiresias_threshold_validation() -> None:
    with pytest.raises(InvalidInputError):
        TiresiasPolicy(threshold_gpu_s=0)


# ---- Optimus ------------------------------------------------------------------------------


def test_optimus_gives_gpus_by_marginal_gain() -> None:
    c = cluster(nodes=2, gpus=4)
    # Job a: perfect scaling, many iterations left; job b: no gain past 2 GPUs.
    a = view("a", batch=4096, oracle=Oracle(1000.0, tuple(1.0 / g for g in range(1, 9))))
    b = view("b", batch=4096, oracle=Oracle(1000.0, (1.0, 0.5) + (0.5,) * 6))
    d = OptimusPolicy().decide(round_input(c, a, b), None)
    got = {k: sum(v) for k, v in rows(c, d.plan).items()}
    assert got == {"a": 6, "b": 2}
    assert d.plan.batches["a"] == fixed_batch_choice(4096, 6, a.limits)


def test_optimus_one_gpu_each_first_in_arrival_order() -> None:
    c = cluster(nodes=1, gpus=2)
    flat = Oracle(1.0, (1.0, 1.0))
    jobs = [view(n, nodes=1, oracle=flat) for n in "abc"]
    d = OptimusPolicy().decide(round_input(c, *jobs), None)
    assert rows(c, d.plan) == {"a": (1,), "b": (1,), "c": (0,)}


def test_optimus_respects_batch_cap_and_keeps_unchanged_allocations() -> None:
    c = cluster(nodes=2, gpus=4)
    # batch 64 with min_local 32: at most 2 GPUs however good the scaling.
    small = view(
        "s", batch=64, alloc=(0, 2), oracle=Oracle(1e6, tuple(1.0 / g for g in range(1, 9)))
    )
    d = OptimusPolicy().decide(round_input(c, small), None)
    assert rows(c, d.plan)["s"] == (0, 2)
    assert OptimusPolicy().gpu_bounds(small, c) == (0, 2)


def test_optimus_without_oracle_uses_model_or_one_gpu() -> None:
    from tests.decide.policy.conftest import model

    c = cluster(nodes=2, gpus=4)
    unknown = view("u")
    fitted = view("f", batch=4096, model=model(0.0001), profiled=1)
    d = OptimusPolicy().decide(round_input(c, unknown, fitted), None)
    assert sum(rows(c, d.plan)["u"]) == 1
    assert sum(rows(c, d.plan)["f"]) > 1


def test_make_policy() -> None:
    assert make_policy("tiresias").name == "tiresias"
    assert make_policy("optimus").name == "optimus"
    assert make_policy("pollux", seed=3).name == "pollux"
    with pytest.raises(InvalidInputError):
        make_policy("fifo")
