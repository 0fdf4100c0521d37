"""The README starts right (issue 41): the two commands, then how to run your own jobs on this
machine, before any benchmark; every file it links exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
QUICK_START = "## Run your own jobs on this machine"


def _text() -> str:
    return README.read_text()


def test_the_two_commands_come_first_then_running_your_own_jobs() -> None:
    text = _text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks[0].strip().endswith(".venv/bin/coadapt demo"), blocks[0]
    assert "-m pytest" in blocks[1], blocks[1]
    headings = re.findall(r"^## .*$", text, re.M)
    assert headings[0] == QUICK_START, headings[:3]
    quick = text.split(QUICK_START, 1)[1].split("\n## ", 1)[0]
    for command in ("coadapt up", "coadapt submit", "coadapt status", "coadapt down"):
        assert command in quick, command
    assert "](docs/jobspec.md)" in quick


def test_no_table_comes_before_running_your_own_jobs() -> None:
    text = _text()
    first_table = re.search(r"^\|.*\|\n\|[-| ]+\|$", text, re.M)
    assert first_table is not None
    assert text.index(QUICK_START) < first_table.start()
    # the benchmarks' tables live in docs/benchmarks.md, linked from the README
    assert "](docs/benchmarks.md)" in text
    assert "| load | lengths | mean JCT vs pollux |" in (ROOT / "docs/benchmarks.md").read_text()


def test_every_file_the_readme_and_docs_link_exists() -> None:
    for page in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            assert (page.parent / target).exists(), f"{page.name} links {target}"
