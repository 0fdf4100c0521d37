"""``coadapt cost``: cost reports from a cost record (thin: read, find, render, write).

``coadapt cost report FILE [--format table|csv|json|html] [--out PATH]``. FILE is JSON holding a
cost record (:func:`autoscaler.accounting.costs.record_to_json`) at top level, under
``"cost_record"`` of a simulation result, or in each of a list of results (each reported, labelled
by its policy, strategy and workload); or the cost-time frontiers of ``benchmarks/cloud_cost.py
--frontier`` (``--format html`` only: :mod:`autoscaler.accounting.report.frontier`). Bad input — a
missing file, invalid JSON, no cost record, a malformed one — is one line on stderr and exit status
2; files are written atomically.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

import typer

from autoscaler.cli.common import StoreUrl, cluster_store_location

__all__ = ["ReportFormat", "cost_app"]

cost_app = typer.Typer(
    rich_markup_mode=None,  # plain help: option names whole at 80 columns
    name="cost",
    help="Cost reports: what a fleet cost, per job and per offering, and what spot saved.",
    no_args_is_help=True,
    add_completion=False,
)


class ReportFormat(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    HTML = "html"


@cost_app.callback()
def _cost() -> None:
    """Cost reports: what a fleet cost, per job and per offering, and what spot saved."""


def _fail(message: str) -> NoReturn:
    typer.echo(f"coadapt: {message}", err=True)
    raise typer.Exit(code=2)


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", label.lower()).strip("-.") or "run"


def _unique_slugs(labels: list[str | None]) -> list[str]:
    """File-system names for the labels, made unique with a numeric suffix."""
    out: list[str] = []
    for n, label in enumerate(labels, start=1):
        base = _slug(label or f"run {n}")
        name, k = base, 2
        while name in out:
            name, k = f"{base}-{k}", k + 1
        out.append(name)
    return out


@cost_app.command("report")
def report(
    file: Path | None = typer.Argument(
        None,
        help="JSON: a cost record, a simulation result with one, or a list of results "
        "(or give --state-dir for a cluster's own store).",
    ),
    fmt: ReportFormat = typer.Option(
        ReportFormat.TABLE,
        "--format",
        "-f",
        help="Table (terminal), csv (one file per table, in the --out folder), json (summary), "
        "html (one self-contained page with plots).",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="Where to write: a folder for csv (one sub-folder per run when several), a file "
        "otherwise; table and json print to stdout without it.",
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help="Report a cluster's fleet from its controller store (the folder coadapt up "
        "uses) instead of a FILE.",
    ),
    wide: bool = typer.Option(
        False, "--wide", help="Table: show every column, however wide the terminal."
    ),
    store_url: StoreUrl = None,
) -> None:
    """Report what a run cost: totals, per job (GPU-hours, USD, goodput per USD, JCT), per
    offering and market (instance-hours, USD, savings vs on-demand), and over time.

    USD are shown with the precision the amount needs: to the cent from a dollar up, three
    significant digits below (a sub-cent run reads 0.0153, not 0.00); the total is also given
    to the cent, as a bill shows it (ROUND_HALF_UP). A job is charged its share of
    its instances' GPUs times their price while it held them; what no job held (free GPUs,
    provisioning, minimum billing) is idle cost, so jobs + idle = total.
    """

    if file is None and state_dir is None and store_url is not None:
        from autoscaler.cli.common import default_state_dir

        state_dir = default_state_dir()  # --store alone: the database it names
    if (file is None) == (state_dir is None):
        _fail("give either a FILE or --state-dir")
    if fmt in (ReportFormat.CSV, ReportFormat.HTML) and out is None:
        what = "a folder" if fmt is ReportFormat.CSV else "an .html file"
        _fail(f"--format {fmt.value} writes files: give --out with {what}")
    if out is not None:
        if fmt is ReportFormat.CSV and out.exists() and not out.is_dir():
            _fail(f"--out {out}: is a file; csv needs a folder")
        if fmt is not ReportFormat.CSV and out.is_dir():
            _fail(f"--out {out}: is a folder; give a file name")
    if state_dir is not None:
        reports = [store_report(state_dir, store_url)]
        source_name = str(state_dir)
    else:
        assert file is not None
        if _frontier_report(file, fmt, out):
            return
        reports = _file_reports(file)
        source_name = file.name
    _write_reports(reports, fmt, out, source_name, wide=wide)


def store_report(
    state_dir: Path, store_url: str | None = None
) -> tuple[str | None, Any, None, Any]:
    """``(label, record, None, churn)`` of a cluster's store (the one its state folder
    records, or ``store_url``'s: :func:`~autoscaler.controller.service.open_cluster_store`):
    its cost record and its churn (:func:`~autoscaler.accounting.billing.churn_from_store`,
    reversals over the controller's default round interval)."""
    from autoscaler.accounting.billing import churn_from_store, cost_record_from_store, run_origin_s
    from autoscaler.controller.errors import StoreError
    from autoscaler.controller.loop import ControllerConfig
    from autoscaler.controller.service import ServiceError, open_cluster_store
    from autoscaler.errors import InvalidInputError
    from coadapt_common.clock import SystemClock

    clock = SystemClock()
    try:
        if cluster_store_location(state_dir, store_url) is None:
            _fail(f"--state-dir {state_dir}: no cluster store there (no store.db, and no "
                  "database in cluster.json); give the cluster's --store URL")  # fmt: skip
        with open_cluster_store(state_dir, clock, store_url=store_url) as store:
            record = cost_record_from_store(store, clock.now_s())
            churn = churn_from_store(
                store,
                record,
                interval_s=ControllerConfig.interval_s,
                origin_s=run_origin_s(store) or 0.0,
            )
            return f"cluster {store.cluster_id}", record, None, churn
    except (StoreError, ServiceError) as e:
        _fail(str(e))
    except InvalidInputError as e:  # a store whose history the ledger cannot take: one line
        _fail(f"--state-dir {state_dir}: cannot build its cost record: {e}")


def _frontier_report(file: Path, fmt: ReportFormat, out: Path | None) -> bool:
    """Write the frontier page if ``file`` holds cost-time frontiers (then True); False for
    any other file, left to :func:`_file_reports` (which reports what is wrong with it)."""
    from autoscaler.accounting.report.frontier import (
        frontiers_from_json,
        is_frontier_payload,
        write_frontier_html,
    )
    from autoscaler.errors import InvalidInputError

    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    if not is_frontier_payload(payload):
        return False
    if fmt is not ReportFormat.HTML:
        _fail(f"{file}: holds cost-time frontiers (cloud_cost.py --frontier): use --format html")
    try:
        frontiers = frontiers_from_json(payload)
    except InvalidInputError as e:
        _fail(f"{file}: {e}")
    assert out is not None
    try:
        write_frontier_html(out, frontiers, title=f"coadapt cost-time frontiers: {file.name}")
    except OSError as e:
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
    typer.echo(f"report written to {out}", err=True)
    return True


def _file_reports(file: Path) -> list[tuple[Any, ...]]:
    from autoscaler.accounting.report.source import find_cost_records
    from autoscaler.errors import InvalidInputError

    if not file.exists():
        _fail(f"{file}: no such file")
    if file.is_dir():
        _fail(f"{file}: is a folder; give a JSON file")
    try:
        payload = json.loads(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        _fail(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})")
    except json.JSONDecodeError as e:
        _fail(f"{file}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}")
    except OSError as e:
        _fail(f"{file}: cannot read: {e.strerror or e}")
    try:
        found = find_cost_records(payload)
    except InvalidInputError as e:
        _fail(f"{file}: {e}")
    for label in found.skipped:
        typer.echo(f"note: {label}: no cost record (skipped)", err=True)
    return [(r.label, r.record, r.floor) for r in found.records]


def _write_reports(
    reports: list[tuple[Any, ...]],
    fmt: ReportFormat,
    out: Path | None,
    source: str,
    *,
    wide: bool = False,
) -> None:
    from coadapt_common.atomic import write_text_atomic

    try:
        if fmt is ReportFormat.TABLE:
            text = render_tables(reports, plain=out is not None, wide=wide)
            if out is None:
                return
            write_text_atomic(out, text)
        elif fmt is ReportFormat.JSON:
            from autoscaler.accounting.report.export import summary_json

            summaries = [
                summary_json(
                    r[1],
                    label=r[0],
                    floor=r[2] if len(r) > 2 else None,
                    churn=r[3] if len(r) > 3 else None,
                )
                for r in reports
            ]
            body = summaries[0] if len(summaries) == 1 else summaries
            text = json.dumps(body, indent=1, allow_nan=False) + "\n"
            if out is None:
                typer.echo(text, nl=False)
                return
            write_text_atomic(out, text)
        elif fmt is ReportFormat.CSV:
            from autoscaler.accounting.report.export import write_csv_files

            assert out is not None
            if len(reports) == 1:
                write_csv_files(out, reports[0][1])
            else:
                for slug, r in zip(_unique_slugs([r[0] for r in reports]), reports, strict=True):
                    write_csv_files(out / slug, r[1])
        else:
            from autoscaler.accounting.report.html import write_html

            assert out is not None
            write_html(out, reports, title=f"coadapt cost report: {source}")
    except OSError as e:
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
    typer.echo(f"report written to {out}", err=True)


def render_tables(
    reports: list, *, plain: bool, wide: bool = False, width: int | None = 120
) -> str:
    """Print the tables (``plain``: into a string, no colour, returned, ``width`` columns,
    ``None``: the terminal's, or ``COLUMNS``, else 120; ``wide``: every column). Each report is
    ``(label, record)``, ``(label, record, floor)`` (a simulated run's
    :class:`~autoscaler.accounting.report.source.RunFloor`, or ``None``) or ``(label, record,
    floor, churn)`` (a cluster's :class:`~autoscaler.accounting.churn.ChurnFigures`)."""
    import io
    import shutil

    from rich.console import Console

    from autoscaler.accounting.report.tables import print_churn, print_floor, print_report

    buffer = io.StringIO()
    if width is None:
        width = shutil.get_terminal_size((120, 24)).columns
    console = Console(file=buffer, width=width, no_color=True) if plain else Console()
    for label, record, *rest in reports:
        print_report(console, record, label=label, wide=wide)
        if rest and rest[0] is not None:
            print_floor(console, rest[0], label=label)
        if len(rest) > 1 and rest[1] is not None:
            print_churn(console, rest[1], label=label)
    return buffer.getvalue()
