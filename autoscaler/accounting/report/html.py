"""A cost report as one self-contained HTML page.

The page holds, per record: the headline numbers, three plots (cumulative cost over time stacked
by offering, fleet size over time, and per-job cost against JCT) as base64 PNG ``<img>``
elements drawn with matplotlib's Agg renderer, and the report's tables. Everything is inline
(CSS included): no script, no font, no image and no link refers to the network or to another
file, so the page can be mailed or archived as is. With several records (e.g. one per policy),
an overview table compares them first.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoscaler.accounting.costs import (
    CostRecord,
    CostSummary,
    cumulative_cost_by_offering,
    fleet_series,
    job_costs,
    summarize,
)
from autoscaler.accounting.report.rows import (
    FLOOR_CAPTION,
    ReportTable,
    floor_table,
    fmt_hours,
    fmt_percent,
    fmt_rate,
    fmt_usd,
    report_tables,
)
from autoscaler.accounting.report.source import RunFloor
from coadapt_common.atomic import write_text_atomic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Report = tuple[str | None, CostRecord] | tuple[str | None, CostRecord, RunFloor | None]
"""One run of a report: its label, its cost record and, for a simulated run, its floors."""

__all__ = [
    "MAX_STACKED_OFFERINGS",
    "html_page",
    "plot_cost_over_time",
    "plot_fleet_size",
    "plot_job_cost_vs_jct",
    "render_html",
    "write_html",
]

MAX_STACKED_OFFERINGS = 8
"""Offerings drawn separately in the stacked cost plot; the cheaper rest are summed as one."""

_S_PER_HOUR = 3600.0
_FIG_SIZE_IN = (8.0, 3.4)
_DPI = 100

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222;
       padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2.5rem; border-bottom: 1px solid #ccc; }
.cards { display: flex; flex-wrap: wrap; gap: 0.75rem; margin: 1rem 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.5rem 0.9rem; min-width: 9rem; }
.card .k { font-size: 0.8rem; color: #555; } .card .v { font-size: 1.3rem; font-weight: 600; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; }
figcaption { font-size: 0.85rem; color: #555; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.85rem; }
.scroll { overflow-x: auto; max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; }
th { background: #f4f4f4; } td.num, th.num { text-align: right;
       font-variant-numeric: tabular-nums; }
.note { font-size: 0.85rem; color: #555; }
"""


def _figure() -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=_FIG_SIZE_IN, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)  # Agg, whatever the process-wide backend: no display needed
    return fig


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _time_unit(record: CostRecord) -> tuple[float, str]:
    """Seconds per unit of the time axes and its label: minutes for a run under two hours
    (a 2-minute demo reads 0-2 min, not 0.00-0.03 h), hours otherwise."""
    if record.closed_s < 2 * _S_PER_HOUR:
        return 60.0, "time (min)"
    return _S_PER_HOUR, "time (h)"


