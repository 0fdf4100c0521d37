"""The report's outputs: formatted rows, terminal tables, CSV, the JSON summary and the HTML page
(structure and plots; the page in a real browser is in test_html_chromium.py)."""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from rich.console import Console

from autoscaler.accounting.costs import (
    CostRecord,
    idle_cost_usd,
    job_costs,
    record_to_json,
    summarize,
    total_cost_usd,
    usd_to_cents,
)
from autoscaler.accounting.report.export import csv_files, summary_json, write_csv_files
from autoscaler.accounting.report.html import (
    MAX_STACKED_OFFERINGS,
    plot_cost_over_time,
    render_html,
)
from autoscaler.accounting.report.rows import report_tables
from autoscaler.accounting.report.source import find_cost_records
from autoscaler.accounting.report.tables import print_report
from autoscaler.errors import InvalidInputError
from tests.accounting.report.conftest import ON_DEMAND, SPOT_A, SPOT_B, build_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_sample_run_adds_up(record: CostRecord) -> None:
    # Hand-computed: a1 1800 s at 1.20 + 1800 s at 1.32; b1 1500 s at 1.50; b2 the 60 s
    # minimum at 1.50; od1 2040 s at 3.60.
    expected = (1800 * 1.20 + 1800 * 1.32 + 1500 * 1.50 + 60 * 1.50 + 2040 * 3.60) / 3600
    assert usd_to_cents(total_cost_usd(record)) == usd_to_cents(expected) == Decimal("3.95")
    jobs = sum(j.cost_usd for j in job_costs(record))
    assert jobs > 0
    assert jobs + idle_cost_usd(record) == pytest.approx(total_cost_usd(record), abs=1e-12)


def test_rows_are_formatted_once_for_every_output(record: CostRecord) -> None:
    summary, jobs, offerings = report_tables(record)
    values = {row[0]: row[1] for row in summary.rows}
    assert values["total cost (USD)"] == "3.95"
    assert values["instances preempted"] == "1"
    assert values["jobs finished"] == "3"
    by_job = {row[0]: row for row in jobs.rows}
    assert by_job["train-4"][-1] == ""  # unfinished: no JCT
    assert by_job["train-1"][-1] == "0.667"  # 2400 s
    assert [row[0] for row in offerings.rows] == [SPOT_A, SPOT_B, ON_DEMAND]
    assert all(re.fullmatch(r"\d+\.\d\d", row[7]) for row in offerings.rows)  # USD, cents


def test_terminal_tables_show_every_number_or_say_what_is_left_out(record: CostRecord) -> None:
    wide = Console(file=io.StringIO(), width=160, no_color=True)
    print_report(wide, record, label="coadapt / spot-first")
    text = wide.file.getvalue()  # type: ignore[attr-defined]
    assert "Cost summary: coadapt / spot-first" in text
    assert "3.95" in text and "train-4" in text and "more column" not in text
    narrow = Console(file=io.StringIO(), width=80, no_color=True)
    print_report(narrow, record)
    text = narrow.file.getvalue()  # type: ignore[attr-defined]
    assert "more columns in a wider terminal" in text
    assert "…" not in text  # nothing cut with an ellipsis
    assert max(len(line) for line in text.splitlines()) <= 80


def test_csv_files(record: CostRecord, tmp_path: Path) -> None:
    files = csv_files(record)
    assert set(files) == {
        "summary.csv",
        "jobs.csv",
        "offerings.csv",
        "fleet.csv",
        "cost_over_time.csv",
    }
    jobs = list(csv.DictReader(io.StringIO(files["jobs.csv"])))
    assert [j["job"] for j in jobs] == ["train-1", "train-2", "train-3", "train-4"]
    total = sum(Decimal(j["cost (USD)"]) for j in jobs)
    assert abs(total - usd_to_cents(sum(j.cost_usd for j in job_costs(record)))) <= Decimal(
        "0.02"
    )  # each row is rounded on its own (half a cent each at most)
    fleet = list(csv.DictReader(io.StringIO(files["fleet.csv"])))
    assert fleet[0] == {"t_s": "0.0", "instances": "2", "gpus": "8", "usd_per_hour": "2.700000"}
    over_time = list(csv.reader(io.StringIO(files["cost_over_time.csv"])))
    assert over_time[0] == ["t_s", SPOT_A, SPOT_B, ON_DEMAND]
    assert float(over_time[-1][0]) == 3600.0
    paths = write_csv_files(tmp_path / "out", record)
    assert sorted(p.name for p in paths) == sorted(files)
    assert (tmp_path / "out" / "jobs.csv").read_text() == files["jobs.csv"]


