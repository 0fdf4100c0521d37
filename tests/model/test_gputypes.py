"""GPU types: the speed table, the ratio rule for unprofiled types, per-type trace files."""

from __future__ import annotations

import csv
import math
import random
import shutil
from pathlib import Path

import pytest

from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.model.goodput import (
    BatchLimits,
    GoodputModel,
    GradParams,
    PerfParams,
    ProfileSample,
    fit_perf_params,
)
from autoscaler.model.gputypes import (
    SpeedRow,
    SpeedTable,
    default_speed_table,
    estimate_model,
    load_speed_table,
)
from autoscaler.model.interconnects import MIN_SYNC_FACTOR, sync_factors
from autoscaler.model.traces import AppTrace, load_app, traces_folder

LIMITS = BatchLimits(init_batch_size=64, max_batch_size=2048, max_local_bsz=128, min_local_bsz=8)
GRAD = GradParams(grad_sqr=0.02, grad_var=1.0)


def test_shipped_table_excludes_flagged_rows() -> None:
    t = default_speed_table()
    assert set(t.gpu_types) == {"T4", "V100", "A100"}
    assert not t.rows[("ncf", "V100")].usable  # input-bound host: not a V100 speed
    v100 = [r.speed_vs_t4 for r in t.rows.values() if r.gpu_type == "V100" and r.usable]
    assert t.relative_speed("V100") == pytest.approx(math.exp(sum(map(math.log, v100)) / len(v100)))
    assert t.model_speed("ncf", "V100") == t.relative_speed("V100")
    # The generic speeds and spreads quoted in the docs.
    assert t.relative_speed("V100") == pytest.approx(2.85, abs=0.005)
    assert t.relative_speed("A100") == pytest.approx(4.06, abs=0.005)
    assert t.log_spread("A100") == pytest.approx(0.67, abs=0.005)
    assert t.model_speed("bert", "A100") == pytest.approx(10.78)
    assert t.max_local_bsz("ncf", "V100") == 32768  # a memory fact, kept for flagged rows
    with pytest.raises(InvalidInputError, match="H100"):
        t.relative_speed("H100")


def test_ratio_rule_is_exact_when_true_speeds_follow_it() -> None:
    """Literal example: a job profiled on T4 (g4dn.12xlarge: PCIe 16 GB/s, 50 Gb/s) whose true
    V100 compute is exactly 3x faster and whose sync follows the links of the V100's p3.16xlarge
    (NVLink 150 GB/s: 16/150 of the intra-node time; 25 Gb/s: twice the inter-node time). The
    estimate equals the model fitted on V100."""
    table = SpeedTable({("x", "V100"): SpeedRow("x", "V100", 3.0, 256)}, source="literal")
    t4 = PerfParams(
        alpha_c=0.03,
        beta_c=0.006,
        alpha_n=0.02,
        beta_n=0.01,
        alpha_r=0.05,
        beta_r=0.02,
        gamma=1.5,
    )
    v100_true = PerfParams(
        alpha_c=0.01,
        beta_c=0.002,
        alpha_n=0.02 * 16 / 150,
        beta_n=0.01 * 16 / 150,
        alpha_r=0.05 * 2,
        beta_r=0.02 * 2,
        gamma=1.5,
    )
    est = estimate_model({"T4": GoodputModel(t4, GRAD, LIMITS)}, "V100", table)
    assert not est.profiled and est.source_type == "T4"
    assert est.speed_ratio == pytest.approx(3.0)
    assert est.relative_uncertainty == 0.0  # one row: no spread known
    truth = GoodputModel(v100_true, GRAD, LIMITS)
    for nodes, gpus, bsz, accum in [(1, 1, 8, 1), (1, 4, 32, 2), (3, 12, 128, 1)]:
        assert float(est.model.step_time_s(nodes, gpus, bsz, accum)) == pytest.approx(
            float(truth.step_time_s(nodes, gpus, bsz, accum)), rel=1e-12
        )
    # A fitted model alone is returned as it is; nothing to estimate from is an error.
    fitted = estimate_model({"V100": truth}, "V100", table)
    assert fitted.profiled and fitted.model is truth
    with pytest.raises(InvalidInputError):
        estimate_model({}, "V100", table)