def plot_cost_over_time(record: CostRecord) -> bytes:
    """PNG: cumulative USD over time (minutes or hours, :func:`_time_unit`), stacked by
    offering key (at most :data:`MAX_STACKED_OFFERINGS` layers, the cheapest rest summed as
    "other")."""
    cumulative = cumulative_cost_by_offering(record)
    fig = _figure()
    ax = fig.add_subplot()
    unit_s, time_label = _time_unit(record)
    hours = [t / unit_s for t in cumulative.times_s]
    layers = sorted(
        zip(cumulative.offerings, cumulative.usd, strict=True), key=lambda kv: -kv[1][-1]
    )
    if len(layers) > MAX_STACKED_OFFERINGS:
        keep, rest = layers[: MAX_STACKED_OFFERINGS - 1], layers[MAX_STACKED_OFFERINGS - 1 :]
        summed = tuple(sum(col[n] for _, col in rest) for n in range(len(hours)))
        layers = [*keep, (f"other ({len(rest)} offerings)", summed)]
    if layers:
        ax.stackplot(hours, *(col for _, col in layers), labels=[k for k, _ in layers])
        ax.legend(loc="upper left", fontsize="x-small")
    else:
        ax.text(0.5, 0.5, "no instances", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(time_label)
    ax.set_ylabel("cumulative cost (USD)")
    ax.set_title("Cost over time, by offering")
    ax.set_xlim(0.0, max(hours[-1], 1e-9))
    ax.set_ylim(bottom=0.0)
    return _png(fig)


def plot_fleet_size(record: CostRecord) -> bytes:
    """PNG: GPUs and instances held over time (minutes or hours), as steps."""
    series = fleet_series(record)
    fig = _figure()
    ax = fig.add_subplot()
    unit_s, time_label = _time_unit(record)
    hours = [p.t_s / unit_s for p in series]
    ax.step(hours, [p.gpus for p in series], where="post", label="GPUs")
    ax.step(hours, [p.instances for p in series], where="post", label="instances")
    ax.set_xlabel(time_label)
    ax.set_ylabel("fleet size")
    ax.set_title("Fleet size over time")
    ax.set_xlim(0.0, max(hours[-1], 1e-9))
    ax.set_ylim(bottom=0.0)
    ax.legend(loc="upper right", fontsize="small")
    return _png(fig)


def plot_job_cost_vs_jct(record: CostRecord) -> bytes:
    """PNG: one point per finished job, JCT (minutes or hours, as :func:`_time_unit` picks for
    the run) against USD attributed; jobs that were preempted at least once are drawn
    apart."""
    jobs = [j for j in job_costs(record) if j.jct_s is not None]
    unit_s, time_label = _time_unit(record)
    fig = _figure()
    ax = fig.add_subplot()
    if jobs:
        for hit, label, marker in ((False, "never preempted", "o"), (True, "preempted", "x")):
            group = [j for j in jobs if (j.preemptions > 0) == hit]
            if group:
                xs = [(j.jct_s or 0.0) / unit_s for j in group]
                ax.scatter(xs, [j.cost_usd for j in group], marker=marker, label=label)
        ax.legend(loc="upper left", fontsize="small")
        top_h = max((j.jct_s or 0.0) for j in jobs) / unit_s
        ax.set_xlim(0.0, max(top_h * 1.08, 1e-9))  # room for the last point
        ax.set_ylim(0.0, max(max(j.cost_usd for j in jobs) * 1.1, 1e-9))
    else:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel(time_label.replace("time", "JCT"))
    ax.set_ylabel("cost attributed (USD)")
    ax.set_title("Cost per job vs job completion time")
    return _png(fig)


def _img(png: bytes, alt: str, caption: str, name: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return (
        f'<figure><img class="plot" data-plot="{name}" alt="{html.escape(alt)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}</figcaption>'
        "</figure>"
    )


def _table(table: ReportTable) -> str:
    if not table.rows:
        return f'<p class="note">{html.escape(table.title)}: none.</p>'
    head = "".join(
        f"<th{' class=num' if c.numeric else ''}>{html.escape(c.header)}</th>"
        for c in table.columns
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=num' if c.numeric else ''}>{html.escape(cell)}</td>"
            for c, cell in zip(table.columns, row, strict=True)
        )
        + "</tr>"
        for row in table.rows
    )
    return (
        f'<div class="scroll"><table data-table="{table.name}">'
        f"<caption>{html.escape(table.title)}</caption>"
        f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"
    )


def _cards(s: CostSummary) -> str:
    cards = [
        ("total cost", f"{fmt_usd(s.total_usd)} USD", "total-usd"),
        ("attributed to jobs", f"{fmt_usd(s.attributed_usd)} USD", "attributed-usd"),
        ("idle", f"{fmt_usd(s.idle_usd)} USD", "idle-usd"),
    ]
    if s.savings_usd is not None:
        cards.append(("savings vs on-demand", f"{fmt_usd(s.savings_usd)} USD", "savings-usd"))
    cards += [
        ("fleet GPU-hours", fmt_hours(s.gpu_hours), "gpu-hours"),
        ("GPU utilization", f"{fmt_percent(s.utilization) or '-'} %", "utilization"),
        ("goodput", f"{fmt_rate(s.samples_per_usd) or '-'} samples/USD", "samples-per-usd"),
    ]
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><div class="k">{html.escape(k)}</div>'
            f'<div class="v" data-figure="{key}">{html.escape(v)}</div></div>'
            for k, v, key in cards
        )
        + "</div>"
    )


