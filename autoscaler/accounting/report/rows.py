"""The cost report's tables as rows of formatted cells, shared by the terminal, CSV and HTML.

Every table is a :class:`ReportTable`: a file-friendly ``name``, a ``title``, its columns and
rows of strings. Formatting rules, the same in every output: USD with the precision the amount
needs, :func:`~autoscaler.accounting.costs.usd_for_display` (to the cent from a dollar up,
``12.34``; three significant digits below, ``0.0153``), and the total once more to the cent as a
bill shows it (:func:`~autoscaler.accounting.costs.usd_to_cents`); hours to 3 decimals, percentages
to 1, counts as integers, samples per USD to 4 significant digits; an unknown value is an empty
cell.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoscaler.accounting.churn import IDLE_CAUSES, ChurnFigures
from autoscaler.accounting.costs import (
    CostRecord,
    CostSummary,
    JobCost,
    OfferingCost,
    job_costs,
    offering_costs,
    summarize,
    usd_for_display,
    usd_to_cents,
)
from autoscaler.accounting.report.source import RunFloor

__all__ = [
    "CHURN_CAPTION",
    "FLOOR_CAPTION",
    "ReportColumn",
    "ReportTable",
    "churn_table",
    "floor_table",
    "fmt_cents",
    "fmt_count",
    "fmt_hours",
    "fmt_percent",
    "fmt_rate",
    "fmt_usd",
    "jobs_table",
    "offerings_table",
    "report_tables",
    "summary_rows",
    "summary_table",
]

_S_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ReportColumn:
    """A column: its header (with the unit) and whether it holds numbers (right-aligned)."""

    header: str
    numeric: bool = True


@dataclass(frozen=True)
class ReportTable:
    """One table of the report. ``name`` is used for file names (``jobs.csv``)."""

    name: str
    title: str
    columns: tuple[ReportColumn, ...]
    rows: tuple[tuple[str, ...], ...]


def fmt_usd(usd: float | None) -> str:
    """USD with the precision the amount needs
    (:func:`~autoscaler.accounting.costs.usd_for_display`)."""
    return "" if usd is None else str(usd_for_display(usd))


def fmt_cents(usd: float | None) -> str:
    """USD to the cent, as a bill shows it (:func:`~autoscaler.accounting.costs.usd_to_cents`)."""
    return "" if usd is None else str(usd_to_cents(usd))


def fmt_hours(hours: float | None) -> str:
    return "" if hours is None else f"{hours:.3f}"


def fmt_percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{100.0 * fraction:.1f}"


def fmt_count(count: float | None) -> str:
    return "" if count is None else f"{count:.0f}"


def fmt_rate(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def summary_rows(summary: CostSummary) -> tuple[tuple[str, str], ...]:
    """(figure with its unit, value) pairs, in reading order."""
    savings_pct = None
    if summary.savings_usd is not None and summary.ondemand_usd:
        savings_pct = summary.savings_usd / summary.ondemand_usd
    idle_share = summary.idle_usd / summary.total_usd if summary.total_usd > 0 else None
    return (
        ("total cost (USD)", fmt_usd(summary.total_usd)),
        ("total billed, to the cent (USD)", fmt_cents(summary.total_usd)),
        ("attributed to jobs (USD)", fmt_usd(summary.attributed_usd)),
        ("idle (USD)", fmt_usd(summary.idle_usd)),
        ("idle share of cost (%)", fmt_percent(idle_share)),
        ("of idle: minimum billing (USD)", fmt_usd(summary.shortfall_usd)),
        ("on-demand equivalent (USD)", fmt_usd(summary.ondemand_usd)),
        ("savings vs on-demand (USD)", fmt_usd(summary.savings_usd)),
        ("savings vs on-demand (%)", fmt_percent(savings_pct)),
        ("run length (h)", fmt_hours(summary.closed_s / _S_PER_HOUR)),
        ("instances launched", fmt_count(summary.instances)),
        ("of which spot", fmt_count(summary.spot_instances)),
        ("instances preempted", fmt_count(summary.preempted_instances)),
        ("instance-hours", fmt_hours(summary.instance_hours)),
        ("fleet GPU-hours", fmt_hours(summary.gpu_hours)),
        ("job GPU-hours", fmt_hours(summary.used_gpu_hours)),
        ("GPU utilization (%)", fmt_percent(summary.utilization)),
        ("peak fleet (instances)", fmt_count(summary.peak_instances)),
        ("peak fleet (GPUs)", fmt_count(summary.peak_gpus)),
        ("peak cost rate (USD/h)", fmt_usd(summary.peak_usd_per_hour)),
        ("jobs", fmt_count(summary.jobs)),
        ("jobs finished", fmt_count(summary.finished_jobs)),
        ("job restarts", fmt_count(summary.restarts)),
        ("job preemptions", fmt_count(summary.preemptions)),
        ("useful samples", fmt_count(summary.useful_samples)),
        ("goodput (samples/USD)", fmt_rate(summary.samples_per_usd)),
    )


def summary_table(summary: CostSummary) -> ReportTable:
    return ReportTable(
        name="summary",
        title="Cost summary",
        columns=(ReportColumn("figure", numeric=False), ReportColumn("value")),
        rows=summary_rows(summary),
    )


def jobs_table(jobs: tuple[JobCost, ...]) -> ReportTable:
    """One row per job: GPU-hours, USD attributed, goodput per USD, restarts, preemptions,
    JCT (empty while unfinished)."""
    rows = tuple(
        (
            j.job_id,
            fmt_hours(j.gpu_hours),
            fmt_usd(j.cost_usd),
            fmt_count(j.useful_samples),
            fmt_rate(j.samples_per_usd),
            fmt_count(j.restarts),
            fmt_count(j.preemptions),
            fmt_hours(None if j.jct_s is None else j.jct_s / _S_PER_HOUR),
        )
        for j in jobs
    )
    columns = (
        ReportColumn("job", numeric=False),
        ReportColumn("GPU hours"),
        ReportColumn("cost (USD)"),
        ReportColumn("useful samples"),
        ReportColumn("samples per USD"),
        ReportColumn("restarts"),
        ReportColumn("preemptions"),
        ReportColumn("JCT (h)"),
    )
    return ReportTable("jobs", "Cost per job", columns, rows)


def offerings_table(offerings: tuple[OfferingCost, ...]) -> ReportTable:
    """One row per (offering, market): instances, preemptions, hours, USD, on-demand
    equivalent and savings (empty where no on-demand price was given)."""
    rows = []
    for o in offerings:
        pct = None
        if o.savings_usd is not None and o.ondemand_usd:
            pct = o.savings_usd / o.ondemand_usd
        rows.append(
            (
                o.offering_key,
                o.market,
                o.gpu_type,
                fmt_count(o.instances),
                fmt_count(o.preempted),
                fmt_hours(o.instance_hours),
                fmt_hours(o.gpu_hours),
                fmt_usd(o.cost_usd),
                fmt_usd(o.ondemand_usd),
                fmt_usd(o.savings_usd),
                fmt_percent(pct),
            )
        )
    columns = (
        ReportColumn("offering", numeric=False),
        ReportColumn("market", numeric=False),
        ReportColumn("GPU", numeric=False),
        ReportColumn("instances"),
        ReportColumn("preempted"),
        ReportColumn("instance hours"),
        ReportColumn("GPU hours"),
        ReportColumn("cost (USD)"),
        ReportColumn("on-demand (USD)"),
        ReportColumn("savings (USD)"),
        ReportColumn("savings (%)"),
    )
    return ReportTable("offerings", "Cost per offering and market", columns, tuple(rows))


def report_tables(record: CostRecord) -> tuple[ReportTable, ReportTable, ReportTable]:
    """The summary, per-job and per-offering tables of a record."""
    return (
        summary_table(summarize(record)),
        jobs_table(job_costs(record)),
        offerings_table(offering_costs(record)),
    )


FLOOR_CAPTION = (
    "floor (a): no time limit; (b): every job by its finish time in the run; "
    "an application's cost: USD attributed to its jobs"
)


def floor_table(floor: RunFloor) -> ReportTable:
    """A simulated run's cost floors (:mod:`autoscaler.analysis.floor`): (a) no time limit, (b)
    every job by its finish time in the run, the cost and cost / floor, for the run and per
    application (an application's cost: the USD attributed to its jobs)."""

    def over(cost: float, usd: float) -> str:
        r = RunFloor.ratio(cost, usd)
        return "" if r is None else f"{r:.2f}"

    rows = [("run", floor.floor_usd, floor.floor_at_jct_usd, floor.cost_usd)]
    rows += [
        (app, a["floor_usd"], a["floor_at_jct_usd"], a["cost_usd"])
        for app, a in sorted(floor.per_application.items())
    ]
    return ReportTable(
        name="floor",
        title="Cost floor",
        columns=(
            ReportColumn("run or application", numeric=False),
            ReportColumn("floor (a) USD"),
            ReportColumn("floor (b) USD"),
            ReportColumn("cost USD"),
            ReportColumn("cost / (a)"),
            ReportColumn("cost / (b)"),
        ),
        rows=tuple(
            (name, fmt_usd(a), fmt_usd(b), fmt_usd(cost), over(cost, a), over(cost, b))
            for name, a, b, cost in rows
        ),
    )


CHURN_CAPTION = (
    "idle by cause: boot = launch to its first job; drain = drain decision to its end; "
    "empty ready = no job after its first; fragmentation = free GPUs beside a job; "
    "minimum billing = billed past its life"
)


def churn_table(churn: ChurnFigures) -> ReportTable:
    """A run's churn (:mod:`autoscaler.accounting.churn`): launches, boots billed, restarts per
    job, reversals, then the idle cost by cause with its share of the idle total."""
    idle = churn.idle_usd
    batch = churn.reversals_by_kind.get("batch")
    rows: list[tuple[str, str, str]] = [
        ("launches", str(churn.launches), ""),
        (
            "boots billed",
            str(churn.boots_billed),
            f"{fmt_usd(churn.idle_usd_by_cause.get('boot'))} USD idle before a first job",
        ),
        ("restarts per job", f"{churn.restarts_per_job:.2f}", ""),
        (
            "reversals",
            str(churn.reversals),
            ", ".join(f"{k} {v}" for k, v in churn.reversals_by_kind.items() if v is not None)
            + ("" if batch is not None else " (batch: no history kept)"),
        ),
    ]
    for cause in IDLE_CAUSES:
        usd = churn.idle_usd_by_cause.get(cause, 0.0)
        share = f"{usd / idle:.0%} of idle" if idle > 0 else ""
        rows.append((f"idle: {cause.replace('_', ' ')}", fmt_usd(usd), share))
    return ReportTable(
        name="churn",
        title="Churn",
        columns=(
            ReportColumn("figure", numeric=False),
            ReportColumn("value"),
            ReportColumn("detail", numeric=False),
        ),
        rows=tuple(rows),
    )