def test_estimate_uses_the_closest_profiled_type_and_reports_spread() -> None:
    t = default_speed_table()
    m = GoodputModel(PerfParams(0.03, 0.006, 0.02, 0.01, 0.05, 0.02, 1.0), GRAD, LIMITS)
    est = estimate_model({"T4": m, "V100": m}, "A100", t)
    assert est.source_type == "V100"
    assert est.speed_ratio == pytest.approx(t.relative_speed("A100") / t.relative_speed("V100"))
    sd = math.hypot(t.log_spread("A100"), t.log_spread("V100"))
    assert est.relative_uncertainty == pytest.approx(math.exp(sd) - 1) and sd > 0
    bigger = BatchLimits(64, 2048, 512, 8)
    assert estimate_model({"T4": m}, "A100", t, limits=bigger).model.limits == bigger


def test_sync_factors_follow_each_types_instance_links() -> None:
    # T4 (g4dn.12xlarge) -> A100 (p4d.24xlarge): NVSwitch 300 GB/s vs PCIe 16 (floored at
    # MIN_SYNC_FACTOR), 400 Gb/s vs 50.
    assert sync_factors("T4", "A100") == pytest.approx((MIN_SYNC_FACTOR, 50 / 400))
    # A100 -> V100 (p3.16xlarge, 25 Gb/s): inter-node sync 16 x slower; intra 0.1 -> 16/150.
    assert sync_factors("A100", "V100") == pytest.approx(((16 / 150) / MIN_SYNC_FACTOR, 16.0))
    assert sync_factors("V100", "V100") == (1.0, 1.0)
    assert sync_factors("T4", "L4") == (1.0, 1.0)  # no known instance: sync kept as measured


def test_fitted_sync_is_raised_to_what_another_types_fit_carries() -> None:
    """A job fitted on A100 across nodes and on V100 from one GPU only (its V100 sync still at
    the prior's ~0) is not taken to scale perfectly on V100: its V100 sync is at least the
    A100's carried to p3's links. Compute stays the V100 fit's; a type with more sync of its
    own keeps it."""
    t = default_speed_table()
    a100 = GoodputModel(PerfParams(0.01, 0.002, 0.004, 0.002, 0.01, 0.005, 1.2), GRAD, LIMITS)
    v100 = GoodputModel(PerfParams(0.02, 0.003, 1e-6, 1e-6, 1e-6, 1e-6, 1.0), GRAD, LIMITS)
    est = estimate_model({"A100": a100, "V100": v100}, "V100", t)
    assert est.profiled and est.source_type is None
    intra, inter = sync_factors("A100", "V100")
    p = est.model.perf
    assert (p.alpha_c, p.beta_c, p.gamma) == (0.02, 0.003, 1.0)
    assert p.alpha_n == pytest.approx(0.004 * intra) and p.beta_r == pytest.approx(0.005 * inter)
    assert float(est.model.step_time_s(4, 32, 64, 1)) > 1.5 * float(v100.step_time_s(4, 32, 64, 1))
    # The A100 fit's own sync is larger than the V100's carried back: kept as fitted.
    assert estimate_model({"A100": a100, "V100": v100}, "A100", t).model is a100


def test_speed_table_bad_input_names_file_line_field(tmp_path: Path) -> None:
    header = "model,gpu_type,best_1gpu_samples_per_s_vs_t4,max_local_bsz_measured,"
    header += "max_local_bsz_measured_t4,note\n"
    cases = {
        "gpu_type": "bert,X9000,2.0,16,12,\n",
        "best_1gpu_samples_per_s_vs_t4": "bert,V100,-1,16,12,\n",
        "model": "bert,V100,2.0,16,12,\nbert,V100,2.5,16,12,\n",
    }
    for field, rows in cases.items():
        path = tmp_path / f"{field}.csv"
        path.write_text(header + rows)
        with pytest.raises(TraceFormatError, match=rf"{path.name}:\d+ \[{field}\]"):
            load_speed_table(path)
    missing = tmp_path / "missing.csv"
    missing.write_text("model,gpu_type\nbert,V100\n")
    with pytest.raises(TraceFormatError, match=r"missing.csv:1 \[best_1gpu"):
        load_speed_table(missing)


