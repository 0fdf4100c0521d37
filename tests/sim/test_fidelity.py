"""Fidelity against the paper's published simulator results, on real workloads (slow)."""

from __future__ import annotations

import pytest

from autoscaler.jobs import PolicyName
from autoscaler.sim.config import SimConfig
from autoscaler.sim.runner import RunSpec, paper_reference, paper_workloads, run_many


def _mean_jct(policy: PolicyName, load: str, index: int) -> tuple[float, float]:
    path = paper_workloads(load)[index]
    [result] = run_many([RunSpec(str(path), policy, SimConfig())], processes=1)
    assert len(result.jobs) == (160 if load == "1.0" else 80)  # every job completed
    published = paper_reference(str(policy), load)["avgs"][path.stem]
    return result.summary()["mean_jct_s"], published


@pytest.mark.slow
@pytest.mark.parametrize("policy", [PolicyName.TIRESIAS, PolicyName.OPTIMUS])
def test_baselines_match_published_workload(policy: PolicyName) -> None:
    ours, published = _mean_jct(policy, "1.0", 0)
    assert ours == pytest.approx(published, rel=0.10)


@pytest.mark.slow
def test_pollux_matches_published_and_beats_baselines() -> None:
    pollux, published = _mean_jct(PolicyName.POLLUX, "0.5", 0)
    assert pollux == pytest.approx(published, rel=0.20)
    for baseline in (PolicyName.TIRESIAS, PolicyName.OPTIMUS):
        other, _ = _mean_jct(baseline, "0.5", 0)
        assert pollux < other
