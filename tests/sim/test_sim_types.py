"""The simulator on clusters of several GPU types."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoscaler.cli.main import app
from autoscaler.decide.policy import make_policy
from autoscaler.decide.policy.base import Decision
from autoscaler.decide.views import (
    ClusterView,
    JobView,
    Plan,
    PolicyName,
    RoundInput,
    fixed_batch_choice,
)
from autoscaler.errors import TraceFormatError
from autoscaler.model.gputypes import default_speed_table
from autoscaler.model.traces import load_app
from autoscaler.sim.cluster import TypeSpeed, load_cluster
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import _limits, simulate
from autoscaler.sim.results import results_payload
from autoscaler.sim.workload import TraceJob

MIXED = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "mixed-64.yaml"
SMALL_MIXED = """groups:
  - {gpu_type: T4, gpus_per_node: 4, count: 1}
  - {gpu_type: V100, gpus_per_node: 8, count: 1}
"""


@dataclass
class ByType:
    """Scripted: runs each job on the first ``gpus`` GPUs of one GPU type, switching types at
    given rounds; records what it is shown."""

    gpus: int
    schedule: list[tuple[int, str]]  # (from round, GPU type), ascending
    seen: list[RoundInput] = field(default_factory=list)
    name: PolicyName = PolicyName.TIRESIAS
    uses_model: bool = True
    uses_oracle: bool = False
    avoids_interference: bool = False
    type_aware: bool = True

    def initial_state(self) -> None:
        return None

    def gpu_bounds(self, job: JobView, cluster: ClusterView) -> tuple[int, int]:
        return 0, cluster.total_gpus

    def decide(self, round_input: RoundInput, state: Any) -> Decision:
        self.seen.append(round_input)
        c = round_input.cluster
        index = int(c.now_s // c.interval_s)  # rounds since time 0 (the controller's own
        gpu_type = [t for r, t in self.schedule if index >= r][-1]  # count has warm-ups)
        node = next(n for n in c.nodes if n.gpu_type == gpu_type)
        allocs, batches = {}, {}
        for job in round_input.jobs:
            allocs[job.name] = {node.instance_key: self.gpus}
            batches[job.name] = fixed_batch_choice(job.fixed_batch_size, self.gpus, job.limits)
        return Decision(Plan(allocs, batches), state)


def _cluster(tmp_path: Path, text: str = SMALL_MIXED):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return load_cluster(path, speeds=default_speed_table(), applications=["cifar10"])


def test_a_job_moved_between_types_progresses_at_the_new_types_speed(tmp_path: Path) -> None:
    spec = TraceJob("c", "cifar10", 0.0, 2, 512)
    cluster = _cluster(tmp_path)
    switch = 5
    policy = ByType(2, [(0, "T4"), (switch, "V100")])
    res = simulate([spec], policy, SimConfig(cluster=cluster, restart_delay_s=30.0))
    app = load_app("cifar10")
    choice = fixed_batch_choice(512, 2, _limits(app))
    curve = app.progress_curve(choice.batch_size)

    def t_iter(gpu_type: str) -> float:
        group = next(g for g in cluster.groups if g.gpu_type == gpu_type)
        step, sync = TypeSpeed(app, group, default_speed_table()).step_time_s(
            (2,), choice.local_bsz
        )
        return step + (choice.accum_steps - 1) * (step - sync)

    # T4 for rounds 0..switch-1 (after the first start's delay), then V100 after a restart.
    progress = curve.progress_after(0.0, (switch * 60.0 - 30.0) / t_iter("T4"))
    left = float(curve.iterations(app.target_progress) - curve.iterations(progress))
    expected = switch * 60.0 + 30.0 + left * t_iter("V100")
    assert res.jobs[0].jct_s == pytest.approx(expected, rel=1e-9)
    assert res.jobs[0].restarts == 1
    assert t_iter("V100") < t_iter("T4") / 2  # the move mattered
    # Type-aware policies see one fitted model per type the job ran on.
    last = policy.seen[-1].jobs[0]
    assert set(last.models) == {"T4", "V100"}
    assert last.models["V100"].limits.max_local_bsz > last.models["T4"].limits.max_local_bsz


def test_a_job_across_types_runs_at_its_slowest_types_pace(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    spec = TraceJob("c", "cifar10", 0.0, 5, 640)

    @dataclass
    class Across(ByType):
        type_aware: bool = False

        def decide(self, round_input: RoundInput, state: Any) -> Decision:
            c = round_input.cluster
            t4, v100 = (n.instance_key for n in c.nodes)
            job = round_input.jobs[0]
            batch = fixed_batch_choice(job.fixed_batch_size, 5, job.limits)
            return Decision(Plan({job.name: {t4: 1, v100: 4}}, {job.name: batch}), state)

    res = simulate([spec], Across(5, [(0, "T4")]), SimConfig(cluster=cluster))
    app = load_app("cifar10")
    choice = fixed_batch_choice(640, 5, _limits(app))
    times = []
    for group in cluster.groups:
        step, sync = TypeSpeed(app, group, default_speed_table()).step_time_s(
            (4, 1), choice.local_bsz
        )
        times.append(step + (choice.accum_steps - 1) * (step - sync))
    iters = float(app.progress_curve(choice.batch_size).iterations(app.target_progress))
    assert res.jobs[0].jct_s == pytest.approx(30.0 + iters * max(times), rel=1e-9)


def test_type_aware_plans_may_not_mix_types(tmp_path: Path) -> None:
    from autoscaler.sim.engine import SimulationError

    @dataclass
    class Mixer(ByType):
        def decide(self, round_input: RoundInput, state: Any) -> Decision:
            c = round_input.cluster
            job = round_input.jobs[0]
            batch = fixed_batch_choice(job.fixed_batch_size, 2, job.limits)
            alloc = {c.nodes[0].instance_key: 1, c.nodes[1].instance_key: 1}
            return Decision(Plan({job.name: alloc}, {job.name: batch}), state)

    with pytest.raises(SimulationError, match="spans GPU types"):
        simulate(
            [TraceJob("c", "cifar10", 0.0, 2, 512)],
            Mixer(2, [(0, "T4")]),
            SimConfig(cluster=_cluster(tmp_path)),
        )


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("groups:\n  - {gpu_type: X9000, gpus_per_node: 4, count: 1}\n", r"groups\[0\]\.gpu_type"),
        ("groups:\n  - {gpu_type: H100, gpus_per_node: 8, count: 1}\n", r"neither trace files"),
        ("groups:\n  - {gpu_type: T4, gpus_per_node: 0, count: 1}\n", r"gpus_per_node"),
        ("groups:\n  - {gpu_type: T4, gpus_per_node: 4}\n", r"groups\[0\]\.count"),
        (
            "groups:\n  - {gpu_type: T4, gpus_per_node: 4, count: 1, instance_type: z9.huge}\n",
            r"groups\[0\]\.instance_type",
        ),
        ("groups: [\n", r"not valid YAML"),
        ("nodes: 3\n", r"\[groups\]"),
    ],
)
def test_bad_cluster_files_name_file_and_field(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(TraceFormatError, match=match) as info:
        _cluster(tmp_path, text)
    assert "cluster.yaml" in str(info.value)


def test_h100_with_its_own_trace_files_is_accepted(tmp_path: Path) -> None:
    import shutil

    from autoscaler.model.traces import traces_folder

    folder = tmp_path / "traces"
    shutil.copytree(traces_folder() / "cifar10", folder / "cifar10")
    shutil.copy(folder / "cifar10" / "placements.csv", folder / "cifar10" / "placements-H100.csv")
    path = tmp_path / "c.yaml"
    path.write_text(
        "groups:\n  - {gpu_type: H100, gpus_per_node: 4, count: 1, "
        "intra_gbytes_per_s: 16, network_gbps: 50}\n"
    )
    spec = load_cluster(
        path, speeds=default_speed_table(), applications=["cifar10"], traces_root=folder
    )
    group = spec.groups[0]
    measured = TypeSpeed(load_app("cifar10"), group, default_speed_table(), folder)
    assert measured.measured is not None
    assert measured.step_time_s((2,), 128) == load_app("cifar10").step_time_s((2,), 128)


def test_cli_cluster_errors_are_one_line_rc_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups:\n  - {gpu_type: X9000, gpus_per_node: 4, count: 1}\n")
    workload = tmp_path / "w.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\nj,0,cifar10,1,128\n")
    result = CliRunner().invoke(app, ["simulate", str(workload), "--cluster", str(bad)])
    assert result.exit_code == 2
    assert "bad.yaml [groups[0].gpu_type]" in result.output
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_mixed_64_runs_every_policy_to_completion_deterministically(tmp_path: Path) -> None:
    """A 0.5x paper workload on examples/clusters/mixed-64.yaml under every policy (pollux with
    a small search to keep CI short); the same seed gives the same results."""
    from autoscaler.sim.workload import load_workload

    cluster = load_cluster(MIXED, speeds=default_speed_table(), applications=("cifar10",))
    assert cluster.total_gpus == 64
    work = load_workload(
        Path(__file__).resolve().parents[2] / "autoscaler/data/pollux/workloads-0.5/workload-5.csv"
    )
    jobs = work.jobs[:30]
    config = SimConfig(cluster=cluster)
    for name, options in [
        ("tiresias", {}),
        ("optimus", {}),
        ("pollux", {"population": 16, "generations": 10}),
    ]:
        runs = [
            results_payload([simulate(jobs, make_policy(name, seed=2, **options), config)])
            for _ in range(2)
        ]
        assert json.dumps(runs[0]) == json.dumps(runs[1])
        run = runs[0]["runs"][0]
        assert len(run["jobs"]) == len(jobs)
        assert run["config"]["cluster"]["groups"][1]["gpu_type"] == "V100"
