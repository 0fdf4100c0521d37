"""``coadapt cost report`` through the main app, with typer's CliRunner: every format, lists
of results, and the errors (exit status 2, one line, no traceback)."""

from __future__ import annotations

import base64
import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscaler.accounting.costs import record_to_json
from autoscaler.cli.main import app
from tests.accounting.report.conftest import build_record

runner = CliRunner()


@pytest.fixture
def record_file(tmp_path: Path) -> Path:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record_to_json(build_record())))
    return path


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    """A list of simulation results: two with a cost record, one fixed-cluster run without."""
    results = [
        {"workload": "w1", "policy": "coadapt", "cost_record": record_to_json(build_record())},
        {"workload": "w1", "policy": "tiresias", "cost_record": None},
        {"workload": "w1", "policy": "pollux", "cost_record": record_to_json(build_record(2.0))},
    ]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    return path


def cost(*args: str | Path):
    return runner.invoke(app, ["cost", "report", *map(str, args)])


def test_table_to_the_terminal(record_file: Path) -> None:
    result = cost(record_file)
    assert result.exit_code == 0, result.output
    assert "Cost summary" in result.stdout and "3.95" in result.stdout
    assert "Cost per job" in result.stdout and "train-4" in result.stdout


def test_table_to_a_file(record_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.txt"
    result = cost(record_file, "--format", "table", "--out", out)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "Cost per offering and market" in text and "\x1b[" not in text  # plain text
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left nothing behind


def test_json_summary_to_stdout_and_file(record_file: Path, tmp_path: Path) -> None:
    result = cost(record_file, "-f", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["summary"]["total_usd"] == 3.95 and data["label"] is None
    out = tmp_path / "summary.json"
    assert cost(record_file, "-f", "json", "-o", out).exit_code == 0
    assert json.loads(out.read_text()) == data


def test_json_for_a_list_of_results(results_file: Path) -> None:
    result = cost(results_file, "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["label"] for d in data] == ["coadapt / w1", "pollux / w1"]
    assert data[1]["summary"]["total_usd"] > data[0]["summary"]["total_usd"]
    assert "tiresias / w1: no cost record (skipped)" in result.stderr


def test_csv_files(record_file: Path, results_file: Path, tmp_path: Path) -> None:
    result = cost(record_file, "--format", "csv", "--out", tmp_path / "one")
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == ["cost_over_time.csv", "fleet.csv", "jobs.csv", "offerings.csv", "summary.csv"]
    rows = list(csv.reader((tmp_path / "one" / "summary.csv").open()))
    assert rows[0] == ["figure", "value"] and ["total cost (USD)", "3.95"] in rows
    result = cost(results_file, "--format", "csv", "--out", tmp_path / "many")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["coadapt-w1", "pollux-w1"]
    assert (tmp_path / "many" / "pollux-w1" / "jobs.csv").exists()


def test_html_page(results_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = cost(results_file, "--format", "html", "--out", out)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 6  # three plots per run
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "coadapt / w1" in page and "pollux / w1" in page


def test_a_result_with_its_record_under_cost_record(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(
        json.dumps(
            {
                "policy": "coadapt",
                "strategy": "spot-first",
                "cost_record": record_to_json(build_record()),
            }
        )
    )
    result = cost(path)
    assert result.exit_code == 0, result.output
    assert "Cost summary: coadapt / spot-first" in result.stdout


def _bad(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("make", "args", "words"),
    [
        (lambda d: d / "missing.json", (), "no such file"),
        (lambda d: _bad(d, "bad.json", '{"version": 1,'), (), "invalid JSON at line 1"),
        (lambda d: _bad(d, "none.json", '{"policy": "x"}'), (), "no cost record"),
        (lambda d: _bad(d, "list.json", '[{"policy": "x"}]'), (), "no cost record in any"),
        (
            lambda d: _bad(d, "bad-record.json", '{"version": 1, "closed_s": 1, "instances": 3}'),
            (),
            "instances: expected a list",
        ),
        (
            lambda d: _bad(d, "v.json", '{"version": 7, "instances": []}'),
            (),
            "unsupported version 7",
        ),
        (lambda d: d, (), "is a folder"),
        (lambda d: _bad(d, "ok.json", "[]"), ("--format", "csv"), "give --out"),
        (lambda d: _bad(d, "ok.json", "[]"), ("--format", "html"), "give --out"),
        (lambda d: _bad(d, "ok.json", "[]"), ("--format", "html", "--out", "."), "is a folder"),
    ],
)
def test_errors_exit_2_without_a_traceback(
    make, args: tuple[str, ...], words: str, tmp_path: Path
) -> None:
    result = cost(make(tmp_path), *args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr
    assert result.stderr.startswith("coadapt: ") and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_unknown_format_is_a_usage_error(record_file: Path) -> None:
    result = cost(record_file, "--format", "pdf")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_cost_is_listed_in_the_main_help() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "cost" in result.stdout
    result = runner.invoke(app, ["cost", "--help"])
    assert result.exit_code == 0 and "report" in result.stdout


def test_table_at_80_columns_says_how_to_see_all_and_wide_shows_them(record_file: Path) -> None:
    from autoscaler.accounting.report.rows import report_tables
    from tests.accounting.report.conftest import build_record

    narrow = runner.invoke(app, ["cost", "report", str(record_file)], env={"COLUMNS": "80"})
    assert narrow.exit_code == 0, narrow.output
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
    assert "…" not in narrow.stdout
    assert "more columns in a wider terminal, or with --wide" in " ".join(narrow.stdout.split())
    wide = runner.invoke(app, ["cost", "report", str(record_file), "--wide"], env={"COLUMNS": "80"})
    assert wide.exit_code == 0, wide.output
    assert "more column" not in wide.stdout and "…" not in wide.stdout
    words = set(wide.stdout.split())
    for table in report_tables(build_record()):
        for column in table.columns:
            assert set(column.header.split()) <= words, column.header
