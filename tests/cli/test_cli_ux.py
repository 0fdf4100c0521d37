"""What a user sees of the ``coadapt`` command line at 80 columns: help in one style, tables
that keep their key columns whole, one error style (``coadapt: <what>; <how to fix>``), no
traceback. Every case runs the real console script in a subprocess with ``COLUMNS=80``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from autoscaler.cli.main import app

MARKUP = re.compile(r":(class|func|mod|meth|data|attr):|`")


def _coadapt(
    *args: str, columns: int = 80, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("coadapt")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "autoscaler.cli"]
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def _no_traceback(out: subprocess.CompletedProcess[str]) -> None:
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "╭" not in text, text


def _commands() -> list[tuple[list[str], Any]]:
    """Every command of the app with its path (``["cost", "report"]``)."""
    out = []

    def walk(command: Any, path: list[str]) -> None:
        out.append((path, command))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


@pytest.mark.parametrize(
    ("path", "command"), COMMANDS, ids=[" ".join(p) or "coadapt" for p, _ in COMMANDS]
)
def test_every_option_is_explained_in_one_style(path: list[str], command: Any) -> None:
    """Every option and argument has help: a sentence (capital first, full stop last), no
    Sphinx markup; no ``<bool>`` metavar anywhere."""
    for param in command.params:
        text = getattr(param, "help", None) or ""
        assert text, f"coadapt {' '.join(path)} {param.name}: no help"
        assert text[0].isupper() and text.rstrip().endswith("."), f"{param.name}: {text!r}"
        assert not MARKUP.search(text), f"{param.name}: {text!r}"
    # in this process (the console script's own run: the simulate and agent tests below)
    shown = CliRunner().invoke(app, [*path, "--help"], prog_name="coadapt", env={"COLUMNS": "80"})
    assert shown.exit_code == 0, shown.output
    assert "Traceback" not in shown.output
    assert "<bool>" not in shown.stdout and not MARKUP.search(shown.stdout), shown.stdout
    assert shown.stdout.startswith(f"Usage: coadapt {' '.join(path)}".rstrip())
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80


def test_simulate_help_shows_every_option_name_whole_at_80_columns() -> None:
    shown = _coadapt("simulate", "--help").stdout
    command = dict((" ".join(p), c) for p, c in COMMANDS)["simulate"]
    names = [n for param in command.params for n in (*param.opts, *param.secondary_opts)]
    assert "--avoid-interference" in names and "--budget-usd-per-hour" in names
    for name in names:
        if name.startswith("-"):
            assert re.search(rf"(^|[\s,/]){re.escape(name)}([\s,=]|$)", shown, re.M), name
    assert "…" not in shown


def test_agent_help_is_in_the_same_style_as_every_command() -> None:
    shown = _coadapt("agent", "--help")
    assert shown.returncode == 0
    assert shown.stdout.startswith("Usage: coadapt agent [OPTIONS]")
    assert "options:" not in shown.stdout  # argparse's layout
    for flag in ("--work-dir", "--logs-dir", "--interval-s", "--report-interval-s"):
        line = next(x for x in shown.stdout.splitlines() if x.strip().startswith(flag))
        assert len(line.split()) > 2, f"{flag} has no help: {line!r}"


def test_prices_list_at_80_columns_keeps_instance_zone_market_and_price_whole() -> None:
    out = _coadapt("prices", "list", "--gpu", "T4", "--limit", "5")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80 and "…" not in out.stdout, out.stdout
    header = next(x for x in lines if "$/GPU-h" in x)
    for column in ("instance", "zone", "market"):
        assert column in header.split()
    offerings = json.loads(
        _coadapt("prices", "list", "--gpu", "T4", "--limit", "5", "--json").stdout
    )
    rows = [x for x in lines if re.match(r"\s*\d+\.\d{4}\s", x)]
    assert len(rows) == 5
    for row, offering in zip(rows, offerings, strict=True):
        words = row.split()
        assert f"{offering['usd_per_gpu_hour']:.4f}" == words[0]
        for key in ("instance_type", "zone", "market"):
            assert offering[key] in words, (key, row)
    text = " ".join(out.stdout.split())
    assert "Not shown at this width:" in text and "--wide shows them" in text


def test_prices_list_wide_shows_every_column() -> None:
    out = _coadapt("prices", "list", "--gpu", "T4", "--limit", "2", "--wide")
    assert out.returncode == 0, out.stderr
    header = next(x for x in out.stdout.splitlines() if "$/GPU-h" in x)
    for column in ("provider", "region", "Gbps", "source"):
        assert column in header
    assert "Not shown" not in out.stdout and "…" not in out.stdout


def test_prices_list_of_an_unknown_gpu_fails_saying_nothing_matched() -> None:
    out = _coadapt("prices", "list", "--gpu", "X999")
    assert out.returncode != 0
    _no_traceback(out)
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("coadapt: no offering matches --gpu X999; ")
    assert "T4" in line  # what --gpu could be


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simulate", "--policy", "foo", "x.csv"], "simulate: invalid value for '--policy'"),
        (["nosuch"], "no such command 'nosuch'"),
        (["agent", "--api", "http://x"], "agent: missing option"),
        (["cost", "report", "--format", "pdf"], "cost report: invalid value for '--format'"),
        (["prices", "list", "--limit", "0"], "prices list: invalid value for '--limit'"),
    ],
)
def test_usage_errors_are_one_line_in_the_one_error_style(args: list[str], words: str) -> None:
    out = _coadapt(*args)
    assert out.returncode == 2
    _no_traceback(out)
    (line,) = out.stderr.splitlines()
    assert line.startswith("coadapt: ") and words in line, line
    assert line.endswith("--help") and "; see coadapt " in line, line
    assert not re.search(r"\b[45]\d\d:", line)


@pytest.mark.parametrize(
    "args",
    [
        ["simulate", "--seed", "-1", "x.csv"],
        ["cost", "report"],
        ["prices", "list", "--max-usd-per-gpu-hour", "-1"],
        ["up", "--retention-days", "-1"],
    ],
)
def test_input_errors_use_the_coadapt_prefix(args: list[str]) -> None:
    out = _coadapt(*args)
    assert out.returncode == 2
    _no_traceback(out)
    (line,) = out.stderr.splitlines()
    assert line.startswith("coadapt: ") and not line.startswith("coadapt: error"), line
    assert "error:" not in line.lower()


SPEC_WITH_THREE_PROBLEMS = """\
name: Bad_Name
command: [train.py]
gpus: {min: 0}
batch_size: {initial: 64, max: 1024}
local_batch_size: {max: 64}
colour: blue
"""


def test_a_spec_lists_all_its_errors(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC_WITH_THREE_PROBLEMS)
    out = _coadapt("submit", str(spec), "--state-dir", str(tmp_path / "none"))
    assert out.returncode == 2
    _no_traceback(out)
    text = out.stderr
    assert text.startswith(f"coadapt: {spec}: 3 problems:"), text
    assert f"{spec}:1 [name]: must be a DNS label" in text
    assert f"{spec}:3 [gpus.min]: must be >= 1, got 0" in text
    assert f"{spec}:6 [colour]: unknown field" in text


def _job(name: str, status: str, retries: int = 0, reason: str | None = None) -> dict[str, Any]:
    return {"name": name, "status": status, "retries": retries, "reason": reason}


def test_status_says_why_a_job_failed_or_was_refused_in_one_line_each(capsys) -> None:
    """``coadapt status`` as it renders a store's jobs at 80 columns: a failed or refused job's
    reason on one line under the table, a retried job's last failure, nothing for the rest."""
    from autoscaler.cli.cluster import _render_status

    cause = "exit status 1: RuntimeError: the dataset at /nowhere/data is missing"
    jobs = [
        _job("broken", "failed", 4, cause),
        _job("huge", "refused", 0, "gpus.min 64 exceeds the fleet's 4 GPUs"),
        _job("again", "queued", 1, cause),
        _job("done", "completed", 1, cause),
        _job("fine", "running"),
    ]
    os.environ["COLUMNS"] = "80"
    try:
        _render_status({"jobs": jobs, "instances": []})
    finally:
        del os.environ["COLUMNS"]
    lines = capsys.readouterr().out.splitlines()
    said = [x for x in lines if re.match(r"\w+ \(", x)]
    assert said == [
        f"broken (failed): {cause}",
        "huge (refused): gpus.min 64 exceeds the fleet's 4 GPUs",
        f"again (queued, retry 1): last failure: {cause}",
    ]
    assert max(len(x) for x in lines if x not in said) <= 80  # the tables


@pytest.mark.slow
def test_agent_takes_the_options_a_cloud_node_starts_it_with(tmp_path: Path) -> None:
    """The AWS node's command line (terraform/aws/templates/node-user-data.sh.tftpl) reaches
    the agent: here it stops at the missing token file, in one line."""
    tokens = tmp_path / "agent-token.json"
    out = _coadapt(
        "agent", "--api", "http://127.0.0.1:9", "--token-file", str(tokens),
        "--cluster-id", "c1", "--request-id", "c1-i-0123", "--work-dir", str(tmp_path / "w"),
        "--logs-dir", str(tmp_path / "logs"), "--checkpoint-root", "",
        "--address", "127.0.0.1", "--notice-source", "aws", "--isolate-jobs",
    )  # fmt: skip
    _no_traceback(out)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("coadapt: ") and str(tokens) in line, line
    both = _coadapt("agent", "--api", "x", "--token-file", str(tokens), "--work-dir", "w")
    assert both.returncode == 2
    assert both.stderr.startswith("coadapt: give exactly one of --instance-key and --request-id")
