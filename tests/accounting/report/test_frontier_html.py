"""The cost-time frontier page (autoscaler.accounting.report.frontier): parsing the benchmark's
JSON, the SVG plot (title, axes with units, legend, one line per fleet with a marker per point,
floors), ``coadapt cost report FILE --format html`` on it, and the page in headless Chromium (the
browser lays out every series with a real size)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoscaler.accounting.report.frontier import (
    frontiers_from_json,
    plot_frontiers_svg,
    render_frontier_html,
    series_id,
)
from autoscaler.analysis.frontier import check_frontiers
from autoscaler.cli.main import app
from autoscaler.errors import InvalidInputError
from tests.accounting.report.test_html_chromium import FLAGS, _chromium

runner = CliRunner()


def _payload(floors: bool = False, dominated: bool = False, sweep: bool = False) -> dict:
    frontier = {
        "coadapt": [
            {"knob": 0.15, "cost_usd": 371.5, "mean_jct_s": 382.0},
            {"knob": 0.3, "cost_usd": 307.0, "mean_jct_s": 419.0},
            {"knob": 0.7, "cost_usd": 280.0, "mean_jct_s": 610.0},
        ],
        "coadapt-v100": [
            {"knob": 0.15, "cost_usd": 344.6, "mean_jct_s": 760.0},
            {"knob": 0.7, "cost_usd": 300.0, "mean_jct_s": 1100.0},
        ],
        "coadapt-a100": [
            {"knob": 0.15, "cost_usd": 373.9, "mean_jct_s": 370.0},
            {"knob": 0.7, "cost_usd": 290.0, "mean_jct_s": 500.0},
        ],
    }
    if dominated:  # slower and dearer than knob 0.7's point; and a dearer twin of 0.15's JCT
        frontier["coadapt-v100"].insert(1, {"knob": 0.5, "cost_usd": 320.0, "mean_jct_s": 1150.0})
        frontier["coadapt-v100"].insert(0, {"knob": 0.05, "cost_usd": 350.0, "mean_jct_s": 760.0})
    if floors:
        for pts in frontier.values():
            for p in pts:
                p["floor_at_jct_usd"] = 0.8 * p["cost_usd"]
    from autoscaler.analysis.frontier import points_from_json

    checks = check_frontiers({k: points_from_json(v) for k, v in frontier.items()}, "coadapt")
    out = {"experiment": "E3", "frontier": frontier, "frontier_checks": checks}
    if sweep:
        out["sweep"] = {
            "mode": "auto",
            "fleets": {
                "coadapt": {
                    "runs": 3,
                    "fast": {
                        "status": "range",
                        "axis": "mean_jct_s",
                        "knobs": [0.15, 0.3],
                        "change": 0.0969,
                    },
                    "cheap": {
                        "status": "flat",
                        "axis": "cost_usd",
                        "knobs": [0.7, 0.3],
                        "change": 0.0064,
                    },
                },
                "coadapt-v100": {"runs": 2, "fast": "x", "cheap": {"status": 3}},
                "coadapt-a100": 7,
            },
        }
    return out


def _groups(svg: str) -> dict[str, str]:
    """Each ``<g id="...">`` group's text up to its closing tag (matplotlib does not nest a
    line's groups)."""
    return {m.group(1): m.group(2) for m in re.finditer(r'<g id="([^"]+)">(.*?)</g>', svg, re.S)}


def test_frontiers_from_json_reads_points_floors_and_checks() -> None:
    got = frontiers_from_json(_payload(floors=True))
    assert list(got.points) == ["coadapt", "coadapt-v100", "coadapt-a100"]
    assert [p.knob for p in got.points["coadapt"]] == [0.15, 0.3, 0.7]
    assert got.floors["coadapt-v100"] == [(760.0, pytest.approx(275.68)), (1100.0, 240.0)]
    assert got.checks is not None and got.experiment == "E3"
    # Without per-point floors, a strategy-level one is taken at its mean JCT.
    plain = _payload()
    plain["strategies"] = {"coadapt": {"floor_at_jct_usd": 250.0, "mean_jct_s": 400.0}}
    got = frontiers_from_json(plain)
    assert got.floors["coadapt"] == [(400.0, 250.0)] and got.floors["coadapt-v100"] == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"runs": []}, None),
        ({"frontier": []}, "frontier"),
        ({"frontier": {}}, "frontier"),
        ({"frontier": {"a": []}}, "frontier.a"),
        ({"frontier": {"a": [{"knob": 1, "cost_usd": -2, "mean_jct_s": 1}]}}, "frontier.a[0]"),
        ({"frontier": {"x" * 101: [{"knob": 1, "cost_usd": 2, "mean_jct_s": 1}]}}, "frontier"),
    ],
)
def test_frontiers_from_json_refuses_malformed_input(payload, field) -> None:
    with pytest.raises(InvalidInputError) as e:
        frontiers_from_json(payload)
    assert (e.value.field or "").startswith(field or "")
    assert e.value.field == field or (field and e.value.field.startswith(field + "."))


