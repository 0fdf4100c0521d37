"""The simulated world's own truths (``SimConfig.world``, ``speed_error``): measured restarts
scaled by checkpoint size, a seeded per-pair speed error, and the ideal world kept as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.decide.views import fixed_batch_choice
from autoscaler.errors import InvalidInputError
from autoscaler.model.gputypes import default_speed_table
from autoscaler.model.traces import load_app
from autoscaler.sim import engine as engine_module
from autoscaler.sim.cluster import NodeGroup, TypeSpeed, load_cluster
from autoscaler.sim.engine import SimConfig, _limits, simulate
from autoscaler.sim.experiments import build_run
from autoscaler.sim.restart import load_restart_times
from autoscaler.sim.truths import WorldTruths
from autoscaler.sim.workload import TraceJob
from benchmarks import paper_sim
from tests.sim.test_engine import Scripted, _expected_jct

DATA = Path(__file__).resolve().parents[2] / "autoscaler" / "data" / "restart"


def _restart_json(*runs: tuple[float, float, float, float]) -> str:
    keys = ("restart_s", "save_s", "load_s", "checkpoint_bytes")
    return json.dumps({"restart_runs": {"1": [dict(zip(keys, r, strict=True)) for r in runs]}})


MODELS = "application,parameters,copies\nbig,1000000,3\nsmall,10,2\n"


def test_restart_is_a_measured_overhead_plus_the_checkpoint_at_measured_rates() -> None:
    # Two runs: overheads 10 - 1 - 1 = 8 s and 20 - 2 - 2 = 16 s; 1e6 bytes saved in 1 s and
    # loaded in 1 s (and 2 s / 2 s): 1e-6 s per byte each way at the median... of 1e-6, 2e-6.
    text = _restart_json((10.0, 1.0, 1.0, 1e6), (20.0, 2.0, 2.0, 1e6))
    times = load_restart_times(3, restarts_text=text, models_text=MODELS)
    assert sorted(times.overheads_s) == [8.0, 16.0]
    assert times.save_s_per_byte == pytest.approx(1.5e-6)
    big_ckpt = 1e6 * 3 * 4 * (1.5e-6 + 1.5e-6)  # 12 MB at 3 us per byte, 36 s
    assert times.checkpoint_s("big") == pytest.approx(big_ckpt)
    draws = [times.draw_s("big") for _ in range(200)]
    assert {round(d - big_ckpt, 6) for d in draws} == {8.0, 16.0}
    assert times.checkpoint_s("unknown") == 0.0
    again = load_restart_times(3, restarts_text=text, models_text=MODELS)
    assert [again.draw_s("big") for _ in range(200)] == draws  # seeded


@pytest.mark.parametrize(
    ("restarts", "models"),
    [
        ("{}", MODELS),
        ('{"restart_runs": {"1": []}}', MODELS),
        (_restart_json((10.0, 1.0, 1.0, 0.0)), MODELS),
        (_restart_json((float("nan"), 1.0, 1.0, 1e6)), MODELS),
        (_restart_json((10.0, 1.0, 1.0, 1e6)), "application,parameters,copies\nx,0,2\n"),
        (_restart_json((10.0, 1.0, 1.0, 1e6)), "application,parameters,copies\nx,10,99\n"),
        (_restart_json((10.0, 1.0, 1.0, 1e6)), "name,size\nx,1\n"),
    ],
)
def test_bad_restart_files_are_refused(restarts: str, models: str) -> None:
    with pytest.raises(InvalidInputError):
        load_restart_times(restarts_text=restarts, models_text=models)


def test_the_shipped_measurements_order_restarts_by_model_size() -> None:
    data = json.loads((DATA / "trainer_restart.json").read_text())
    runs = [r for group in data["restart_runs"].values() for r in group]
    assert len(runs) >= 6 and all(r["restart_s"] > r["save_s"] + r["load_s"] for r in runs)
    times = load_restart_times()
    # BERT with AdamW (110M x 3 copies) checkpoints far more than NCF's small model.
    assert times.checkpoint_s("bert") > 10 * times.checkpoint_s("ncf") > 0
    assert set(times.models) == {"bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"}


def test_the_ideal_world_restarts_in_the_policies_delay_the_measured_one_in_a_draw() -> None:
    assert WorldTruths.build("ideal", 0).restart_s("bert", 30.0) == 30.0
    measured = WorldTruths.build("measured", 0)
    draws = {measured.restart_s("cifar10", 30.0) for _ in range(50)}
    assert len(draws) > 1 and 30.0 not in draws
    with pytest.raises(InvalidInputError):
        WorldTruths.build("dreamt", 0)


def test_a_measured_world_job_pays_its_drawn_restart() -> None:
    spec = TraceJob("c", "cifar10", 0.0, 2, 512)
    res = simulate([spec], Scripted({"c": (2, 0)}), SimConfig(num_nodes=2, world="measured"))
    drawn = load_restart_times(0).draw_s("cifar10")  # the run's first (and only) draw
    assert drawn != pytest.approx(30.0)
    assert res.jobs[0].jct_s == pytest.approx(_expected_jct(spec, (2,), drawn), rel=1e-9)


def test_speed_error_is_a_seeded_factor_per_pair_within_its_bound() -> None:
    truths = WorldTruths.build("ideal", 7, speed_error=0.25)
    factors = {
        (a, t): truths.speed_factor(a, t)
        for a in ("bert", "cifar10", "imagenet")
        for t in ("V100", "A100")
    }
    assert all(0.75 <= f <= 1.25 for f in factors.values())
    assert len(set(factors.values())) == len(factors)  # each pair its own draw
    assert (
        WorldTruths.build("ideal", 7, 0.25).speed_factor("bert", "V100")
        == factors[("bert", "V100")]
    )
    assert (
        WorldTruths.build("ideal", 8, 0.25).speed_factor("bert", "V100")
        != factors[("bert", "V100")]
    )
    assert WorldTruths.build("ideal", 7).speed_factor("bert", "V100") == 1.0
    for bad in (-0.1, 0.95, float("nan")):
        with pytest.raises(InvalidInputError):
            SimConfig(speed_error=bad)


def test_a_derived_types_compute_runs_at_the_erred_ratio_the_reference_type_does_not() -> None:
    app = load_app("cifar10")
    speeds = default_speed_table()
    v100 = NodeGroup("V100", 8, 1, "p3.16xlarge", 16.0, 25.0)
    plain = TypeSpeed(app, v100, speeds)
    erred = TypeSpeed(app, v100, speeds, ratio_factor=0.8)
    step, sync = plain.step_time_s((1,), 128)
    step_e, sync_e = erred.step_time_s((1,), 128)
    assert sync_e == sync and step_e - sync_e == pytest.approx((step - sync) / 0.8)
    t4 = NodeGroup("T4", 4, 1, "g4dn.12xlarge", 16.0, 50.0)
    assert TypeSpeed(app, t4, speeds, ratio_factor=0.8).step_time_s((1,), 128) == (
        TypeSpeed(app, t4, speeds).step_time_s((1,), 128)
    )


def test_a_job_on_a_derived_type_finishes_as_its_erred_speed_says(tmp_path: Path) -> None:
    path = tmp_path / "v100.yaml"
    path.write_text("groups:\n  - {gpu_type: V100, gpus_per_node: 8, count: 1}\n")
    cluster = load_cluster(path, speeds=default_speed_table(), applications=["cifar10"])
    spec = TraceJob("c", "cifar10", 0.0, 1, 128)
    runs = {
        err: simulate(
            [spec], Scripted({"c": (1,)}), SimConfig(cluster=cluster, speed_error=err, seed=3)
        ).jobs[0]
        for err in (0.0, 0.3)
    }
    factor = WorldTruths.build("ideal", 3, 0.3).speed_factor("cifar10", "V100")
    app = load_app("cifar10")
    choice = fixed_batch_choice(128, 1, _limits(app))
    erred = TypeSpeed(app, cluster.groups[0], default_speed_table(), ratio_factor=factor)
    step, sync = erred.step_time_s((1,), choice.local_bsz)
    t_iter = step + (choice.accum_steps - 1) * (step - sync)
    iters = float(app.progress_curve(choice.batch_size).iterations(app.target_progress))
    assert runs[0.3].jct_s == pytest.approx(30.0 + iters * t_iter, rel=1e-6)
    assert abs(runs[0.3].jct_s / runs[0.0].jct_s - 1) > 0.01


def test_cloud_runs_boot_by_the_world() -> None:
    assert build_run("E2", "coadapt", world="measured").cloud.boot is not None
    assert build_run("E2", "coadapt", world="ideal").cloud.boot is None
    with pytest.raises(InvalidInputError):
        build_run("E2", "coadapt", world="dreamt")


def test_paper_sim_refuses_a_bad_speed_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        paper_sim.main(["--speed-error", "2"])
    assert "speed_error must be in" in capsys.readouterr().err


def _seen_grads(world: str, seed: int = 0) -> list[tuple[float, float]]:
    spec = TraceJob("c", "cifar10", 0.0, 2, 512)
    policy = Scripted({"c": (2, 0)})
    simulate([spec], policy, SimConfig(num_nodes=2, world=world, seed=seed))
    return [
        (job.model.grad.grad_sqr, job.model.grad.grad_var)
        for ri in policy.seen
        for job in ri.jobs
        if job.model is not None
    ]


def test_measured_reports_scatter_around_the_truth_seeded_ideal_ones_are_the_truth() -> None:
    ideal, measured = _seen_grads("ideal"), _seen_grads("measured")
    assert len(ideal) == len(measured) >= 5
    assert measured != ideal
    ratios = [m[1] / i[1] for m, i in zip(measured, ideal, strict=True)]
    assert all(0.2 < r < 5 for r in ratios) and len({round(r, 9) for r in ratios}) > 1
    assert _seen_grads("measured") == measured  # the same seed, the same readings
    assert _seen_grads("measured", seed=1) != measured


def test_the_engine_counts_measurements_at_the_trainers_interval() -> None:
    from trainer.options import JobOptions

    assert JobOptions(64).gns_every_steps == engine_module._GNS_EVERY_STEPS
    assert JobOptions(64).gns_smoothing == engine_module._GNS_SMOOTHING


def test_reports_carry_the_noise_of_the_calibration_model_that_trains_alike() -> None:
    from autoscaler.sim.report_noise import load_report_noise

    measured = WorldTruths.build("measured", 0)
    bert, mlp = load_report_noise(model="bert"), load_report_noise(model="mlp")
    assert bert.relative_sd("grad_var", 4) != mlp.relative_sd("grad_var", 4)
    # bert and ncf train with Adam (preconditioned statistics); the others with SGD.
    for app, curve in (("bert", bert), ("ncf", bert), ("cifar10", mlp), ("imagenet", mlp)):
        assert measured.noise(app).relative_sd("grad_var", 4) == curve.relative_sd("grad_var", 4)
    assert WorldTruths.build("ideal", 0).noise("bert").exact


def test_the_ablation_worlds_measure_one_truth_each() -> None:
    """``measured-restarts`` draws the measured world's restarts with exact reports;
    ``measured-reports`` restarts in the policies' delay with the measured world's noise."""
    restarts, reports = (
        WorldTruths.build("measured-restarts", 0),
        WorldTruths.build("measured-reports", 0),
    )
    measured = WorldTruths.build("measured", 0)
    assert [restarts.restart_s("bert", 30.0) for _ in range(5)] == [
        measured.restart_s("bert", 30.0) for _ in range(5)
    ]
    assert reports.restart_s("bert", 30.0) == 30.0
    assert restarts.noise("bert").exact and not reports.noise("bert").exact
    assert reports.noise("ncf") == measured.noise("ncf")  # Adam-trained: the bert curve
    ideal = _seen_grads("ideal")  # the same restart (the policies' delay), noisy readings
    seen = _seen_grads("measured-reports")
    assert len(seen) == len(ideal) and seen != ideal