def _copy_app(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "traces"
    shutil.copytree(traces_folder() / name, folder / name)
    return folder


def _write_shuffled(src: Path, dst: Path, seed: int) -> None:
    with open(src, newline="") as handle:
        rows = list(csv.reader(handle))
    order = list(range(len(rows[0])))
    random.Random(seed).shuffle(order)
    with open(dst, "w", newline="") as handle:
        csv.writer(handle).writerows([[r[i] for i in order] for r in rows])


def test_per_type_trace_files_load_by_header_name_in_any_order(tmp_path: Path) -> None:
    folder = _copy_app(tmp_path, "cifar10")
    app_dir = folder / "cifar10"
    shutil.copy(app_dir / "placements.csv", app_dir / "placements-V100.csv")
    shutil.copy(app_dir / "scalability.csv", app_dir / "scalability-V100.csv")
    ordered = load_app("cifar10", None, "V100", traces_dir=folder)
    (tmp_path / "shuffled").mkdir()
    shuffled_dir = tmp_path / "shuffled" / "cifar10"
    shutil.copytree(app_dir, shuffled_dir)
    for name in ("placements-V100.csv", "scalability-V100.csv"):
        _write_shuffled(app_dir / name, shuffled_dir / name, seed=len(name))
    assert (shuffled_dir / "placements-V100.csv").read_text() != (
        app_dir / "placements-V100.csv"
    ).read_text()
    shuffled = load_app("cifar10", None, "V100", traces_dir=tmp_path / "shuffled")
    assert shuffled.rows == ordered.rows
    for placement, bsz in [((1,), 128), ((4, 4), 256), ((2, 1), 64), ((4,) * 8, 512)]:
        assert shuffled.step_time_s(placement, bsz) == ordered.step_time_s(placement, bsz)
    # The measured type's batch limit comes from its own file, not T4's memory override.
    assert isinstance(ordered, AppTrace)


def test_per_type_file_with_a_missing_column_names_file_and_field(tmp_path: Path) -> None:
    folder = _copy_app(tmp_path, "cifar10")
    path = folder / "cifar10" / "placements-A100.csv"
    path.write_text("placement,local_bsz,step_time\n1,128,0.1\n")
    with pytest.raises(TraceFormatError, match=r"placements-A100.csv:1 \[sync_time\]"):
        load_app("cifar10", None, "A100", traces_dir=folder)


def test_online_fit_on_derived_types_stays_close_to_t4s() -> None:
    """Sanity of the derivation: the throughput model fits profiles replayed on a derived type
    within the error it has on the T4 traces themselves (measured: T4 7.8%, V100 15.7% — its
    inter-node sync, doubled by p3's 25 Gb/s network, carries the traces' noise — A100 5.8%)."""
    from autoscaler.sim.cluster import TypeSpeed, uniform_cluster

    base = load_app("imagenet")
    table = default_speed_table()
    errors = {}
    for gpu_type in ("T4", "V100", "A100"):
        speed = TypeSpeed(base, uniform_cluster(2, 4, gpu_type).groups[0], table)
        samples = []
        for placement in [(1,), (2,), (4,), (4, 4), (4, 4, 4)]:
            for bsz in (32, 64, 128):
                step, sync = speed.step_time_s(placement, bsz)
                samples.append(ProfileSample(placement, bsz, 1, step, min(sync, step)))
        model = GoodputModel(fit_perf_params(samples), GRAD, BatchLimits(200, 12800, 600, 16))
        errors[gpu_type] = sum(
            abs(
                float(model.step_time_s(s.num_nodes, s.num_gpus, s.local_bsz, 1)) / s.step_time_s
                - 1
            )
            for s in samples
        ) / len(samples)
    assert errors["T4"] < 0.1, errors
    assert errors["V100"] < 0.2 and errors["A100"] < 0.1, errors