def test_plot_has_title_axes_legend_and_one_line_per_fleet() -> None:
    svg = plot_frontiers_svg(frontiers_from_json(_payload(floors=True)))
    assert svg.startswith("<svg")
    for text in (
        "Cost against mean JCT, one line per fleet (labels: min_efficiency; hollow: dominated)",
        "mean JCT (s)",
        "cost (USD)",
        "coadapt-v100 floor",
    ):
        assert f">{text}<" in svg or f"{text}</text>" in svg, text
    groups = _groups(svg)
    for fleet, n in (("coadapt", 3), ("coadapt-v100", 2), ("coadapt-a100", 2)):
        line = groups[series_id("frontier", fleet)]
        assert line.count("<use ") == n  # one marker per point
        step = r"\s*L [0-9.]+ [0-9.]+"
        assert re.search(r'<path d="M [0-9.]+ [0-9.]+(' + step + "){" + str(n - 1) + r'}\s*"', line)
        assert series_id("floor", fleet) in groups
    # The knob labels are drawn at the points.
    assert svg.count(">0.15<") == 3 and svg.count(">0.3<") == 1
    # Every point is on its fleet's frontier here: nothing hollow.
    assert "dominated-" not in svg
    # No floors in the input: no floor lines.
    assert "floor-" not in plot_frontiers_svg(frontiers_from_json(_payload()))
    # Points ten times apart in JCT: a log axis, said in its label.
    wide = _payload()
    wide["frontier"]["coadapt-t4"] = [{"knob": 0.15, "cost_usd": 840.0, "mean_jct_s": 3240.0}]
    svg = plot_frontiers_svg(frontiers_from_json(wide))
    assert ">mean JCT (s, log scale)<" in svg and ">mean JCT (s)<" not in svg


def test_plot_draws_the_full_curve_and_marks_dominated_points_hollow() -> None:
    frontiers = frontiers_from_json(_payload(dominated=True))
    assert [p.knob for p in frontiers.dominated("coadapt-v100")] == [0.05, 0.5]
    assert frontiers.dominated("coadapt") == []
    svg = plot_frontiers_svg(frontiers)
    groups = _groups(svg)
    # The line runs through all four points of all-V100, by mean JCT, dominated ones included.
    line = groups[series_id("frontier", "coadapt-v100")]
    assert line.count("<use ") == 4
    path = re.search(r'<path d="([^"]+)"', line).group(1)
    xs = [float(x) for x in re.findall(r"[ML] ([0-9.]+) [0-9.]+", path)]
    assert len(xs) == 4 and xs == sorted(xs)
    # The two dominated points again, hollow (white fill), in their own group; no other fleet
    # has one.
    hollow = groups[series_id("dominated", "coadapt-v100")]
    assert hollow.count("<use ") == 2
    assert "fill: #ffffff" in hollow
    assert {g for g in groups if g.startswith("dominated-")} == {"dominated-coadapt-v100"}
    assert ">coadapt-v100 dominated<" in svg
    # The table says which points are dominated, by knob.
    page = render_frontier_html(frontiers)
    table = re.search(r'data-table="frontier-points".*?</table>', page, re.S).group(0)
    rows = re.findall(
        r"<tr><td>coadapt-v100</td><td class=num>([0-9.]+)</td>.*?<td[^>]*>(\w+)</td></tr>", table
    )
    assert rows == [
        ("0.05", "dominated"),
        ("0.15", "frontier"),
        ("0.5", "dominated"),
        ("0.7", "frontier"),
    ]


