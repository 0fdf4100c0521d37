"""``coadapt simulate`` on the inputs a new user got wrong: one line naming the fault, exit 2,
before any simulation runs (so no run's results are lost); and a table that stays readable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscaler.cli.main import app
from tests.conftest import Unprivileged
from tests.sim.conftest import SMALL, write_workload

runner = CliRunner()


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    return write_workload(tmp_path / "w.csv", SMALL[:2])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], "coadapt: --seed must be >= 0, got -1"),
        (["--interval-s", "inf"], "coadapt: --interval-s must be a finite number of seconds > 0"),
        (["--interval-s", "nan"], "coadapt: --interval-s must be a finite number of seconds > 0"),
        (["--restart-delay-s", "inf"], "coadapt: --restart-delay-s must be a finite number"),
        (["--load", "0.5"], "coadapt: --load applies only to --suite paper"),
    ],
)
def test_bad_option_is_one_line(workload: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", str(workload), *args])
    assert result.exit_code == 2
    lines = error_lines(result.output)
    assert len(lines) == 1 and lines[0].startswith(message), result.output


def test_out_naming_a_folder_fails_before_running(workload: Path, tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    result = runner.invoke(app, ["simulate", str(workload), "--out", str(folder)])
    assert result.exit_code == 2
    assert error_lines(result.output) == [f"coadapt: --out {folder}: is a folder; give a file name"]
    assert "mean JCT" not in result.output  # rejected before the run, not after it
    assert list(folder.iterdir()) == []


def test_out_in_a_missing_folder_fails_before_running(workload: Path, tmp_path: Path) -> None:
    out = tmp_path / "nope" / "r.json"
    result = runner.invoke(app, ["simulate", str(workload), "--out", str(out)])
    assert result.exit_code == 2
    assert error_lines(result.output) == [
        f"coadapt: --out {out}: folder {out.parent} does not exist"
    ]


def test_out_in_a_read_only_folder_fails_before_running(unprivileged: Unprivileged) -> None:
    """Run by a user the folder's mode binds (nobody when the suite runs as root: root writes
    anywhere), as the console script."""
    workload = write_workload(unprivileged.folder / "w.csv", SMALL[:2])
    workload.chmod(0o644)
    folder = unprivileged.read_only_folder("ro")
    out = unprivileged.run(
        [sys.executable, "-m", "autoscaler.cli", "simulate", str(workload), "--out",
         str(folder / "r.json")]
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert error_lines(out.stderr) == [f"coadapt: --out {folder / 'r.json'}: not writable"]
    assert list(folder.iterdir()) == []


def test_empty_folder_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["simulate", str(empty)])
    assert result.exit_code == 2
    assert error_lines(result.output) == [f"coadapt: {empty}: folder holds no *.csv workload file"]


def test_missing_workload_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["simulate", str(tmp_path / "none.csv")])
    assert result.exit_code == 2
    assert error_lines(result.output) == [
        f"coadapt: {tmp_path / 'none.csv'}: no such file or folder"
    ]


def test_binary_workload_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_bytes(bytes(range(255, -1, -1)) * 4)
    result = runner.invoke(app, ["simulate", str(bad)])
    assert result.exit_code == 2
    lines = error_lines(result.output)
    assert len(lines) == 1 and lines[0].startswith(f"coadapt: {bad}: not a CSV text file")
    assert "Traceback" not in result.output


def test_table_keeps_long_workload_names_and_defines_ftf(tmp_path: Path) -> None:
    name = "a-workload-with-a-rather-long-name-12"
    wl = write_workload(tmp_path / f"{name}.csv", SMALL[:2])
    # CliRunner's stdout is not a terminal: rich lays the table out for 80 columns.
    result = runner.invoke(app, ["simulate", str(wl), "-p", "tiresias", "--nodes", "2"])
    assert result.exit_code == 0, result.output
    assert name in result.output
    assert "…" not in result.output
    text = " ".join(result.output.split())
    assert "FTF: finish-time fairness" in text


def test_help_has_no_fleet_optimizer_claim() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "per dollar" not in text and "instance mix" not in text
