"""Workload CSV parsing: valid files, and every kind of bad input named by file, line, field."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.errors import TraceFormatError
from autoscaler.model.traces import APPLICATIONS, data_root
from autoscaler.sim.workload import load_workload, workload_files
from tests.sim.conftest import HEADER, SMALL


def test_load_small(small_workload: Path) -> None:
    workload = load_workload(small_workload)
    assert workload.name == "small"
    assert workload.jobs == tuple(SMALL)


@pytest.mark.parametrize("load", ["workloads", "workloads-0.5"])
def test_paper_workloads_load(load: str) -> None:
    files = workload_files(data_root() / load)
    assert [f.stem for f in files] == [f"workload-{i}" for i in range(1, 9)]
    for f in files:
        jobs = load_workload(f).jobs
        assert len(jobs) == (160 if load == "workloads" else 80)
        assert all(job.application in APPLICATIONS for job in jobs)


def test_workload_files_natural_order(tmp_path: Path) -> None:
    for name in ("w-10", "w-2", "w-1"):
        (tmp_path / f"{name}.csv").write_text(HEADER + "\n")
    (tmp_path / "notes.txt").write_text("x")
    assert [f.stem for f in workload_files(tmp_path)] == ["w-1", "w-2", "w-10"]
    assert workload_files(tmp_path / "w-1.csv") == [tmp_path / "w-1.csv"]


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ("a,10,resnet9000,1,128", "application", "unknown application"),
        ("a,-5,cifar10,1,128", "time", "negative"),
        ("a,ten,cifar10,1,128", "time", "not a number"),
        ("a,10,cifar10,two,128", "num_replicas", "not a number"),
        ("a,10,cifar10,1,12.5", "batch_size", "not an integer"),
        ("a,10,cifar10,0,128", "num_replicas", ">= 1"),
        ("a,nan,cifar10,1,128", "time", "not finite"),
        ("a,10,cifar10,1,", "batch_size", "missing value"),
    ],
)
def test_bad_row(tmp_path: Path, row: str, field: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"{HEADER}\nok,0,ncf,1,256\n{row}\n")
    with pytest.raises(TraceFormatError) as info:
        load_workload(path)
    err = info.value
    assert (err.path, err.line, err.field) == (str(path), 3, field)
    assert message in str(err)
    assert f"bad.csv:3 [{field}]" in str(err)


def test_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,time,application,batch_size\na,0,ncf,256\n")
    with pytest.raises(TraceFormatError) as info:
        load_workload(path)
    assert (info.value.line, info.value.field) == (1, "num_replicas")


def test_duplicate_name_and_empty(tmp_path: Path) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(f"{HEADER}\na,0,ncf,1,256\na,5,ncf,1,256\n")
    with pytest.raises(TraceFormatError) as info:
        load_workload(path)
    assert (info.value.line, info.value.field) == (3, "name")
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER + "\n")
    with pytest.raises(TraceFormatError):
        load_workload(empty)
    with pytest.raises(TraceFormatError):
        load_workload(tmp_path / "absent.csv")


@settings(max_examples=60)
@given(
    cell=st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters=",\n\r\"'"),
        max_size=8,
    ),
    column=st.integers(1, 4),
)
def test_fuzzed_cell_parses_or_fails_typed(cell: str, column: int, tmp_path_factory) -> None:
    """Any cell content either parses to a valid job or raises TraceFormatError on line 2."""
    cells = ["j", "0", "ncf", "1", "256"]
    cells[column] = cell
    path = tmp_path_factory.mktemp("fuzz") / "w.csv"
    path.write_text(f"{HEADER}\n{','.join(cells)}\n")
    try:
        workload = load_workload(path)
    except TraceFormatError as e:
        assert e.line == 2
        assert e.field == HEADER.split(",")[column]
    else:
        job = workload.jobs[0]
        assert job.submit_time_s >= 0 and job.num_replicas >= 1 and job.batch_size >= 1


def test_compress_arrivals_divides_times_and_keeps_jobs(small_workload: Path) -> None:
    from autoscaler.sim.workload import compress_arrivals

    workload = load_workload(small_workload)
    fast = compress_arrivals(workload, 2.0)
    assert fast.name == workload.name
    assert [j.submit_time_s for j in fast.jobs] == [j.submit_time_s / 2 for j in workload.jobs]
    assert [(j.name, j.application, j.num_replicas, j.batch_size) for j in fast.jobs] == [
        (j.name, j.application, j.num_replicas, j.batch_size) for j in workload.jobs
    ]
    assert compress_arrivals(workload, 1.0) == workload


@pytest.mark.parametrize("factor", [0.0, -1.5, float("nan"), float("inf")])
def test_compress_arrivals_rejects_bad_factor(small_workload: Path, factor: float) -> None:
    from autoscaler.errors import InvalidInputError
    from autoscaler.sim.workload import compress_arrivals

    with pytest.raises(InvalidInputError, match="arrival scale") as info:
        compress_arrivals(load_workload(small_workload), factor)
    assert info.value.field == "arrival_scale"


def test_write_workload_round_trips_fractional_times(small_workload: Path, tmp_path: Path) -> None:
    from autoscaler.sim.workload import compress_arrivals, write_workload

    fast = compress_arrivals(load_workload(small_workload), 1.5)  # 30 / 1.5 = 20, 95 / 1.5 ...
    path = write_workload(fast, tmp_path / "out" / "small.csv")
    assert load_workload(path) == fast
