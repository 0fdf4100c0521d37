"""The fidelity runs, defined once: the test (``tests/sim/test_fidelity.py``) and the re-pin
script (``scripts/pin_fidelity.py``) both run exactly these and compare or write the same
record (``tests/sim/fidelity_pinned.json``).

Workloads 1 and 5 of the paper's 0.5x load, under every paper policy, seed 0, default
simulator settings. The record per run: the whole :meth:`SimResult.summary` and every job's
JCT (by job name), as floats written with ``repr`` precision so that a JSON round trip is
exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoscaler.sim.config import SimConfig
from autoscaler.sim.runner import PAPER_POLICIES, RunSpec, paper_workloads, run_many

PINNED_PATH = Path(__file__).with_name("fidelity_pinned.json")
LOAD = "0.5"
WORKLOAD_INDICES = (0, 4)  # workload-1 and workload-5


def fidelity_specs() -> list[RunSpec]:
    files = paper_workloads(LOAD)
    return [
        RunSpec(str(files[i]), policy, SimConfig())
        for i in WORKLOAD_INDICES
        for policy in PAPER_POLICIES
    ]


def run_records(processes: int = 2) -> dict[str, dict[str, Any]]:
    """``"workload/policy"`` -> ``{"summary": {...}, "jct_s": {job: seconds}}``."""
    out: dict[str, dict[str, Any]] = {}
    for result in run_many(fidelity_specs(), processes=processes):
        out[f"{result.workload}/{result.policy}"] = {
            "summary": result.summary(),
            "jct_s": {
                job.name: float(job.jct_s) for job in sorted(result.jobs, key=lambda j: j.name)
            },
        }
    return dict(sorted(out.items()))


def read_pinned() -> dict[str, dict[str, Any]]:
    return json.loads(PINNED_PATH.read_text(encoding="utf-8"))


def write_pinned(records: dict[str, dict[str, Any]]) -> None:
    PINNED_PATH.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n", encoding="utf-8")
