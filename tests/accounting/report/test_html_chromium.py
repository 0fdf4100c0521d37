"""The HTML cost report opened in headless Chromium (Debian's ``chromium`` package).

The page is loaded from a file:// URL with the network shut off as far as flags allow; the DOM
Chromium builds is dumped and checked: the totals are there, the three plots are ``<img>``
elements holding PNG data of a real size. A probe copy of the page (the same page plus a script
that writes each image's decoded size into the DOM on ``load``) shows that the browser itself
decoded the three images. Skipped only where no Chromium binary exists.
"""

from __future__ import annotations

import base64
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from autoscaler.accounting.report.html import write_html
from tests.accounting.report.conftest import build_record

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
)

PROBE = """
<script>
window.addEventListener("load", () => {
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = Array.from(document.images)
    .map((img) => `${img.dataset.plot}:${img.complete}:${img.naturalWidth}x${img.naturalHeight}`)
    .join("\\n");
  document.body.appendChild(out);
});
</script>
"""


def _chromium() -> str:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    pytest.skip("no chromium binary (apt-get install chromium); the page is checked without it")


def _dump_dom(binary: str, page: Path, profile: Path) -> str:
    cmd = [binary, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.mark.slow
def test_html_report_in_headless_chromium(tmp_path: Path) -> None:
    binary = _chromium()
    page = tmp_path / "report.html"
    write_html(page, [("coadapt / spot-first", build_record())], title="Cost report test")
    dom = _dump_dom(binary, page, tmp_path / "profile")

    assert "Total cost: 3.95 USD" in dom
    assert re.search(r'data-figure="total-usd">3\.95 USD<', dom)
    assert 'data-table="jobs"' in dom and "train-4" in dom
    images = re.findall(
        r'<img [^>]*data-plot="([^"]+)"[^>]*src="data:image/png;base64,([^"]+)"', dom
    )
    assert [name for name, _ in images] == ["cost-over-time", "fleet-size", "job-cost-vs-jct"]
    for _, data in images:
        png = base64.b64decode(data)
        assert len(png) > 5_000
        width, height = _png_size(png)
        assert width >= 400 and height >= 200

    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    dom = _dump_dom(binary, probe, tmp_path / "profile-probe")
    match = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert match, "the probe script did not run"
    decoded = match.group(1).split("\n")
    assert len(decoded) == 3
    for line in decoded:
        _, complete, size = line.split(":")
        width, height = map(int, size.split("x"))
        assert complete == "true" and width >= 400 and height >= 200