def test_page_says_how_each_sweep_ended() -> None:
    page = render_frontier_html(frontiers_from_json(_payload(sweep=True)))
    table = re.search(r'data-table="frontier-sweep".*?</table>', page, re.S)
    assert table is not None
    coadapt = re.search(r"<tr><td>coadapt</td>(.*?)</tr>", table.group(0)).group(1)
    assert "knob&#x27;s range exhausted" in coadapt
    assert "mean JCT 9.69% apart at 0.15 and 0.3" in coadapt
    assert "flat</span> (cost 0.64% apart at 0.7 and 0.3)" in coadapt
    # The sweep is input: malformed ends show '-', a malformed fleet is left out.
    v100 = re.search(r"<tr><td>coadapt-v100</td>(.*?)</tr>", table.group(0)).group(1)
    assert v100.count("<td>-</td>") == 1 and v100.count(">-</span>") == 1
    assert "<tr><td>coadapt-a100</td>" not in table.group(0)
    # Without a sweep in the input: no such table.
    assert "frontier-sweep" not in render_frontier_html(frontiers_from_json(_payload()))


def test_page_has_points_and_checks_tables() -> None:
    page = render_frontier_html(frontiers_from_json(_payload()))
    assert 'data-table="frontier-points"' in page and 'data-table="frontier-checks"' in page
    # Nothing fetched: no script, no link or source but the page's own (#...) ones.
    assert "<script" not in page and not re.search(r'(?:src|href)="(?!#)', page)
    checks = re.search(r'data-table="frontier-checks".*?</table>', page, re.S)
    assert checks is not None
    # All-A100 reaches 370 s, coadapt 382 s: reach fails against it, shown as such.
    a100_row = re.search(r"<tr><td>coadapt-a100</td>(.*?)</tr>", checks.group(0)).group(1)
    assert a100_row.count('class="fail"') >= 1
    # Checks are input too: malformed parts are left out, not a crash.
    bad = _payload()
    bad["frontier_checks"] = {"dominance": {"a": {"points": [1, {"mean_jct_s": "x"}]}, "b": 3}}
    page = render_frontier_html(frontiers_from_json(bad))
    assert "<tr><td>a</td><td><span" in page and "<tr><td>b</td>" not in page


def test_cli_cost_report_writes_the_frontier_page(tmp_path: Path) -> None:
    src = tmp_path / "frontier.json"
    src.write_text(json.dumps(_payload()))
    out = tmp_path / "frontier.html"
    done = runner.invoke(app, ["cost", "report", str(src), "--format", "html", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert 'data-plot="frontiers"' in out.read_text()
    done = runner.invoke(app, ["cost", "report", str(src), "--format", "table"])
    assert done.exit_code == 2 and "use --format html" in done.output
    src.write_text(json.dumps({"frontier": {"a": "x"}}))
    done = runner.invoke(app, ["cost", "report", str(src), "--format", "html", "--out", str(out)])
    assert done.exit_code == 2 and "frontier.a" in done.output


PROBE = """
<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  const lines = document.querySelectorAll(
    "svg g[id^=frontier-], svg g[id^=floor-], svg g[id^=dominated-]");
  out.textContent = Array.from(lines)
    .map((g) => {
      const b = g.getBBox();
      return `${g.id}:${Math.round(b.width)}x${Math.round(b.height)}`;
    })
    .join("\\n");
  document.body.appendChild(out);
});
</script>
"""


def test_frontier_page_in_headless_chromium(tmp_path: Path) -> None:
    import subprocess

    binary = _chromium()
    page = tmp_path / "probe.html"
    html = render_frontier_html(frontiers_from_json(_payload(floors=True, dominated=True)))
    page.write_text(html.replace("</body>", PROBE + "</body>"))
    cmd = [binary, *FLAGS, f"--user-data-dir={tmp_path / 'p'}", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    assert "Cost against mean JCT" in dom and "mean JCT (s)" in dom and "cost (USD)" in dom
    probe = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert probe, "the probe script did not run"
    boxes = dict(line.split(":") for line in probe.group(1).split("\n"))
    assert set(boxes) == {
        series_id(kind, fleet)
        for kind in ("frontier", "floor")
        for fleet in ("coadapt", "coadapt-v100", "coadapt-a100")
    } | {series_id("dominated", "coadapt-v100")}
    for name, size in boxes.items():
        width, height = map(int, size.split("x"))
        if name.startswith("dominated-"):
            # Two hollow markers at 760 s and 1150 s: apart on the JCT axis, each drawn.
            assert width > 20 and height > 3, (name, size)
        else:
            assert width > 20 and height > 5  # laid out across the axes, not collapsed
    assert "dominated" in dom  # the table's marking, as the browser shows it
