"""The jobs' metadata firewall on cloud nodes: the rules (table-driven), and the agent adding
them through the ``iptables`` / ``ip6tables`` found on PATH. This machine has no iptables and
no CAP_NET_ADMIN: a stand-in executable (a real script, first on PATH) records each call and
keeps the rules it was given, and can be told to fail. No real kernel sees these rules here."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoscaler.controller.credentials import write_token_file
from autoscaler.controller.job_firewall import (
    FirewallError,
    install_metadata_firewall,
    metadata_firewall_rules,
)
from coadapt_common.jobexec import JOB_UID_BASE, JOB_UID_SPAN, job_uid

ROOT = Path(__file__).resolve().parents[2]
UIDS = "1900000000-1916777215"

FAKE_IPTABLES = """#!{python}
import json, os, sys
log = os.environ["FAKE_IPTABLES_LOG"]
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(log, "a") as f:
    f.write(json.dumps([tool, *args]) + "\\n")
rules = log + "." + tool
have = open(rules).read().splitlines() if os.path.exists(rules) else []
op = next(a for a in args if a in ("-C", "-I"))
rule = " ".join(a for a in args if a not in ("-C", "-I"))
if op == "-C":
    sys.exit(0 if rule in have else 1)
if os.environ.get("FAKE_IPTABLES_FAIL"):
    print("iptables v1.8.7 (nf_tables): Could not fetch rule set generation id: "
          "Permission denied (you must be root)", file=sys.stderr)
    sys.exit(4)
with open(rules, "a") as f:
    f.write(rule + "\\n")
"""


@pytest.mark.parametrize(
    ("cloud", "expected"),
    [
        (
            "aws",
            (
                ["iptables", "-w", "-I", "OUTPUT", "-d", "169.254.169.254/32", "-m", "owner",
                 "--uid-owner", UIDS, "-j", "REJECT"],
                ["ip6tables", "-w", "-I", "OUTPUT", "-d", "fd00:ec2::254/128", "-m", "owner",
                 "--uid-owner", UIDS, "-j", "REJECT"],
            ),
        ),
        (
            "gcp",
            (
                ["iptables", "-w", "-I", "OUTPUT", "-d", "169.254.169.254/32", "-m", "owner",
                 "--uid-owner", UIDS, "-j", "REJECT"],
            ),
        ),
    ],
)  # fmt: skip
def test_the_rules_reject_the_whole_job_uid_range_to_the_metadata(
    cloud: str, expected: tuple[list[str], ...]
) -> None:
    assert metadata_firewall_rules(cloud) == expected


@pytest.mark.parametrize("cloud", ["local", "none", ""])
def test_no_rules_exist_off_the_clouds(cloud: str) -> None:
    with pytest.raises(ValueError, match="aws or gcp"):
        metadata_firewall_rules(cloud)


def test_the_range_holds_every_job_uid_and_nothing_below_or_above() -> None:
    first, last = (int(x) for x in UIDS.split("-"))
    assert (first, last) == (JOB_UID_BASE, JOB_UID_BASE + JOB_UID_SPAN - 1)
    for job in ("a", "train-bert", "x" * 200):
        assert first <= job_uid(job) <= last


def _fake_path(tmp_path: Path, tools: tuple[str, ...] = ("iptables", "ip6tables")) -> str:
    """A folder holding the stand-in tools, first on PATH (the rest of PATH has none)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in tools:
        script = folder / tool
        script.write_text(FAKE_IPTABLES.format(python=sys.executable))
        script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_install_checks_then_adds_each_rule_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", _fake_path(tmp_path))
    monkeypatch.setenv("FAKE_IPTABLES_LOG", str(log))
    added = install_metadata_firewall("aws")
    assert [Path(a[0]).name for a in added] == ["iptables", "ip6tables"]
    rules = metadata_firewall_rules("aws")
    checks = [[r[0], r[1], "-C", *r[3:]] for r in rules]
    assert _calls(log) == [checks[0], rules[0], checks[1], rules[1]]
    assert install_metadata_firewall("aws") == []  # there already: only checked
    assert _calls(log)[4:] == checks


