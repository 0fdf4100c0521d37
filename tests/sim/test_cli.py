"""``coadapt simulate``: results file, parallel folders, bad input leaves no file behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscaler.cli.main import app
from autoscaler.sim.runner import RunSpec, compare_with_paper, run_many
from tests.sim.conftest import HEADER, SMALL, write_workload

runner = CliRunner()


def test_simulate_one_workload(small_workload: Path, tmp_path: Path) -> None:
    out = tmp_path / "res.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            str(small_workload),
            "--policy",
            "tiresias",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--interval-s",
            "30",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "tiresias" in result.output and "mean JCT" in result.output
    payload = json.loads(out.read_text())
    run = payload["runs"][0]
    assert run["policy"] == "tiresias" and run["workload"] == "small"
    assert run["config"]["num_nodes"] == 2 and run["config"]["interval_s"] == 30.0
    assert len(run["jobs"]) == len(SMALL)
    assert not list(tmp_path.glob(".res.json.*"))  # no temporary file left


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("x,10,resnet9000,1,128", "application"),
        ("x,-1,ncf,1,256", "time"),
        ("x,10,ncf,one,256", "num_replicas"),
    ],
)
def test_bad_workload_fails_and_writes_nothing(tmp_path: Path, row: str, field: str) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{HEADER}\nok,0,ncf,1,256\n{row}\n")
    out = tmp_path / "res.json"
    result = runner.invoke(app, ["simulate", str(bad), "--out", str(out)])
    assert result.exit_code == 2
    assert f"bad.csv:3 [{field}]" in result.output.replace("\n", "")
    assert not out.exists()


def test_missing_column_fails_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("name,time,application,num_replicas\nx,0,ncf,1\n")
    out = tmp_path / "res.json"
    result = runner.invoke(app, ["simulate", str(bad), "--out", str(out)])
    assert result.exit_code == 2
    assert "[batch_size]" in result.output
    assert not out.exists()


def test_folder_with_one_bad_file_fails_before_running(tmp_path: Path) -> None:
    write_workload(tmp_path / "a.csv", SMALL)
    (tmp_path / "b.csv").write_text(f"{HEADER}\nx,0,ncf,1,zero\n")
    out = tmp_path / "res.json"
    result = runner.invoke(app, ["simulate", str(tmp_path), "--out", str(out), "-j", "2"])
    assert result.exit_code == 2
    assert "b.csv:2 [batch_size]" in result.output.replace("\n", "")
    assert not out.exists()


def test_usage_errors() -> None:
    assert runner.invoke(app, ["simulate"]).exit_code != 0
    assert runner.invoke(app, ["simulate", "--suite", "other"]).exit_code != 0
    assert runner.invoke(app, ["simulate", "x.csv", "--policy", "fifo"]).exit_code != 0


@pytest.mark.slow
def test_folder_runs_in_parallel_like_serial(tmp_path: Path) -> None:
    folder = tmp_path / "wl"
    folder.mkdir()
    write_workload(folder / "w-1.csv", SMALL)
    write_workload(folder / "w-2.csv", SMALL[:4])
    out = tmp_path / "res.json"
    result = runner.invoke(
        app,
        [
            "simulate",
            str(folder),
            "-p",
            "optimus",
            "-p",
            "tiresias",
            "--nodes",
            "2",
            "-o",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["workload"]) for r in runs] == [
        ("optimus", "w-1"),
        ("optimus", "w-2"),
        ("tiresias", "w-1"),
        ("tiresias", "w-2"),
    ]
    from autoscaler.sim.config import SimConfig

    serial = run_many(
        [RunSpec(str(folder / "w-2.csv"), "tiresias", SimConfig(num_nodes=2))], processes=1
    )
    assert serial[0].summary() == pytest.approx(runs[3]["summary"])


def test_compare_with_paper_rows() -> None:
    class Fake:
        def __init__(self, workload: str, policy: str, mean: float) -> None:
            self.workload, self.policy, self._mean = workload, policy, mean

        def summary(self) -> dict:
            return {"mean_jct_s": self._mean}

    rows = compare_with_paper([Fake("workload-1", "tiresias", 2000.0)], "1.0")
    assert rows[0].paper_jct_s == pytest.approx(2473.65)
    assert rows[0].ratio == pytest.approx(2000.0 / 2473.65)
    assert rows[-1].workload == "mean" and rows[-1].paper_jct_s == pytest.approx(4038.2, abs=0.1)


def test_simulate_in_the_measured_world(small_workload: Path, tmp_path: Path) -> None:
    """--world measured reaches the run (restarts drawn from the measurements: the JCTs move)
    and is recorded; a bad --world or --speed-error is one line that names it."""
    common = ["simulate", str(small_workload), "--policy", "tiresias", "--nodes", "2"]
    jcts = {}
    for world in ("ideal", "measured"):
        out = tmp_path / f"{world}.json"
        result = runner.invoke(app, [*common, "--world", world, "--out", str(out)])
        assert result.exit_code == 0, result.output
        run = json.loads(out.read_text())["runs"][0]
        assert run["config"]["world"] == world
        jcts[world] = [job["jct_s"] for job in run["jobs"]]
    assert jcts["ideal"] != jcts["measured"]
    for flag, value in (("--world", "dreamt"), ("--speed-error", "1.5")):
        result = runner.invoke(app, [*common, flag, value])
        assert result.exit_code != 0 and flag.removeprefix("--").replace("-", "_") in result.output
