"""Reproduce the Pollux paper's simulator results (Figure/Table: average JCT per policy).

    python benchmarks/paper_sim.py --load 1.0 --policies coadapt,pollux,tiresias,optimus --out FILE

Runs every workload of the chosen load (``--load 1.0``: the eight 1.0x workloads, ``0.5``: the
0.5x set; ``--workloads PATH``: any folder of workload CSVs) under each policy, on 16 nodes x 4
GPUs with 60 s rounds, two workloads at a time, and writes::

    {"load": 1.0, "lengths": "declared", "world": "ideal", "speed_error": 0.0,
     "policies": {"<policy>": {"mean_jct_s", "per_workload_jct_s": {...}, "p99_jct_s",
                                "makespan_s", "restarts_per_job", "mean_ftf_ratio",
                                "max_ftf_ratio", "policy_ms_p50",
                                "policy_ms_max", "fit_ms_p50", "fit_ms_max", "wall_s",
                                "launches", "reversals", "reversals_by_kind",
                                "idle_usd_by_cause"}},
     "reference_mean_jct_s": {"pollux": 2751.1, "optimus": 5681.9, "tiresias": 4038.5},
     "reference_per_workload_jct_s": {...}, "peak_rss_mib": float}

``mean_jct_s`` is the mean over workloads of each workload's average JCT (the paper's metric);
``p99_jct_s`` the 99th percentile over all jobs of all workloads; ``makespan_s`` and
``restarts_per_job`` are averages over workloads; the churn (:mod:`autoscaler.accounting.churn`,
from the store each run leaves, summed over workloads): ``launches`` (launch calls: the fixed
fleet's nodes), ``reversals`` (a job's GPU count, instances or batch changed back within 5
rounds; by kind in ``reversals_by_kind``) and ``idle_usd_by_cause`` (``boot``: before a node's
first job, ``drain``, ``empty_ready``, ``fragmentation``, ``minimum_billing``) at the fixed
offering's nominal 1 USD per GPU-hour, i.e. idle GPU-hours; ``policy_ms_*`` are over all rounds, and
``fit_ms_*`` (the online model fitting for a round, timed apart from the policy) too;
``--cluster FILE`` runs on a cluster file's node groups (see ``autoscaler/sim/cluster.py``)
instead of 16 x 4 T4, and then the published numbers are not comparable (none are shown);
``wall_s`` is the policy's summed simulation time (worker seconds; ``elapsed_s`` is the whole
benchmark's elapsed time).
A per-workload table, ours next to the published numbers, is printed to stdout.

``--arrival-scale X`` replays the same workloads with every submission time divided by ``X``
(``1.5``, ``2``: jobs arrive 1.5x / 2x as fast; see
:func:`~autoscaler.sim.workload.compress_arrivals`), to load the cluster more heavily. The
published results are for the uncompressed workloads, so with ``X != 1`` the output has no
``reference_*`` keys; it records ``"arrival_scale": X``. Whenever pollux ran next to a baseline,
``"pollux_ratio"`` holds, per baseline, the ratio of mean JCTs (``"mean"``: pollux's
``mean_jct_s`` over the baseline's) and the per-workload ratios (``"per_workload"``); and
``"vs_pollux"``, per other policy, its mean JCT, p99 JCT and worst finish-time fairness ratio
(``max_ftf_ratio``, over all jobs) over pollux's, and on how many workloads its mean JCT is no
worse than pollux's (``"workloads_no_worse"``).

``--lengths declared|none`` (recorded as ``"lengths"``) is what the policies may know of job
lengths, only through the channel a controller has: ``declared``, every job's script declares
its length (the workload's target), and the policy gets each job's remaining work by the
trainer's rule; ``none``, no job declares (coadapt's remaining-time weights and restart horizon
then take their defaults). Jobs end at their true length either way.

``--world ideal|measured`` (recorded as ``"world"``; default ``ideal``, the world the paper's
simulator assumed, for the comparison with its figures) picks the world's own truths
(:mod:`autoscaler.sim.truths`): ``measured`` draws each restart from our trainer's measured
restart times scaled by the model's checkpoint size and has trainers report noisy gradient
statistics and step times, as our estimator measures them. ``--speed-error E`` (recorded as
``"speed_error"``; with ``--cluster``) lets each (application, GPU type) pair whose speed is
derived from the speed table run at the table's ratio times a seeded factor within ``1 +- E``.

``--option POLICY.KEY=VALUE`` (repeatable) passes an option to a policy's constructor (for
ablations: ``--option coadapt.remaining_weight=0``); the JSON records them under ``"options"``.

``--reference POLICY=FILE`` (repeatable) compares a ``--workloads`` folder with published
results in the Pollux artifact's ``summary.json`` format, e.g. its heavier-load workloads
``simulator/workloads-2.0`` with ``results-jobload/pollux-2.0/summary.json`` (not shipped here:
fetch the artifact, petuum/adaptdl branch ``osdi21-artifact``). Whenever published numbers are
known, ``"ours_over_reference"`` holds, per policy, our ``mean_jct_s`` over the published mean.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy is imported (see runner)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.accounting.churn import sum_churn_json
from autoscaler.decide.views import PolicyName
from autoscaler.sim.config import SimConfig
from autoscaler.sim.results import SimResult
from autoscaler.sim.runner import (
    RunSpec,
    paper_reference,
    paper_workloads,
    run_many,
)
from autoscaler.sim.truths import IDEAL, WORLDS, check_speed_error
from autoscaler.sim.workload import (
    compress_arrivals,
    load_workload,
    workload_files,
    write_workload,
)
from coadapt_common.atomic import write_json_atomic


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", default="1.0", choices=["1.0", "0.5"])
    parser.add_argument("--policies", default="coadapt,pollux,tiresias,optimus")
    parser.add_argument("--workloads", type=Path, default=None, help="folder of workload CSVs")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--cluster", type=Path, default=None, help="cluster YAML (node groups of GPU types)"
    )
    parser.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="POLICY=FILE",
        help="published results for --workloads, in the Pollux artifact's summary.json format "
        '({"avgs": {workload: mean JCT}, "mean": ...}); repeatable, one per policy',
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="POLICY.KEY=VALUE",
        help="a policy option (repeatable), e.g. coadapt.remaining_weight=0 for an ablation; "
        "VALUE is a Python literal (number, True/False, 'text')",
    )
    parser.add_argument(
        "--lengths",
        choices=["declared", "none"],
        default="declared",
        help="what the policies may know of job lengths: declared (every job's script "
        "declares its length, the workload's target) or none (no job declares)",
    )
    parser.add_argument(
        "--world",
        choices=list(WORLDS),
        default=IDEAL,
        help="the world's truths: ideal (the paper simulator's: restarts of exactly the "
        "policies' delay, exact reports) or measured (restarts and report noise measured on "
        "our trainer); measured-restarts and measured-reports measure only the one truth "
        "(ablations: how far each moves the figures)",
    )
    parser.add_argument(
        "--speed-error",
        type=_speed_error,
        default=0.0,
        metavar="E",
        help="each (application, GPU type) pair derived from the speed table runs at its "
        "ratio times a seeded factor within 1 +- E (0 <= E <= 0.9)",
    )
    parser.add_argument(
        "--arrival-scale",
        type=_arrival_scale,
        default=1.0,
        help="divide every submission time by this factor (> 0; 2 = jobs arrive twice as fast)",
    )
    args = parser.parse_args(argv)
    try:
        args.reference = dict(_reference(item) for item in args.reference)
        args.option = _options(args.option)
    except ValueError as e:
        parser.error(str(e))
    from autoscaler.decide.policy import make_policy
    from autoscaler.errors import AutoscalerError

    for policy, options in args.option.items():  # a bad option fails here, not in a worker
        try:
            make_policy(policy, **dict(options))
        except (AutoscalerError, TypeError) as e:
            parser.error(f"--option {policy}: {e}")
    with tempfile.TemporaryDirectory(prefix="paper-sim-") as scratch:
        return _run(args, Path(scratch))


def _arrival_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _speed_error(text: str) -> float:
    from autoscaler.errors import InvalidInputError

    try:
        return check_speed_error(float(text))
    except (ValueError, InvalidInputError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _options(items: list[str]) -> dict[str, tuple[tuple[str, object], ...]]:
    """``POLICY.KEY=VALUE`` items -> per policy, sorted (key, value) pairs."""
    import ast

    out: dict[str, dict[str, object]] = {}
    for item in items:
        name, sep, value = item.partition("=")
        policy, dot, key = name.partition(".")
        if not sep or not dot or not key or policy not in {p.value for p in PolicyName}:
            raise ValueError(f"--option wants POLICY.KEY=VALUE with a known policy, got {item!r}")
        try:
            out.setdefault(policy, {})[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            raise ValueError(f"--option {item}: {value!r} is not a Python literal") from None
    return {p: tuple(sorted(o.items())) for p, o in out.items()}


def _reference(item: str) -> tuple[str, dict]:
    """``POLICY=FILE`` -> (policy, {"avgs": ..., "mean": ...}) read from FILE."""
    policy, sep, path = item.partition("=")
    if not sep or policy not in {p.value for p in PolicyName}:
        raise ValueError(f"--reference wants POLICY=FILE with a known policy, got {item!r}")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        avgs = {str(k): float(v) for k, v in data["avgs"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--reference {path}: not a results summary ({e})") from None
    return policy, {"avgs": avgs, "mean": float(np.mean(list(avgs.values())))}


def _run(args: argparse.Namespace, scratch: Path) -> int:

    policies = [PolicyName(p.strip()) for p in args.policies.split(",") if p.strip()]
    files = workload_files(args.workloads) if args.workloads else paper_workloads(args.load)
    cluster = None
    if args.cluster is not None:
        from autoscaler.model.gputypes import default_speed_table
        from autoscaler.model.traces import APPLICATIONS
        from autoscaler.sim.cluster import load_cluster

        cluster = load_cluster(
            args.cluster, speeds=default_speed_table(), applications=APPLICATIONS
        )
    if args.arrival_scale != 1.0:
        scale = args.arrival_scale
        files = [
            write_workload(compress_arrivals(load_workload(f), scale), scratch / f.name)
            for f in files
        ]
    config = SimConfig(
        seed=args.seed,
        cluster=cluster,
        lengths=args.lengths,
        world=args.world,
        speed_error=args.speed_error,
    )
    specs = [
        RunSpec(str(f), p, config, args.option.get(p.value, ())) for p in policies for f in files
    ]
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
    paper = args.workloads is None and cluster is None
    load = float(args.load) if args.workloads is None else None
    out: dict = {
        "load": load,
        "arrival_scale": args.arrival_scale,
        "lengths": args.lengths,
        "world": args.world,
        "speed_error": args.speed_error,
        "options": {p: dict(o) for p, o in args.option.items()},
        "policies": {},
        "elapsed_s": elapsed,
    }
    if cluster is not None:
        out["cluster"] = str(args.cluster)
    for policy in policies:
        runs = [r for s, r in zip(specs, results, strict=True) if s.policy is policy]
        summaries = [r.summary() for r in runs]
        walls_ms = np.concatenate([[x.policy_wall_s * 1000 for x in r.rounds] for r in runs])
        fits_ms = np.concatenate([[x.fit_wall_s * 1000 for x in r.rounds] for r in runs])
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
            "max_ftf_ratio": float(max(s["max_ftf_ratio"] for s in summaries)),
            "policy_ms_p50": float(np.percentile(walls_ms, 50)),
            "policy_ms_max": float(walls_ms.max()),
            "fit_ms_p50": float(np.percentile(fits_ms, 50)),
            "fit_ms_max": float(fits_ms.max()),
            "wall_s": float(sum(r.wall_s for r in runs)),
        }
        churn = sum_churn_json(r.churn.to_json() for r in runs if r.churn is not None)
        out["policies"][str(policy)].update(
            launches=churn["launches"],
            reversals=churn["reversals"],
            reversals_by_kind=churn["reversals_by_kind"],
            idle_usd_by_cause=churn["idle_usd_by_cause"],
        )
    if "pollux" in out["policies"]:
        ours = out["policies"]["pollux"]
        out["pollux_ratio"] = {
            name: {
                "mean": ours["mean_jct_s"] / other["mean_jct_s"],
                "per_workload": {
                    w: jct / other["per_workload_jct_s"][w]
                    for w, jct in ours["per_workload_jct_s"].items()
                },
            }
            for name, other in out["policies"].items()
            if name != "pollux"
        }
        out["vs_pollux"] = {
            name: {
                "mean": other["mean_jct_s"] / ours["mean_jct_s"],
                "p99": other["p99_jct_s"] / ours["p99_jct_s"],
                "max_ftf": other["max_ftf_ratio"] / ours["max_ftf_ratio"],
                "workloads_no_worse": sum(
                    jct <= ours["per_workload_jct_s"][w]
                    for w, jct in other["per_workload_jct_s"].items()
                ),
            }
            for name, other in out["policies"].items()
            if name != "pollux"
        }
    all_refs: dict[str, dict] = {}
    if paper and args.arrival_scale == 1.0:
        all_refs = {p: paper_reference(p, args.load) for p in ("pollux", "optimus", "tiresias")}
    if args.reference and args.arrival_scale == 1.0:
        all_refs = {p: args.reference[p] for p in sorted(args.reference)}
    if all_refs:
        out["reference_mean_jct_s"] = {p: round(r["mean"], 1) for p, r in all_refs.items()}
        out["reference_per_workload_jct_s"] = {p: r["avgs"] for p, r in all_refs.items()}
        out["ours_over_reference"] = {
            p: out["policies"][p]["mean_jct_s"] / all_refs[p]["mean"]
            for p in out["policies"]
            if p in all_refs
        }
    out["peak_rss_mib"] = _peak_rss_mib()

    _print_table(out, [r.workload for r in results[: len(files)]])
    for name, ratio in out.get("pollux_ratio", {}).items():
        print(f"pollux / {name}: {ratio['mean']:.3f}")
    for name, vs in out.get("vs_pollux", {}).items():
        print(
            f"{name} / pollux: mean JCT {vs['mean']:.3f}, p99 JCT {vs['p99']:.3f}, worst FTF "
            f"{vs['max_ftf']:.3f}, no worse on {vs['workloads_no_worse']} of {len(files)}"
        )
    for name, ratio in out.get("ours_over_reference", {}).items():
        print(f"{name}: ours / published {ratio:.3f}")
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
