"""Machine-wide CPU of one command, such as a pytest selection: what a suite really costs.

    python benchmarks/suite_cpu.py [--out FILE] -- CMD [ARG...]
    # e.g. -- .venv/bin/python -m pytest -q tests/controller/test_demo_story.py

Per-test CPU counters (``resource.getrusage``) miss every process a test starts and does not
wait for: node agents, launchers, torchrun and its workers. This reads the busy time of the
whole machine from the kernel (``/proc``) before and after the command instead, so it counts
them all, and everything else running then too: use it on a quiet machine. Prints (and with
``--out`` writes) one JSON object: ``command``, ``exit_code`` (the command's), ``wall_s``,
``busy_cpu_s`` (user, nice, system, irq, softirq and steal time of every core) and ``cores``.
Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from coadapt_common.procfs import machine_busy_cpu_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the command to measure after --")
    before_s, started = machine_busy_cpu_s(), time.monotonic()
    if before_s is None:
        p.error("cannot read the machine's CPU time (Linux /proc needed)")
    try:
        code = subprocess.run(command, check=False).returncode
    except OSError as e:
        p.error(f"cannot run {command[0]!r}: {e.strerror}")
    wall_s, after_s = time.monotonic() - started, machine_busy_cpu_s()
    result = {
        "command": command,
        "exit_code": code,
        "wall_s": round(wall_s, 2),
        "busy_cpu_s": None if after_s is None else round(after_s - before_s, 2),
        "cores": os.cpu_count(),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