def _section(n: int, label: str | None, record: CostRecord, floor: RunFloor | None = None) -> str:
    summary = summarize(record)
    heading = label or "Run"
    parts = [f'<section id="run-{n}" data-label="{html.escape(heading)}">']
    parts.append(f"<h2>{html.escape(heading)}</h2>")
    parts.append(
        f'<p class="total">Total cost: {fmt_usd(summary.total_usd)} USD over '
        f"{fmt_hours(summary.closed_s / _S_PER_HOUR)} h "
        f"({summary.instances} instances, {summary.jobs} jobs).</p>"
    )
    parts.append(_cards(summary))
    parts.append(
        _img(
            plot_cost_over_time(record),
            "cumulative cost over time, stacked by offering",
            "Cumulative cost by offering (minimum-billing charges appear at instance ends).",
            "cost-over-time",
        )
    )
    parts.append(
        _img(
            plot_fleet_size(record),
            "fleet size over time",
            "GPUs and instances held.",
            "fleet-size",
        )
    )
    parts.append(
        _img(
            plot_job_cost_vs_jct(record),
            "cost per job against job completion time",
            "Finished jobs: cost attributed (GPU share of their instances' price) against JCT.",
            "job-cost-vs-jct",
        )
    )
    if floor is not None:
        parts.append(_table(floor_table(floor)))
        parts.append(f'<p class="note">{html.escape(FLOOR_CAPTION)}.</p>')
    parts.extend(_table(t) for t in report_tables(record))
    parts.append("</section>")
    return "\n".join(parts)


def _overview(reports: Sequence[Report]) -> str:
    rows = []
    for n, (label, record, *_) in enumerate(reports, start=1):
        s = summarize(record)
        cells = (
            fmt_usd(s.total_usd),
            fmt_usd(s.idle_usd),
            fmt_usd(s.savings_usd),
            fmt_hours(s.gpu_hours),
            str(s.finished_jobs),
            fmt_rate(s.samples_per_usd),
        )
        name = html.escape(label or f"run {n}")
        rows.append(
            f'<tr><td><a href="#run-{n}">{name}</a></td>'
            + "".join(f'<td class="num">{c}</td>' for c in cells)
            + "</tr>"
        )
    head = "".join(
        f'<th class="num">{h}</th>'
        for h in (
            "total (USD)",
            "idle (USD)",
            "savings (USD)",
            "GPU-hours",
            "jobs finished",
            "samples/USD",
        )
    )
    return (
        '<div class="scroll"><table data-table="overview"><caption>Runs compared</caption>'
        f"<thead><tr><th>run</th>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def render_html(reports: Sequence[Report], *, title: str = "coadapt cost report") -> str:
    """The page for ``reports`` (``(label, record)`` or ``(label, record, floor)``: a simulated
    run's floors, shown as a table, or ``None``; in order); see the module docstring."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    body.append(
        '<p class="note">USD from exact sums, to the cent from one dollar up and to three '
        "significant digits below (ROUND_HALF_UP; the summary also gives the total to the "
        "cent, as billed); a job is charged its share of its instances' GPUs times their "
        "price while it held them; what no job held (free GPUs, provisioning, minimum "
        "billing) is idle cost.</p>"
    )
    if len(reports) > 1:
        body.append(_overview(reports))
    body.extend(
        _section(n, report[0], report[1], report[2] if len(report) > 2 else None)
        for n, report in enumerate(reports, start=1)
    )
    return html_page(title, body)


def html_page(title: str, body: Sequence[str], *, css: str | None = None) -> str:
    """A whole page: ``title``, the report's style sheet (or ``css``), ``body``'s parts."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_CSS if css is None else css}</style>"
        "</head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def write_html(
    path: str | Path,
    reports: Sequence[Report],
    *,
    title: str = "coadapt cost report",
) -> None:
    """Write :func:`render_html` to ``path`` atomically."""
    write_text_atomic(path, render_html(reports, title=title))
