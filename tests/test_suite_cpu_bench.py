"""``benchmarks/suite_cpu.py``: it counts the CPU of processes the command starts and does not
wait for, passes the command's exit status through, and refuses a missing command."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks.suite_cpu import main
from coadapt_common.procfs import machine_busy_cpu_s

PARENT = """\
import pathlib, subprocess, sys, time
done = pathlib.Path(sys.argv[1])
subprocess.Popen([sys.executable, sys.argv[2], str(done)], start_new_session=True)
while not done.exists():  # never waits for the child: its CPU is not in our rusage
    time.sleep(0.01)
sys.exit(3)
"""
BURNER = """\
import pathlib, sys, time
start = time.process_time()
while time.process_time() - start < 0.6:
    pass
pathlib.Path(sys.argv[1]).touch()
"""


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux /proc")
def test_counts_a_detached_process_and_passes_the_exit_status_through(tmp_path: Path) -> None:
    parent, burner, out = tmp_path / "parent.py", tmp_path / "burner.py", tmp_path / "cpu.json"
    parent.write_text(PARENT)
    burner.write_text(BURNER)
    argv = ["--out", str(out), "--", sys.executable, str(parent), str(tmp_path / "done")]
    assert main([*argv, str(burner)]) == 0
    doc = json.loads(out.read_text())
    assert doc["exit_code"] == 3
    assert doc["busy_cpu_s"] >= 0.5, doc  # the detached burner's 0.6 CPU-s are counted
    assert doc["wall_s"] > 0 and doc["cores"] == os.cpu_count()


@pytest.mark.parametrize("argv", [[], ["--"], ["--", "/nonexistent/tool"]])
def test_a_missing_or_unrunnable_command_is_refused(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err and ("after --" in err or "/nonexistent/tool" in err), err


def test_busy_time_leaves_out_idle_and_iowait() -> None:
    stat = "cpu  100 10 50 1000 400 5 5 0 0 0\ncpu0 1 2 3 4\n"
    assert machine_busy_cpu_s(stat) == pytest.approx(170 / os.sysconf("SC_CLK_TCK"))
    assert machine_busy_cpu_s("intr 1 2 3\n" + stat) is None
    assert machine_busy_cpu_s("") is None