def test_a_missing_tool_or_a_refused_rule_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_IPTABLES_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("PATH", f"{_fake_path(tmp_path, ('iptables',)).split(os.pathsep)[0]}")
    with pytest.raises(FirewallError, match=r"^ip6tables not found on PATH$"):
        install_metadata_firewall("aws")  # the IPv4 rule is added, the IPv6 tool is missing
    monkeypatch.setenv("FAKE_IPTABLES_FAIL", "1")
    assert install_metadata_firewall("gcp") == []  # there already: checked, not added again
    monkeypatch.setenv("FAKE_IPTABLES_LOG", str(tmp_path / "other.jsonl"))  # a bare node
    with pytest.raises(FirewallError) as e:
        install_metadata_firewall("gcp")
    (line,) = str(e.value).splitlines()
    assert line.startswith("iptables -w -I OUTPUT -d 169.254.169.254/32 ") and "Permission" in line


def _agent(tmp_path: Path, env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """``coadapt agent`` as a process of its own, with the stand-in tools first on PATH and a
    controller that does not answer (the agent keeps trying until SIGTERM)."""
    token = tmp_path / "agent-token.json"
    write_token_file(token, "agent", "a" * 43)
    env = {
        **os.environ,
        "PATH": _fake_path(tmp_path),
        "FAKE_IPTABLES_LOG": str(tmp_path / "calls.jsonl"),
        **env,
    }
    argv = [
        sys.executable, "-m", "autoscaler.controller.service", "agent",
        "--api", "http://127.0.0.1:9", "--metadata-url", "http://127.0.0.1:9",
        "--token-file", str(token), "--instance-key", "i-1", "--work-dir", str(tmp_path / "w"),
        "--interval-s", "0.2", *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_cloud_agent_that_cannot_firewall_its_jobs_exits_saying_so(tmp_path: Path) -> None:
    proc = _agent(tmp_path, {"FAKE_IPTABLES_FAIL": "1"}, "--notice-source", "aws")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    (line,) = err.splitlines()
    assert line.startswith("coadapt agent: not starting jobs: cannot firewall them off the "
                           "instance metadata (iptables -w -I OUTPUT"), line  # fmt: skip
    assert line.endswith("install iptables, or give --allow-job-metadata (unsafe)"), line
    assert not (tmp_path / "w" / "processes.json").exists()  # it never began to run jobs


def _until_stopped(proc: subprocess.Popen[str], seen: Path) -> str:
    """Wait for ``seen`` to exist, then SIGTERM the agent; its stderr."""
    deadline = time.monotonic() + 60
    while not seen.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


@pytest.mark.slow
def test_a_cloud_agent_firewalls_its_jobs_before_it_runs_and_the_opt_out_says_unsafe(
    tmp_path: Path,
) -> None:
    """The rules are in place before the agent first calls the controller (its first
    processes.json is written by its first step); a restart adds nothing twice; with
    ``--allow-job-metadata`` a failing iptables is said as unsafe and the agent runs on."""
    proc = _agent(tmp_path, {}, "--notice-source", "aws")
    _until_stopped(proc, tmp_path / "w" / "processes.json")
    rules = metadata_firewall_rules("aws")
    calls = _calls(tmp_path / "calls.jsonl")
    assert [c for c in calls if "-I" in c] == list(rules)
    again = _agent(tmp_path, {}, "--notice-source", "aws")
    _until_stopped(again, tmp_path / "w" / "processes.json")
    assert [c for c in _calls(tmp_path / "calls.jsonl") if "-I" in c] == list(rules)
    (tmp_path / "calls.jsonl").unlink()
    (tmp_path / "calls.jsonl.iptables").unlink()
    local = _agent(tmp_path, {}, "--notice-source", "none")
    _until_stopped(local, tmp_path / "w" / "processes.json")
    assert _calls(tmp_path / "calls.jsonl") == []  # no cloud, no firewall
    unsafe = _agent(
        tmp_path, {"FAKE_IPTABLES_FAIL": "1"}, "--notice-source", "gcp", "--allow-job-metadata"
    )
    err = _until_stopped(unsafe, tmp_path / "w" / "processes.json")
    assert "coadapt agent: UNSAFE: jobs can reach the instance metadata (" in err
