"""Tests for autoscaler.model.traces: loading, interpolation rules and malformed-file errors."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.errors import InvalidInputError, TraceFormatError
from autoscaler.model.traces import (
    APPLICATIONS,
    DATA_DIR_ENV,
    AppTrace,
    data_root,
    even_placement,
    load_app,
)

EXPECTED = {
    # name: (M0, max batch, min local, max local, epochs)
    "bert": (12, 384, 4, 12, 2),
    "cifar10": (128, 4096, 32, 1024, 100),
    "deepspeech2": (20, 640, 10, 80, 80),
    "imagenet": (200, 12800, 20, 200, 90),
    "ncf": (256, 32768, 32, 32768, 10),
    "yolov3": (8, 512, 4, 8, 50),
}


def _csv_dicts(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", APPLICATIONS)
def test_app_attributes_match_the_paper_setup(name: str) -> None:
    app = load_app(name)
    m0, max_bsz, min_local, max_local, epochs = EXPECTED[name]
    assert (app.init_batch_size, app.max_batch_size) == (m0, max_bsz)
    assert (app.min_local_bsz, app.max_local_bsz, app.max_epochs) == (min_local, max_local, epochs)
    rows = _csv_dicts(data_root() / "traces" / name / f"validation-{m0}.csv")
    assert app.target_progress == float(rows[epochs - 1]["progress"])
    assert load_app(name) is app  # cached


@pytest.mark.parametrize("name", APPLICATIONS)
def test_rows_are_all_rows_in_file_order(name: str) -> None:
    app = load_app(name)
    folder = data_root() / "traces" / name
    placements = _csv_dicts(folder / "placements.csv")
    scalability = _csv_dicts(folder / "scalability.csv")
    assert len(app.rows) == len(placements) + len(scalability)
    for row, raw in zip(app.rows, placements, strict=False):
        assert row.source == "placements"
        assert row.placement == tuple(sorted(map(int, raw["placement"]), reverse=True))
        assert row.local_bsz == int(raw["local_bsz"])
        assert row.step_time_s == float(raw["step_time"])
    for row, raw in zip(app.rows[len(placements) :], scalability, strict=True):
        assert row.source == "scalability"
        assert row.num_nodes == int(raw["num_nodes"])
        assert row.num_gpus == int(raw["num_replicas"])
        assert max(row.placement) - min(row.placement) <= 1
        assert list(row.placement) == sorted(row.placement, reverse=True)


def test_even_placement() -> None:
    assert even_placement(6, 7) == (2, 1, 1, 1, 1, 1)
    assert even_placement(4, 16) == (4, 4, 4, 4)
    assert even_placement(1, 3) == (3,)
    with pytest.raises(InvalidInputError):
        even_placement(3, 2)


@pytest.mark.parametrize("name", APPLICATIONS)
def test_step_time_reproduces_measurements(name: str) -> None:
    app = load_app(name)
    groups: dict[tuple[tuple[int, ...], int], list[tuple[float, float]]] = {}
    for row in app.rows:
        if row.source == "placements":
            groups.setdefault((row.placement, row.local_bsz), []).append(
                (row.step_time_s, row.sync_time_s)
            )
    for (placement, bsz), values in list(groups.items())[::7]:
        step, sync = app.step_time_s(placement, bsz)
        assert step == pytest.approx(np.mean([v[0] for v in values]), rel=1e-12)
        assert sync == pytest.approx(np.mean([v[1] for v in values]), rel=1e-12)
    # Placement order does not matter.
    placement, bsz = next(iter(groups))
    assert app.step_time_s(placement[::-1], bsz) == app.step_time_s(placement, bsz)
    # Scalability rows (no exact placement measured) are reproduced too.
    for row in app.rows:
        if row.source == "scalability" and len(set(row.placement)) == 1:
            step, sync = app.step_time_s(row.placement, row.local_bsz)
            dup = [
                r
                for r in app.rows
                if r.source == "scalability"
                and (r.num_nodes, r.num_gpus, r.local_bsz)
                == (row.num_nodes, row.num_gpus, row.local_bsz)
            ]
            assert step == pytest.approx(np.mean([r.step_time_s for r in dup]))
            break


def test_step_time_interpolates_and_extrapolates_in_local_bsz() -> None:
    app = load_app("cifar10")
    lo, hi = app.step_time_s((1,), 32), app.step_time_s((1,), 45)
    mid = app.step_time_s((1,), 38.5)
    assert mid[0] == pytest.approx((lo[0] + hi[0]) / 2)
    # Below the measured range: held at the smallest batch.
    assert app.step_time_s((1,), 8) == lo
    # Above: sync held, compute time grows in proportion to the batch.
    top_step, top_sync = app.step_time_s((2,), 1024)
    step, sync = app.step_time_s((2,), 2048)
    assert sync == top_sync
    assert step - sync == pytest.approx(2 * (top_step - top_sync))


def test_unmeasured_placement_lies_between_neighbouring_configurations() -> None:
    app = load_app("imagenet")
    four, six = app.step_time_s((4,) * 4, 100), app.step_time_s((4,) * 6, 100)
    five = app.step_time_s((4,) * 5, 100)
    assert min(four[0], six[0]) - 1e-9 <= five[0] <= max(four[0], six[0]) + 1e-9
    # Beyond the largest measured cluster the node count is capped.
    assert app.step_time_s((4,) * 20, 100) == app.step_time_s((4,) * 16, 100)


@settings(max_examples=200)
@given(
    name=st.sampled_from(APPLICATIONS),
    placement=st.lists(st.integers(1, 4), min_size=1, max_size=16),
    frac=st.floats(0.0, 1.0),
)
def test_step_time_is_finite_positive_and_sync_bounded(
    name: str, placement: list[int], frac: float
) -> None:
    app = load_app(name)
    bsz = app.min_local_bsz + frac * (app.max_local_bsz - app.min_local_bsz)
    step, sync = app.step_time_s(placement, bsz)
    assert np.isfinite(step) and step > 0
    assert 0 <= sync <= step


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(APPLICATIONS),
    placement=st.lists(st.integers(1, 8), min_size=1, max_size=24),
    gpu_type=st.sampled_from(["T4", "V100", "A100"]),
)
def test_vectorised_step_times_are_the_scalar_ones(
    name: str, placement: list[int], gpu_type: str
) -> None:
    """``step_times_s`` (the cost floor's envelope uses it) gives exactly the numbers of
    ``step_time_s`` at every batch: below, inside and above the measured range, on the
    reference traces and on the derived or measured speeds of other GPU types."""
    from autoscaler.model.gputypes import default_speed_table
    from autoscaler.sim.cluster import DEFAULT_INSTANCE, INTERCONNECTS, NodeGroup, TypeSpeed

    app = load_app(name)
    link = INTERCONNECTS[DEFAULT_INSTANCE[gpu_type]]
    group = NodeGroup(gpu_type, 8, 1, DEFAULT_INSTANCE[gpu_type],
                      link.intra_gbytes_per_s, link.network_gbps)  # fmt: skip
    bsz = np.unique(
        np.concatenate(
            [
                np.linspace(0.5, 2.5 * app.max_local_bsz, 37),
                np.arange(app.min_local_bsz, app.min_local_bsz + 4),
                [float(r.local_bsz) for r in app.rows],
            ]
        )
    )
    for speed in (app, TypeSpeed(app, group, default_speed_table())):
        step, sync = speed.step_times_s(placement, bsz)
        scalar = [speed.step_time_s(placement, float(b)) for b in bsz]
        assert step.tolist() == [s for s, _ in scalar]
        assert sync.tolist() == [y for _, y in scalar]


def test_step_time_rejects_bad_queries() -> None:
    app = load_app("bert")
    with pytest.raises(InvalidInputError):
        app.step_time_s((), 4)
    with pytest.raises(InvalidInputError):
        app.step_time_s((1,), 0)


@pytest.mark.parametrize("name", APPLICATIONS)
def test_grad_stats_reproduce_rows_at_anchors(name: str) -> None:
    app = load_app(name)
    for bsz, trace in app.validation.items():
        starts = np.concatenate(([0.0], trace.progress[:-1]))
        sqr, var = app.grad_stats(starts, bsz)
        np.testing.assert_allclose(sqr, trace.grad_sqr, rtol=1e-12)
        np.testing.assert_allclose(var, trace.grad_var, rtol=1e-12)


@settings(max_examples=100)
@given(name=st.sampled_from(APPLICATIONS), pfrac=st.floats(0, 1.2), bfrac=st.floats(0, 1))
def test_grad_stats_between_neighbouring_batch_sizes(name: str, pfrac: float, bfrac: float) -> None:
    app = load_app(name)
    sizes = sorted(app.validation)
    i = min(int(bfrac * (len(sizes) - 1)), len(sizes) - 2)
    lo, hi = sizes[i], sizes[i + 1]
    m = lo + bfrac * (hi - lo)
    p = pfrac * app.target_progress
    got = np.array(app.grad_stats(p, m))
    a, b = np.array(app.grad_stats(p, lo)), np.array(app.grad_stats(p, hi))
    assert np.all(got >= np.minimum(a, b) * (1 - 1e-12))
    assert np.all(got <= np.maximum(a, b) * (1 + 1e-12))
    # Outside the validated range: held at the nearest validated batch size.
    np.testing.assert_array_equal(app.grad_stats(p, sizes[-1] * 3), app.grad_stats(p, sizes[-1]))


def test_grad_stats_broadcast() -> None:
    app = load_app("cifar10")
    sqr, var = app.grad_stats(np.array([0.0, 1000.0, 2000.0]), np.array([[128.0], [4096.0]]))
    assert sqr.shape == var.shape == (2, 3)


@pytest.mark.parametrize("name", APPLICATIONS)
def test_progress_curve(name: str) -> None:
    app = load_app(name)
    # At M0 the AdaScale gain is exactly 1: iterations == progress.
    c0 = app.progress_curve(app.init_batch_size)
    assert float(c0.iterations(app.target_progress)) == pytest.approx(app.target_progress)
    # Larger batches need fewer, never more, iterations; and close to the recorded run.
    cmax = app.progress_curve(app.max_batch_size)
    n = float(cmax.iterations(app.target_progress))
    assert n <= app.target_progress
    recorded = app.validation[app.max_batch_size].iteration[app.max_epochs - 1]
    assert n == pytest.approx(recorded, rel=0.6)
    assert np.all(np.diff(cmax.iteration_grid) > 0)
    # progress_after inverts iterations.
    p = 0.37 * app.target_progress
    p2 = cmax.progress_after(p, 10.0)
    assert float(cmax.iterations(p2) - cmax.iterations(p)) == pytest.approx(10.0, rel=1e-9)
    # Beyond the target progress, progress keeps growing.
    assert cmax.progress_after(app.target_progress, 5.0) > app.target_progress


def test_gain_is_between_one_and_scale() -> None:
    app = load_app("imagenet")
    p = np.linspace(0, app.target_progress, 50)
    for m in (200, 800, 12800):
        g = app.gain(p, m)
        assert np.all(g >= 1 - 1e-12)
        assert np.all(g <= m / app.init_batch_size + 1e-9)


def test_unknown_application() -> None:
    with pytest.raises(InvalidInputError) as info:
        load_app("resnet9000")
    assert info.value.field == "application"


def test_data_root_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert data_root() == tmp_path
    with pytest.raises(TraceFormatError):
        load_app("bert")
    monkeypatch.delenv(DATA_DIR_ENV)
    assert (data_root() / "traces" / "bert" / "placements.csv").is_file()


# ---- malformed files ------------------------------------------------------------------------


@pytest.fixture
def bert_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "bert"
    shutil.copytree(data_root() / "traces" / "bert", dst)
    return dst


def _rewrite(path: Path, line: int, transform) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = transform(lines[line - 1])
    path.write_text("\n".join(lines) + "\n")


def _set_cell(path: Path, line: int, column: str, value: str) -> None:
    header = path.read_text().splitlines()[0].split(",")
    i = header.index(column)

    def transform(text: str) -> str:
        cells = text.split(",")
        cells[i] = value
        return ",".join(cells)

    _rewrite(path, line, transform)


@pytest.mark.parametrize(
    ("filename", "column", "value", "message"),
    [
        ("placements.csv", "step_time", "fast", "not a number"),
        ("placements.csv", "sync_time", "nan", "not finite"),
        ("placements.csv", "local_bsz", "-4", "negative"),
        ("placements.csv", "placement", "1x", "placement"),
        ("scalability.csv", "num_nodes", "abc", "not a number"),
        ("validation-24.csv", "grad_var", "-1.5", "negative"),
        ("validation-24.csv", "progress", "inf", "not finite"),
    ],
)
def test_bad_cell_names_file_line_field(
    bert_copy: Path, filename: str, column: str, value: str, message: str
) -> None:
    _set_cell(bert_copy / filename, 2, column, value)
    with pytest.raises(TraceFormatError) as info:
        AppTrace.from_dir("bert", bert_copy)
    err = info.value
    assert err.path == str(bert_copy / filename)
    assert err.line == 2
    assert err.field == column
    assert message in str(err)
    assert f"{filename}:2 [{column}]" in str(err)


def test_missing_column(bert_copy: Path) -> None:
    path = bert_copy / "placements.csv"
    _rewrite(path, 1, lambda h: h.replace("sync_time", "sync"))
    with pytest.raises(TraceFormatError) as info:
        AppTrace.from_dir("bert", bert_copy)
    assert (info.value.line, info.value.field) == (1, "sync_time")


def test_missing_value_later_line(bert_copy: Path) -> None:
    path = bert_copy / "scalability.csv"
    _set_cell(path, 5, "step_time", "")
    with pytest.raises(TraceFormatError) as info:
        AppTrace.from_dir("bert", bert_copy)
    assert (info.value.line, info.value.field) == (5, "step_time")


def test_missing_file(bert_copy: Path) -> None:
    (bert_copy / "scalability.csv").unlink()
    with pytest.raises(TraceFormatError) as info:
        AppTrace.from_dir("bert", bert_copy)
    assert "scalability.csv" in str(info.value)


def _piecewise_iterations(app: AppTrace, batch_size: float) -> float:
    """Iterations to ``target_progress`` under the paper simulator's rule: epoch ``i`` (by the
    ``M0`` trace's progress) uses row ``i`` of each validation trace throughout, interpolated
    linearly in batch size between validated sizes. Written independently of ``grad_stats``."""
    ends = app.validation[app.init_batch_size].progress[: app.max_epochs]
    starts = np.concatenate(([0.0], ends[:-1]))
    sizes = np.array(list(app.validation), dtype=float)
    total = 0.0
    traces = list(app.validation.values())
    for i in range(app.max_epochs):
        rows = [min(i, len(v.grad_sqr) - 1) for v in traces]
        sqr = np.interp(
            batch_size, sizes, [v.grad_sqr[r] for v, r in zip(traces, rows, strict=True)]
        )
        var = np.interp(
            batch_size, sizes, [v.grad_var[r] for v, r in zip(traces, rows, strict=True)]
        )
        scale = batch_size / app.init_batch_size
        total += (ends[i] - starts[i]) * (var / scale + sqr) / (var + sqr)
    return float(total)


@pytest.mark.parametrize("name", APPLICATIONS)
def test_progress_interpolation_matches_paper_rule(name: str) -> None:
    """The claim in ``AppTrace.grad_stats``: integrating the interpolated statistics gives the
    paper's piecewise-constant iteration counts within 4% (measured worst: 3.9%, deepspeech2
    at its largest batch), and never more iterations than that rule."""
    app = load_app(name)
    sizes = [*app.validation, *np.geomspace(app.init_batch_size, app.max_batch_size, 7)[1:-1]]
    for m in sizes:
        ours = float(app.progress_curve(float(m)).iterations(app.target_progress))
        paper = _piecewise_iterations(app, float(m))
        assert abs(ours / paper - 1) < 0.04, (m, ours, paper)
        assert ours <= paper * (1 + 1e-9), (m, ours, paper)
