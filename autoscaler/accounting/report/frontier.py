"""Cost-time frontiers as one self-contained HTML page (``coadapt cost report FILE --format
html`` on the JSON of ``benchmarks/cloud_cost.py --frontier``).

The page holds one plot, cost (USD) against mean JCT (s), one line per fleet through all its
points by mean JCT (its full curve; each marker labelled with its knob, ``min_efficiency``; the
JCT axis logarithmic when the points span more than :data:`LOG_X_ABOVE` times), the points
another point of the same fleet dominates (:func:`autoscaler.analysis.frontier.dominated`) drawn
hollow, and, where the input carries it, each fleet's floor ``floor_at_jct_usd`` (what the
cheapest fleet could pay at that mean JCT) as a dotted line of the same colour; then a table of
the points (each marked on the frontier or dominated), where the input has it how each fleet's
knob sweep ended at each end (``sweep.fleets``: flat, on the knob's range, stopped), and the
frontier checks (:func:`autoscaler.analysis.frontier.check_frontiers`). The plot is inline SVG
drawn by matplotlib with its text as ``<text>`` (so a browser and a test can read the title,
the axes and the legend), each fleet's line in a group ``id="frontier-<fleet>"``, its hollow
markers in ``id="dominated-<fleet>"`` (only where it has a dominated point) and its floor in
``id="floor-<fleet>"``. No script, no link, nothing from the network.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.accounting.report.html import html_page
from autoscaler.analysis.frontier import FrontierPoint, dominated, points_from_json
from autoscaler.errors import InvalidInputError
from coadapt_common.atomic import write_text_atomic

__all__ = [
    "Frontiers",
    "frontiers_from_json",
    "is_frontier_payload",
    "plot_frontiers_svg",
    "render_frontier_html",
    "series_id",
    "write_frontier_html",
]

MAX_FLEETS = 32
"""Fleets a frontier file may hold."""

LOG_X_ABOVE = 4.0
"""The mean-JCT axis is logarithmic when the slowest point is more than this many times the
fastest."""


@dataclass(frozen=True)
class Frontiers:
    """Parsed frontier JSON: per fleet its points (in the file's order), per fleet its floor as
    (mean JCT s, USD) pairs (empty when the input has none), the checks as written, and the
    sweep's ends per fleet as written (``sweep.fleets``; ``None`` without one)."""

    points: Mapping[str, Sequence[FrontierPoint]]
    floors: Mapping[str, Sequence[tuple[float, float]]]
    checks: Mapping[str, Any] | None
    experiment: str | None
    sweep: Mapping[str, Any] | None = None

    def dominated(self, fleet: str) -> list[FrontierPoint]:
        """``fleet``'s points another of its points dominates
        (:func:`autoscaler.analysis.frontier.dominated`), by mean JCT."""
        return dominated(self.points[fleet])


def is_frontier_payload(payload: object) -> bool:
    """Whether parsed JSON is a frontier file (an object with a ``"frontier"`` key)."""
    return isinstance(payload, Mapping) and "frontier" in payload


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    v = float(value)
    return v if v == v and abs(v) != float("inf") and v >= 0 else None


def frontiers_from_json(payload: object) -> Frontiers:
    """The :class:`Frontiers` of ``{"frontier": {fleet: [points]}, ...}``. A point's floor is its
    ``floor_at_jct_usd``; without one, a fleet's floor is ``strategies[fleet]
    ["floor_at_jct_usd"]`` at ``strategies[fleet]["mean_jct_s"]`` where both are numbers.
    Raises :class:`~autoscaler.errors.InvalidInputError` naming the path when malformed."""
    if not is_frontier_payload(payload):
        raise InvalidInputError("no frontier: expected an object with 'frontier'", field=None)
    assert isinstance(payload, Mapping)
    raw = payload["frontier"]
    if not isinstance(raw, Mapping) or not raw:
        raise InvalidInputError("frontier: expected an object of fleets", field="frontier")
    if len(raw) > MAX_FLEETS:
        raise InvalidInputError(f"frontier: more than {MAX_FLEETS} fleets", field="frontier")
    points: dict[str, list[FrontierPoint]] = {}
    floors: dict[str, list[tuple[float, float]]] = {}
    strategies = payload.get("strategies")
    for name, items in raw.items():
        if not isinstance(name, str) or not 0 < len(name) <= 100:
            raise InvalidInputError("frontier: fleet names are 1-100 characters", field="frontier")
        points[name] = points_from_json(items, f"frontier.{name}")
        floor = []
        for item, p in zip(items, points[name], strict=True):
            usd = _number(item.get("floor_at_jct_usd"))
            if usd is not None:
                floor.append((p.mean_jct_s, usd))
        if not floor and isinstance(strategies, Mapping):
            s = strategies.get(name)
            if isinstance(s, Mapping):
                usd, jct = _number(s.get("floor_at_jct_usd")), _number(s.get("mean_jct_s"))
                if usd is not None and jct is not None:
                    floor.append((jct, usd))
        floors[name] = sorted(floor)
    checks = payload.get("frontier_checks")
    experiment = payload.get("experiment")
    sweep = payload.get("sweep")
    fleets = sweep.get("fleets") if isinstance(sweep, Mapping) else None
    return Frontiers(
        points,
        floors,
        checks if isinstance(checks, Mapping) else None,
        experiment if isinstance(experiment, str) else None,
        fleets if isinstance(fleets, Mapping) else None,
    )


def series_id(kind: str, fleet: str) -> str:
    """The SVG id of a fleet's line (``kind`` ``frontier``, ``dominated`` or ``floor``)."""
    return f"{kind}-" + (re.sub(r"[^A-Za-z0-9_-]+", "-", fleet).strip("-") or "fleet")


def plot_frontiers_svg(frontiers: Frontiers) -> str:
    """SVG text (no XML prolog): the plot of the module docstring."""
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "coadapt-frontier"}):
        fig = Figure(figsize=(8.0, 4.6), dpi=100, layout="constrained")
        FigureCanvasSVG(fig)
        ax = fig.add_subplot()
        colors = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
        for n, (name, pts) in enumerate(frontiers.points.items()):
            color = colors[n % len(colors)]
            ordered = sorted(pts, key=lambda p: (p.mean_jct_s, p.knob))
            (line,) = ax.plot(
                [p.mean_jct_s for p in ordered],
                [p.cost_usd for p in ordered],
                marker="o",
                color=color,
                label=name,
            )
            line.set_gid(series_id("frontier", name))
            dominated = frontiers.dominated(name)
            if dominated:  # hollow over the filled markers: another point beats each
                (hollow,) = ax.plot(
                    [p.mean_jct_s for p in dominated],
                    [p.cost_usd for p in dominated],
                    linestyle="none",
                    marker="o",
                    markersize=7,
                    markerfacecolor="white",
                    markeredgecolor=color,
                    markeredgewidth=1.5,
                    label=f"{name} dominated",
                )
                hollow.set_gid(series_id("dominated", name))
            for p in ordered:
                ax.annotate(
                    f"{p.knob:g}",
                    (p.mean_jct_s, p.cost_usd),
                    textcoords="offset points",
                    xytext=(4, 4),
                    fontsize="x-small",
                    color=color,
                )
            floor = frontiers.floors.get(name) or ()
            if floor:
                (fl,) = ax.plot(
                    [x for x, _ in floor],
                    [y for _, y in floor],
                    linestyle=":",
                    marker="v",
                    color=color,
                    label=f"{name} floor",
                )
                fl.set_gid(series_id("floor", name))
        jcts = [p.mean_jct_s for pts in frontiers.points.values() for p in pts]
        wide = min(jcts) > 0 and max(jcts) / min(jcts) > LOG_X_ABOVE
        if wide:  # fleets an order of magnitude apart: the close ones stay readable
            ax.set_xscale("log")
        ax.set_xlabel("mean JCT (s, log scale)" if wide else "mean JCT (s)")
        ax.set_ylabel("cost (USD)")
        ax.set_title(
            "Cost against mean JCT, one line per fleet (labels: min_efficiency; hollow: dominated)"
        )
        if not wide:
            ax.set_xlim(left=0.0)
        ax.set_ylim(bottom=0.0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper right", fontsize="small")
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg") :]


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 72rem; color: #222;
       padding: 0 1rem; }