def test_summary_json(record: CostRecord) -> None:
    data = summary_json(record, label="x")
    assert json.loads(json.dumps(data, allow_nan=False)) == data
    assert data["summary"]["total_usd"] == 3.95
    assert data["label"] == "x" and data["version"] == 1
    s = summarize(record)
    assert data["summary"]["savings_usd"] == float(usd_to_cents(s.savings_usd or 0.0))
    assert [j["job_id"] for j in data["jobs"]] == ["train-1", "train-2", "train-3", "train-4"]
    assert data["jobs"][3]["jct_hours"] is None


def _images(page: str) -> list[bytes]:
    return [
        base64.b64decode(m)
        for m in re.findall(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    ]


def test_html_page_is_self_contained_with_three_plots(record: CostRecord) -> None:
    page = render_html([("coadapt / spot-first", record)])
    images = _images(page)
    assert len(images) == 3
    assert all(img.startswith(PNG_MAGIC) and len(img) > 5_000 for img in images)
    assert "Total cost: 3.95 USD" in page
    assert 'data-table="jobs"' in page and "train-4" in page
    # No reference to anything outside the page.
    assert not re.search(r"(src|href)=\"(?!data:|#)", page)
    assert "http://" not in page and "https://" not in page and "url(" not in page
    assert "<script" not in page
    assert "Runs compared" not in page  # one run: no overview


def test_html_page_for_several_runs(record: CostRecord) -> None:
    page = render_html([("pollux", record), ("tiresias <b>", build_record(scale=2.0))])
    assert len(_images(page)) == 6
    assert "Runs compared" in page and 'href="#run-2"' in page
    assert "tiresias &lt;b&gt;" in page and "tiresias <b>" not in page


def test_stacked_plot_groups_many_offerings() -> None:
    from autoscaler.accounting.costs import CostLedger

    ledger = CostLedger()
    for n in range(MAX_STACKED_OFFERINGS + 3):
        ledger.launch(
            f"i{n}",
            offering_key=f"gcp/a2-highgpu-1g/zone-{n}/spot",
            provider="gcp",
            instance_type="a2-highgpu-1g",
            gpu_type="A100",
            gpus=1,
            zone=f"zone-{n}",
            market="spot",
            t_s=float(n * 60),
            usd_per_hour=1.0 + n / 10,
        )
    png = plot_cost_over_time(ledger.close(3600.0))
    assert png.startswith(PNG_MAGIC)


def test_plots_of_an_empty_run() -> None:
    from autoscaler.accounting.costs import CostLedger

    page = render_html([(None, CostLedger().close(0.0))])
    assert len(_images(page)) == 3
    assert "Total cost: 0.00 USD" in page


# ---- finding records in files ---------------------------------------------------------------


def test_find_a_bare_record_a_result_and_a_list(record: CostRecord) -> None:
    data = record_to_json(record)
    (bare,) = find_cost_records(data).records
    assert bare.label is None and bare.record == record
    (one,) = find_cost_records({"policy": "pollux", "cost_record": data}).records
    assert one.label == "pollux"
    results = [
        {"workload": "w1", "policy": "coadapt", "strategy": "spot-first", "cost_record": data},
        {"policy": "tiresias", "cost_record": None},
        {"cost_record": data},
    ]
    found = find_cost_records(results)
    assert [r.label for r in found.records] == ["coadapt / spot-first / w1", "run 3"]
    assert found.skipped == ("tiresias",)
    runs = find_cost_records({"format": "coadapt-sim-results", "runs": results})
    assert len(runs.records) == 2


@pytest.mark.parametrize(
    ("payload", "words"),
    [
        ({"a": 1}, "no cost record"),
        ([{"policy": "x"}], "no cost record in any of the 1 results"),
        ({"runs": []}, "no cost record in any of the 0 results"),
        ({"cost_record": None}, "null"),
        (3, "no cost record"),
    ],
)
def test_no_record_inside(payload: object, words: str) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(words)):
        find_cost_records(payload)


def test_a_malformed_record_is_named_by_its_path(record: CostRecord) -> None:
    bad = record_to_json(record)
    bad["instances"][0]["gpus"] = "four"
    with pytest.raises(InvalidInputError) as info:
        find_cost_records({"runs": [{"cost_record": record_to_json(record)}, {"cost_record": bad}]})
    assert info.value.field == "runs[1].cost_record.instances[0].gpus"
    assert "runs[1].cost_record" in str(info.value) and "'four'" in str(info.value)
