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


def _payload(floors: bool = False) -> dict:
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
    if floors:
        for pts in frontier.values():
            for p in pts:
                p["floor_at_jct_usd"] = 0.8 * p["cost_usd"]
    from autoscaler.analysis.frontier import points_from_json

    checks = check_frontiers({k: points_from_json(v) for k, v in frontier.items()}, "coadapt")
    return {"experiment": "E3", "frontier": frontier, "frontier_checks": checks}


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
        "Cost against mean JCT, one line per fleet (labels: min_efficiency)",
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
    # No floors in the input: no floor lines.
    assert "floor-" not in plot_frontiers_svg(frontiers_from_json(_payload()))
    # Points ten times apart in JCT: a log axis, said in its label.
    wide = _payload()
    wide["frontier"]["coadapt-t4"] = [{"knob": 0.15, "cost_usd": 840.0, "mean_jct_s": 3240.0}]
    svg = plot_frontiers_svg(frontiers_from_json(wide))
    assert ">mean JCT (s, log scale)<" in svg and ">mean JCT (s)<" not in svg


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
  const lines = document.querySelectorAll("svg g[id^=frontier-], svg g[id^=floor-]");
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
    html = render_frontier_html(frontiers_from_json(_payload(floors=True)))
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
    }
    for size in boxes.values():
        width, height = map(int, size.split("x"))
        assert width > 20 and height > 5  # laid out across the axes, not collapsed
