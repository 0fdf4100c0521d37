"""Reproduce the Pollux paper's simulator results (Figure/Table: average JCT per policy).

    python benchmarks/paper_sim.py --load 1.0 --policies pollux,tiresias,optimus --out FILE

Runs every workload of the chosen load (``--load 1.0``: the eight 1.0x workloads, ``0.5``: the
0.5x set; ``--workloads PATH``: any folder of workload CSVs) under each policy, on 16 nodes x 4
GPUs with 60 s rounds, two workloads at a time, and writes::

    {"load": 1.0,
     "policies": {"<policy>": {"mean_jct_s", "per_workload_jct_s": {...}, "p99_jct_s",
                                "makespan_s", "restarts_per_job", "policy_ms_p50",
                                "policy_ms_max", "wall_s"}},
     "reference_mean_jct_s": {"pollux": 2751.1, "optimus": 5681.9, "tiresias": 4038.5},
     "reference_per_workload_jct_s": {...}, "peak_rss_mib": float}

``mean_jct_s`` is the mean over workloads of each workload's average JCT (the paper's metric);
``p99_jct_s`` the 99th percentile over all jobs of all workloads; ``makespan_s`` and
``restarts_per_job`` are averages over workloads; ``policy_ms_*`` are over all rounds;
``wall_s`` is the policy's summed simulation time (worker seconds; ``elapsed_s`` is the whole
benchmark's elapsed time).
A per-workload table, ours next to the published numbers, is printed to stdout.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported (see runner)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.jobs import PolicyName
from autoscaler.sim.config import SimConfig
from autoscaler.sim.results import SimResult
from autoscaler.sim.runner import (
    RunSpec,
    paper_reference,
    paper_workloads,
    run_many,
)
from autoscaler.sim.workload import workload_files
from coadapt_common.atomic import write_json_atomic


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="1.0", choices=["1.0", "0.5"])
    parser.add_argument("--policies", default="pollux,tiresias,optimus")
    parser.add_argument("--workloads", type=Path, default=None, help="folder of workload CSVs")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    policies = [PolicyName(p.strip()) for p in args.policies.split(",") if p.strip()]
    files = workload_files(args.workloads) if args.workloads else paper_workloads(args.load)
    config = SimConfig(seed=args.seed)
    specs = [RunSpec(str(f), p, config) for p in policies for f in files]
    started = time.perf_counter()

    def done(spec: RunSpec, result: SimResult) -> None:
        print(
            f"  {result.policy:9s} {result.workload:12s} "
            f"mean JCT {result.summary()['mean_jct_s']:8.0f} s"
            f"  ({time.perf_counter() - started:6.0f} s elapsed)",
            flush=True,
        )

    results = run_many(specs, processes=args.processes, on_done=done)
    elapsed = time.perf_counter() - started

    # A custom --workloads folder has no load factor and no published results.
    load = float(args.load) if args.workloads is None else None
    out: dict = {"load": load, "policies": {}, "elapsed_s": elapsed}
    for policy in policies:
        runs = [r for s, r in zip(specs, results, strict=True) if s.policy is policy]
        summaries = [r.summary() for r in runs]
        walls_ms = np.concatenate([[x.policy_wall_s * 1000 for x in r.rounds] for r in runs])
        all_jct = np.concatenate([r.jcts_s for r in runs])
        out["policies"][str(policy)] = {
            "mean_jct_s": float(np.mean([s["mean_jct_s"] for s in summaries])),
            "per_workload_jct_s": {
                r.workload: s["mean_jct_s"] for r, s in zip(runs, summaries, strict=True)
            },
            "p99_jct_s": float(np.percentile(all_jct, 99)),
            "makespan_s": float(np.mean([s["makespan_s"] for s in summaries])),
            "restarts_per_job": float(np.mean([s["restarts_per_job"] for s in summaries])),
            "mean_ftf_ratio": float(np.mean([s["mean_ftf_ratio"] for s in summaries])),
            "policy_ms_p50": float(np.percentile(walls_ms, 50)),
            "policy_ms_max": float(walls_ms.max()),
            "wall_s": float(sum(r.wall_s for r in runs)),
        }
    if args.workloads is None:
        all_refs = {p: paper_reference(p, args.load) for p in ("pollux", "optimus", "tiresias")}
        out["reference_mean_jct_s"] = {p: round(r["mean"], 1) for p, r in all_refs.items()}
        out["reference_per_workload_jct_s"] = {p: r["avgs"] for p, r in all_refs.items()}
    out["peak_rss_mib"] = _peak_rss_mib()

    _print_table(out, [r.workload for r in results[: len(files)]])
    print(f"elapsed {elapsed:.0f} s, peak RSS {out['peak_rss_mib']:.0f} MiB")
    if args.out is not None:
        write_json_atomic(args.out, out)
    return 0


def _print_table(out: dict, workloads: list[str]) -> None:
    policies = list(out["policies"])
    refs = out.get("reference_per_workload_jct_s", {})
    header = f"{'workload':12s}" + "".join(f" {p + ' ours':>14s} {'paper':>8s}" for p in policies)
    print(header)
    for w in workloads:
        line = f"{w:12s}"
        for p in policies:
            ours = out["policies"][p]["per_workload_jct_s"].get(w, float("nan"))
            line += f" {ours:14.0f} {_cell(refs.get(p, {}).get(w)):>8s}"
        print(line)
    line = f"{'mean':12s}"
    for p in policies:
        ref = out.get("reference_mean_jct_s", {}).get(p)
        line += f" {out['policies'][p]['mean_jct_s']:14.0f} {_cell(ref):>8s}"
    print(line)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


if __name__ == "__main__":
    sys.exit(main())
