"""Cost reports as CSV files (one per table, plus the time series) and as a JSON summary.

:func:`csv_files` and :func:`summary_json` are pure; :func:`write_csv_files` writes each file
atomically (:mod:`coadapt_common.atomic`).

CSV files: ``summary.csv`` (figure, value), ``jobs.csv``, ``offerings.csv`` (the columns of
:mod:`autoscaler.accounting.report.rows`, same formatting), ``fleet.csv`` (the fleet step series:
``t_s,instances,gpus,usd_per_hour``, each row holding until the next) and
``cost_over_time.csv`` (``t_s`` then one column of cumulative USD per offering key, linear
between rows).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autoscaler.accounting.churn import ChurnFigures
from autoscaler.accounting.costs import (
    CostRecord,
    cumulative_cost_by_offering,
    fleet_series,
    job_costs,
    offering_costs,
    summarize,
    usd_for_display,
    usd_to_cents,
)
from autoscaler.accounting.report.rows import report_tables
from autoscaler.accounting.report.source import RunFloor
from coadapt_common.atomic import write_text_atomic

__all__ = ["SUMMARY_VERSION", "csv_files", "summary_json", "write_csv_files"]

SUMMARY_VERSION = 1
ROUNDING_NOTE = (
    "USD to the cent from one dollar up, 3 significant digits below (ROUND_HALF_UP, after 1e-9 "
    "USD, ROUND_HALF_EVEN); total_billed_usd to the cent"
)


def _csv(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue()


def csv_files(record: CostRecord) -> dict[str, str]:
    """File name -> CSV text, for every table and series of the report (see the module
    docstring)."""
    out = {
        f"{t.name}.csv": _csv([c.header for c in t.columns], t.rows) for t in report_tables(record)
    }
    out["fleet.csv"] = _csv(
        ["t_s", "instances", "gpus", "usd_per_hour"],
        [(repr(p.t_s), p.instances, p.gpus, f"{p.usd_per_hour:.6f}") for p in fleet_series(record)],
    )
    cumulative = cumulative_cost_by_offering(record)
    out["cost_over_time.csv"] = _csv(
        ["t_s", *cumulative.offerings],
        [
            (repr(t), *(f"{column[n]:.6f}" for column in cumulative.usd))
            for n, t in enumerate(cumulative.times_s)
        ],
    )
    return out


def write_csv_files(folder: str | Path, record: CostRecord) -> list[Path]:
    """Write :func:`csv_files` into ``folder`` (created if missing), each file atomically;
    returns the paths written."""
    paths = []
    for name, text in csv_files(record).items():
        path = Path(folder) / name
        write_text_atomic(path, text)
        paths.append(path)
    return paths


def _money(usd: float | None) -> float | None:
    """USD with the precision the amount needs, as a JSON number (``12.34``, ``0.0153``)."""
    return None if usd is None else float(usd_for_display(usd))


def _cents(usd: float) -> float:
    """USD to the cent, as a JSON number (what a bill shows)."""
    return float(usd_to_cents(usd))


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0


def summary_json(
    record: CostRecord,
    *,
    label: str | None = None,
    floor: RunFloor | None = None,
    churn: ChurnFigures | None = None,
) -> dict[str, Any]:
    """The report as JSON-ready data: ``version``, ``label``, the rounding rule, ``summary``,
    ``jobs`` and ``offerings``, with USD to the cent (numbers) and times in hours; with a
    simulated run's ``floor``, also ``floor``: ``floor_usd`` (a), ``floor_at_jct_usd`` (b),
    ``cost_usd``, ``cost_over_floor`` (cost / (b)) and the same ``per_application``; with the
    run's ``churn`` (a cluster's store), also ``churn``:
    :meth:`~autoscaler.accounting.churn.ChurnFigures.to_json`, USD to the cent."""
    s = summarize(record)
    out = _summary_json(record, s, label)
    if churn is not None:
        doc = churn.to_json()
        doc["idle_usd_by_cause"] = {k: _money(v) for k, v in doc["idle_usd_by_cause"].items()}
        out["churn"] = doc
    if floor is not None:

        def amounts(a: float, b: float, cost: float) -> dict[str, Any]:
            return {
                "floor_usd": _money(a),
                "floor_at_jct_usd": _money(b),
                "cost_usd": _money(cost),
                "cost_over_floor": RunFloor.ratio(cost, b),
            }

        out["floor"] = {
            **amounts(floor.floor_usd, floor.floor_at_jct_usd, floor.cost_usd),
            "per_application": {
                app: amounts(a["floor_usd"], a["floor_at_jct_usd"], a["cost_usd"])
                for app, a in sorted(floor.per_application.items())
            },
        }
    return out


def _summary_json(record: CostRecord, s: Any, label: str | None) -> dict[str, Any]:
    return {
        "version": SUMMARY_VERSION,
        "label": label,
        "rounding": ROUNDING_NOTE,
        "summary": {
            "total_usd": _money(s.total_usd),
            "total_billed_usd": _cents(s.total_usd),
            "attributed_usd": _money(s.attributed_usd),
            "idle_usd": _money(s.idle_usd),
            "min_billing_usd": _money(s.shortfall_usd),
            "ondemand_usd": _money(s.ondemand_usd),
            "savings_usd": _money(s.savings_usd),
            "run_hours": _hours(s.closed_s),
            "instances": s.instances,
            "spot_instances": s.spot_instances,
            "preempted_instances": s.preempted_instances,
            "instance_hours": s.instance_hours,
            "gpu_hours": s.gpu_hours,
            "used_gpu_hours": s.used_gpu_hours,
            "utilization": s.utilization,
            "peak_instances": s.peak_instances,
            "peak_gpus": s.peak_gpus,
            "peak_usd_per_hour": _money(s.peak_usd_per_hour),
            "jobs": s.jobs,
            "finished_jobs": s.finished_jobs,
            "restarts": s.restarts,
            "preemptions": s.preemptions,
            "useful_samples": s.useful_samples,
            "samples_per_usd": s.samples_per_usd,
        },
        "jobs": [
            {
                "job_id": j.job_id,
                "gpu_hours": j.gpu_hours,
                "cost_usd": _money(j.cost_usd),
                "useful_samples": j.useful_samples,
                "samples_per_usd": j.samples_per_usd,
                "restarts": j.restarts,
                "preemptions": j.preemptions,
                "jct_hours": _hours(j.jct_s),
            }
            for j in job_costs(record)
        ],
        "offerings": [
            {
                "offering_key": o.offering_key,
                "market": o.market,
                "provider": o.provider,
                "instance_type": o.instance_type,
                "gpu_type": o.gpu_type,
                "zone": o.zone,
                "instances": o.instances,
                "preempted": o.preempted,
                "instance_hours": o.instance_hours,
                "gpu_hours": o.gpu_hours,
                "cost_usd": _money(o.cost_usd),
                "ondemand_usd": _money(o.ondemand_usd),
                "savings_usd": _money(o.savings_usd),
            }
            for o in offering_costs(record)
        ],
    }