h1 { font-size: 1.6rem; } h2 { margin-top: 2rem; border-bottom: 1px solid #ccc; }
figure { margin: 1rem 0; } figure svg { max-width: 100%; height: auto; }
figcaption, .note { font-size: 0.85rem; color: #555; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.85rem; }
.scroll { overflow-x: auto; max-width: 100%; }
caption { text-align: left; font-weight: 600; padding: 0.3rem 0; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.fail { color: #a00; font-weight: 600; }
td.dominated { color: #777; font-style: italic; }
"""


def _points_table(frontiers: Frontiers) -> str:
    rows = []
    for name, pts in frontiers.points.items():
        dominated = {id(p) for p in frontiers.dominated(name)}
        for p in sorted(pts, key=lambda p: p.knob):
            where = (
                '<td class="dominated">dominated</td>'
                if id(p) in dominated
                else "<td>frontier</td>"
            )
            rows.append(
                f"<tr><td>{html.escape(name)}</td><td class=num>{p.knob:g}</td>"
                f"<td class=num>{p.cost_usd:,.2f}</td><td class=num>{p.mean_jct_s:,.0f}</td>"
                f"{where}</tr>"
            )
    return (
        '<div class="scroll"><table data-table="frontier-points"><caption>Points</caption>'
        "<thead><tr><th>fleet</th><th>min_efficiency</th><th>cost (USD)</th>"
        "<th>mean JCT (s)</th><th>on its frontier</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


_END_WORDS = {
    "flat": "flat",
    "range": "knob's range exhausted",
    "stopped": "stopped before flat",
    "open": "open",
}


def _end_cell(end: object) -> str:
    """One end of a fleet's sweep as written (input: what is missing or malformed shows '-')."""
    if not isinstance(end, Mapping):
        return "<td>-</td>"
    status = end.get("status")
    word = _END_WORDS.get(status, "-") if isinstance(status, str) else "-"
    knobs = end.get("knobs")
    pair = [k for k in knobs if _number(k) is not None] if isinstance(knobs, list) else []
    change = _number(end.get("change"))
    detail = ""
    if len(pair) == 2 and change is not None:
        axis = "cost" if end.get("axis") == "cost_usd" else "mean JCT"
        detail = f" ({axis} {100 * change:.2f}% apart at {pair[0]:g} and {pair[1]:g})"
    css = "" if status == "flat" else ' class="fail"'
    return f"<td><span{css}>{html.escape(word)}</span>{html.escape(detail)}</td>"


def _sweep_table(sweep: Mapping[str, Any]) -> str:
    rows = []
    for name, fleet in sweep.items():
        if not isinstance(fleet, Mapping):
            continue
        runs = fleet.get("runs")
        rows.append(
            f"<tr><td>{html.escape(str(name))}</td>"
            f"<td class=num>{runs if isinstance(runs, int) else '-'}</td>"
            f"{_end_cell(fleet.get('fast'))}{_end_cell(fleet.get('cheap'))}</tr>"
        )
    return (
        '<div class="scroll"><table data-table="frontier-sweep"><caption>How each sweep ended'
        "</caption><thead><tr><th>fleet</th><th>knobs run</th><th>fast end (mean JCT)</th>"
        f"<th>cheap end (cost)</th></tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _verdict(holds: object) -> str:
    return "holds" if holds is True else '<span class="fail">fails</span>'


def _checks_table(checks: Mapping[str, Any]) -> str:
    """The checks as written by ``check_frontiers``; a part missing or malformed is shown as
    '-' (the file is input, not trusted to be complete)."""
    ref = html.escape(str(checks.get("reference", "?")))
    rows = []

    def part(key: str) -> Mapping[str, Any]:
        found = checks.get(key)
        return found if isinstance(found, Mapping) else {}

    reach, cheapest = part("reach"), part("cheapest")
    for name, dom in part("dominance").items():
        if not isinstance(dom, Mapping):
            continue
        ratios = []
        points = dom.get("points")
        for p in points if isinstance(points, list) else ():
            if not isinstance(p, Mapping):
                continue
            jct, ratio = (_number(p.get(k)) for k in ("mean_jct_s", "cost_ratio"))
            if jct is not None and ratio is not None:
                ratios.append(f"{jct:,.0f} s: {ratio:.3f}")
        r, c = reach.get(name, {}), cheapest.get(name, {})
        rows.append(
            f"<tr><td>{html.escape(str(name))}</td><td>{_verdict(dom.get('holds'))} "
            f"({html.escape('; '.join(ratios)) or 'no point in range'})</td>"
            f"<td>{_end_verdict(r, 'jct_ratio')}</td>"
            f"<td>{_end_verdict(c, 'cost_ratio')}</td></tr>"
        )
    tolerance = _number(checks.get("tolerance"))
    within = f" (within {100 * tolerance:g}%)" if tolerance else ""
    return (
        f'<div class="scroll"><table data-table="frontier-checks"><caption>{ref} against each '
        "fleet</caption><thead><tr><th>fleet</th><th>cheaper at its points in range "
        f"({ref} cost / its cost)</th><th>{ref}'s fastest mean JCT{within}: "
        f"{ref}'s / its</th><th>{ref}'s cheapest cost{within}: {ref}'s / its</th></tr>"
        f"</thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _end_verdict(check: object, ratio_key: str) -> str:
    if not isinstance(check, Mapping):
        return "-"
    ratio = _number(check.get(ratio_key))
    return _verdict(check.get("holds")) + ("" if ratio is None else f" ({ratio:.3f})")


def render_frontier_html(
    frontiers: Frontiers, *, title: str = "coadapt cost-time frontiers"
) -> str:
    """The page of the module docstring."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if frontiers.experiment:
        body.append(f'<p class="note">Experiment {html.escape(frontiers.experiment)}.</p>')
    body.append(
        '<figure data-plot="frontiers">'
        + plot_frontiers_svg(frontiers)
        + "<figcaption>Each fleet run at several settings of its knob (SizingConfig."
        "min_efficiency, labelled at its point): total cost of the workloads against the mean "
        "over workloads of their mean JCT, the line through all of a fleet's points by mean "
        "JCT; hollow: a point another of the same fleet's beats on both. Dotted: the floor at "
        "that mean JCT, where the input has one.</figcaption></figure>"
    )
    body.append(_points_table(frontiers))
    if frontiers.sweep is not None:
        body.append(_sweep_table(frontiers.sweep))
    if frontiers.checks is not None:
        body.append("<h2>Checks</h2>")
        body.append(
            '<p class="note">Cheaper: at every point of a fleet whose mean JCT lies in the '
            "reference's range, the reference's frontier (linear between its undominated "
            "points) costs less.</p>"
        )
        body.append(_checks_table(frontiers.checks))
    return html_page(title, body, css=_CSS)


def write_frontier_html(
    path: str | Path, frontiers: Frontiers, *, title: str = "coadapt cost-time frontiers"
) -> None:
    """Write :func:`render_frontier_html` to ``path`` atomically."""
    write_text_atomic(path, render_frontier_html(frontiers, title=title))
