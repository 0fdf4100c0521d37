"""Fleet strategies side by side on priced, preemptible cloud offerings (cost vs JCT).

    python benchmarks/cloud_cost.py --experiment E1|E2|E3|E4 [--spot-trace [FAMILY=]FILE]
        [--spot-prices constant|stochastic] [--seed N] [--world measured|ideal] [--workloads N]
        [--strategies A,B] [--budget USD_PER_HOUR] [--min-efficiency X] [--optimistic-nodes]
        [--deadline-factor K] [--frontier [auto|X,Y,...] [--frontier-max-runs N]
        [--frontier-from FILE]]
        [--no-floor] [--max-jobs N] [-j 2]
        [--limit-jobs N [--limit-markets M,...] [--limit-offerings KEY,...]] --out FILE

``--spot-trace g4dn=FILE`` replaces one family's availability trace (``g4dn`` or ``p3``; either
Bamboo format: the event list or the counts over time); a bare ``--spot-trace FILE`` replaces
every family's. Families not named keep the shipped Bamboo traces.

Experiments (offerings, traces and strategies: :mod:`autoscaler.sim.experiments`):

- ``E1``: one ImageNet job (the Pollux paper's cloud experiment): ``pollux-autoscale``,
  ``throughput-autoscale``, ``throughput-anytype``, ``coadapt-ondemand``, ``coadapt``;
- ``E2``: the eight 1.0x paper workloads on g4dn + p3 offerings with the Bamboo g4dn and p3
  spot traces: ``static-ondemand``, ``pollux-autoscale``, ``throughput-autoscale``,
  ``cheapest-spot``, ``coadapt``;
- ``E3``: the same workloads with g4dn + p3 + p4d offerings: ``coadapt`` and its single-type
  variants ``coadapt-t4``, ``coadapt-v100``, ``coadapt-a100``;
- ``E4`` (deadlines): E2's workloads and offerings, each job with a deadline ``K`` x its JCT
  alone on its requested GPUs on demand (``--deadline-factor K``, default 2;
  :func:`autoscaler.sim.experiments.with_deadlines`): ``ondemand-only``, ``cheapest-spot``,
  ``uniform-progress``, ``coadapt``; each strategy adds ``deadlines_met`` (the fraction of
  jobs done by their deadline), ``deadline_jobs`` (how many had one) and
  ``deadline_misses`` (``workload/job`` of each miss).

Every figure comes from the product's controller (its round, store and fleet reconcile) under
the simulated cloud (:mod:`autoscaler.sim.world`), in the world ``--world`` names
(:mod:`autoscaler.sim.truths`). Writes ``{"experiment": str, "lengths":
"declared", "world": "measured"|"ideal", "strategies": {"<name>": {"cost_usd", "mean_jct_s",
"p99_jct_s", "preemptions", "instance_hours", "idle_usd", "launches", "restarts_per_job",
"reversals", "idle_usd_by_cause", ..., "floor_usd", "floor_at_jct_usd",
"cost_over_floor", "per_application": {...}, "per_workload": {...}}}, "ratios": {...}}``
(costs, floors and instance-hours summed over workloads;
``mean_jct_s`` the mean over workloads of each workload's mean JCT, as in ``paper_sim.py``)
and prints the ratios the acceptance criteria name. ``idle_usd`` is what no job held (free
GPUs, provisioning, minimum billing); the churn (:mod:`autoscaler.accounting.churn`, from the
store each run leaves, also per workload): ``launches`` (launch calls), ``boots_billed``,
``restarts_per_job`` (over all jobs), ``reversals`` (a job's GPU count, instances or batch
changed back within 5 rounds; by kind in ``reversals_by_kind``) and ``idle_usd_by_cause``
(``boot``, ``drain``, ``empty_ready``, ``fragmentation``, ``minimum_billing``: they sum to
``idle_usd``); ``per_application`` splits the rest by application:
``cost_usd`` attributed to its jobs' GPUs, and ``jct_share_s``, its jobs' JCTs over all jobs,
so that the applications' costs plus ``idle_usd`` make ``cost_usd`` and their shares make
``mean_jct_s``. ``floor_usd`` and ``floor_at_jct_usd`` are the run's cost floors
(:mod:`autoscaler.analysis.floor`): the least any fleet buying from the experiment's whole menu
(every strategy's offerings, :func:`~autoscaler.sim.experiments.experiment_menu`) could have paid
for the same work, (a) with no time limit and (b) every job finishing by its time in this run;
``cost_over_floor`` is ``cost_usd`` over (b), also per application (its attributed USD over
its jobs' share of (b)); ``per_workload`` adds the seconds each floor took
(``floor_wall_s``); ``--no-floor`` skips them (null: a quicker look). ``--workloads N`` runs
only the first N workloads, ``--max-jobs N`` only each one's first N jobs (in submission
order) and ``--strategies A,B`` only those strategies (a quick look; ratios whose strategies
did not run are left out).

``--limit-jobs N`` gives each workload's first N jobs (in submission order) the job spec
fields ``markets`` (``--limit-markets``, e.g. ``on-demand``) and ``offerings``
(``--limit-offerings``, keys ``provider/instance_type/zone/market``, e.g.
``aws/g4dn.12xlarge/use1-az1/on-demand``); each strategy then adds ``limited_jobs`` (their
names, ``workload/job``), ``limited_gpu_s`` (the GPU-seconds they held) and
``limited_outside_gpu_s`` (the GPU-seconds they held on instances their limits exclude, read
from the run's cost ledger: 0 when the limits held).

``--frontier X,Y,...`` runs every chosen strategy at every ``--min-efficiency`` knob instead;
``--frontier auto`` (or a bare ``--frontier``) sweeps each strategy's knob until its frontier
flattens at both ends or the knob's range is exhausted (:func:`autoscaler.analysis.frontier.
next_knob`: from the knobs 0.15, 0.5, 0.85 toward 0 at the fast end and 10 at the cheap end),
at most ``--frontier-max-runs`` knobs per strategy (default 8), one line on stderr per run.
``--frontier-from FILE`` takes the points of an earlier ``--frontier`` JSON of the same
experiment, workloads and settings (``settings``: refused where they differ) as run, and runs
only the knobs the sweep still asks for (the simulation is deterministic: a knob run again
gives the same point). Either writes ``{"experiment", "lengths", "knobs", "frontier":
{"<strategy>": [{"knob", "cost_usd", "mean_jct_s", "p99_jct_s", "preemptions",
"peak_instances", "peak_gpus", "at_max_instances", "per_workload"}, ...]}, "sweep":
{"mode": "auto"|"grid", "spec", "max_instances", "fleets": {"<strategy>": {"runs", "fast",
"cheap", "from_file"}}}, "settings", "complete", "frontier_checks": ...}``: each strategy's
cost-time points by knob (``peak_instances``/``peak_gpus``: the largest fleet of any of its
workloads; ``at_max_instances``: it reached the sizing's ``max_instances``, which then bounded
the fleet rather than the knob), how each end of each sweep ended
(:func:`~autoscaler.analysis.frontier.sweep_ends`: ``status`` ``flat``, ``range``, ``stopped``
or ``open``, the two outermost knobs and their relative difference in the end's axis), and,
when ``coadapt`` ran beside another strategy,
:func:`~autoscaler.analysis.frontier.check_frontiers` of ``coadapt`` against the others with
the ends within :data:`~autoscaler.analysis.frontier.END_TOLERANCE` (E3's acceptance on
frontiers: at every other fleet's point within coadapt's mean-JCT range coadapt's frontier
costs less; its fastest point's mean JCT and its cheapest point's cost within 2% of each
other fleet's), printed too. ``coadapt cost report FILE --format html`` plots it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

import numpy as np

from autoscaler.accounting.churn import sum_churn_json
from autoscaler.accounting.costs import CostRecord, job_costs, summarize
from autoscaler.analysis.floor import cost_floor
from autoscaler.analysis.frontier import (
    END_TOLERANCE,
    SweepSpec,
    check_frontiers,
    next_knob,
    points_from_json,
    sweep_ends,
)
from autoscaler.decide.policy import make_policy
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.views import OfferingRef, offering_allowed
from autoscaler.errors import InvalidInputError
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator
from autoscaler.sim.experiments import (
    EXPERIMENTS,
    SPOT_FAMILIES,
    build_run,
    e1_workload,
    experiment_menu,
    load_traces,
    with_deadlines,
)
from autoscaler.sim.floor_inputs import floor_problem
from autoscaler.sim.runner import paper_workloads
from autoscaler.sim.truths import MEASURED, WORLDS
from autoscaler.sim.workload import load_workload
from benchmarks.argtypes import positive_float, positive_int
from coadapt_common.atomic import write_json_atomic


@dataclass(frozen=True)
class _Run:
    """One :func:`_one` run's arguments (picklable: it crosses to a worker process)."""

    experiment: str
    strategy: str
    workload: str
    traces: dict[str, str] | None
    budget_usd_per_hour: float | None
    min_efficiency: float
    optimistic_nodes: bool
    spot_prices: str
    seed: int
    deadline_factor: float
    with_floor: bool
    max_jobs: int | None
    limit_jobs: int = 0
    world: str = "measured"
    limit_markets: tuple[str, ...] | None = None
    limit_offerings: tuple[str, ...] | None = None


def _one(task: _Run) -> dict:
    experiment, strategy, workload = task.experiment, task.strategy, task.workload
    prices, seed, traces_files = task.spot_prices, task.seed, task.traces
    traces = load_traces(traces_files) if traces_files else None
    sizing = SizingConfig(
        budget_usd_per_hour=task.budget_usd_per_hour,
        min_efficiency=task.min_efficiency,
        optimistic_nodes=task.optimistic_nodes,
    )
    run = build_run(
        experiment,
        strategy,
        traces=traces,
        sizing=sizing,
        spot_prices=prices,
        seed=seed,
        world=task.world,
    )
    jobs = e1_workload() if workload == "E1" else load_workload(workload).jobs
    if task.max_jobs is not None:
        jobs = jobs[: task.max_jobs]
    if experiment == "E4":
        jobs = with_deadlines(jobs, task.deadline_factor)
    limited = [j.name for j in jobs[: task.limit_jobs]]
    config = SimConfig(
        cloud=run.cloud,
        seed=seed,
        world=task.world,
        job_markets=tuple((n, task.limit_markets) for n in limited if task.limit_markets),
        job_offerings=tuple((n, task.limit_offerings) for n in limited if task.limit_offerings),
    )
    t0 = time.perf_counter()
    result = Simulator(
        jobs, make_policy(run.policy, **run.policy_options), config, workload_name=str(workload)
    ).run()
    assert result.cost is not None and result.fleet is not None
    totals = summarize(result.cost)
    # Per application: the USD attributed to its jobs' GPUs, and its share of the mean JCT
    # (its jobs' JCTs over all jobs), so that the shares sum to the mean JCT.
    per_app: dict[str, dict[str, float]] = {}
    for job in result.jobs:
        app = per_app.setdefault(job.application, {"cost_usd": 0.0, "jct_share_s": 0.0})
        app["jct_share_s"] += job.jct_s / len(result.jobs)
    application = {job.name: job.application for job in result.jobs}
    for cost in job_costs(result.cost):
        per_app[application[cost.job_id]]["cost_usd"] += cost.cost_usd
    # The least any fleet on the experiment's whole menu (every strategy's offerings) could
    # have paid for the same work (autoscaler/analysis/floor.py): (a) with no time limit, (b) every
    # job by its finish time here.
    t_floor = time.perf_counter()
    floor = None
    if task.with_floor:
        menu = experiment_menu(experiment, traces=traces, spot_prices=prices, seed=seed)
        floor = cost_floor(floor_problem(jobs, result, offerings=menu))
        for app, f in floor.by_application().items():
            per_app[app].update(f)
    return {
        "strategy": strategy,
        "workload": Path(str(workload)).stem,
        "cost_usd": totals.total_usd,
        "instance_hours": totals.instance_hours,
        "idle_usd": totals.idle_usd,
        "peak_instances": totals.peak_instances,
        "peak_gpus": totals.peak_gpus,
        "per_application": per_app,
        "mean_jct_s": float(result.jcts_s.mean()),
        "jcts_s": [float(x) for x in result.jcts_s],
        "preemptions": int(result.fleet["preemptions"]),
        "peak_usd_per_hour": result.fleet["peak_usd_per_hour"],
        "floor_usd": None if floor is None else floor.no_limit_usd,
        "floor_at_jct_usd": None if floor is None else floor.at_deadline_usd,
        "floor_slot_s": None if floor is None else floor.slot_s,
        "floor_wall_s": None if floor is None else time.perf_counter() - t_floor,
        "wall_s": time.perf_counter() - t0,
        **_limited(task, limited, result.cost, Path(str(workload)).stem),
        "deadline_misses": [j.name for j in result.jobs if j.deadline_met is False],
        "deadline_jobs": sum(1 for j in result.jobs if j.deadline_s is not None),
        "churn": result.churn.to_json() if result.churn is not None else None,
    }


def _limited(task: _Run, names: list[str], cost: CostRecord | None, workload: str) -> dict:
    """``--limit-jobs``' figures of one run (none without it): the limited jobs, the
    GPU-seconds they held, and those on instances their limits exclude."""
    if not task.limit_jobs:
        return {}
    assert cost is not None
    markets = None if task.limit_markets is None else frozenset(task.limit_markets)
    offerings = (
        None
        if task.limit_offerings is None
        else frozenset(OfferingRef.parse(k) for k in task.limit_offerings)
    )
    instances = {i.instance_id: i for i in cost.instances}
    held = outside = 0.0
    for job in cost.jobs:
        if job.job_id not in names:
            continue
        for use in job.usages:
            inst = instances[use.instance_id]
            ref = OfferingRef(inst.provider, inst.instance_type, inst.zone, inst.market)
            held += use.gpu_s
            if not offering_allowed(ref, None, markets, offerings):
                outside += use.gpu_s
    return {
        "limited_jobs": [f"{workload}/{n}" for n in names],
        "limited_gpu_s": held,
        "limited_outside_gpu_s": outside,
    }


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list (argparse type)."""
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    if not items:
        raise argparse.ArgumentTypeError(f"wants a comma-separated list, got {text!r}")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True, choices=sorted(EXPERIMENTS))
    ap.add_argument("--spot-trace", action="append", default=[], metavar="[FAMILY=]FILE")
    ap.add_argument("--workloads", type=positive_int, default=8)
    ap.add_argument(
        "--max-jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="run only each workload's first N jobs (in submission order): a quick look",
    )
    ap.add_argument("--strategies", default=None, help="comma-separated subset to run")
    ap.add_argument("--budget", type=float, default=None, help="fleet budget, USD per hour")
    ap.add_argument("--min-efficiency", type=float, default=SizingConfig().min_efficiency)
    ap.add_argument(
        "--optimistic-nodes",
        action="store_true",
        help="value unseen multi-instance shapes optimistically (SizingConfig.optimistic_nodes)",
    )
    ap.add_argument(
        "--spot-prices",
        choices=["constant", "stochastic"],
        default="constant",
        help="spot prices: the catalogue's, constant, or a seeded walk around them",
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of spot prices, hazards and the world's draws"
    )
    ap.add_argument(
        "--world",
        choices=list(WORLDS),
        default=MEASURED,
        help="the world's truths: measured (boots drawn from public start-up measurements, "
        "restarts from our trainer's, noisy reports; the default) or ideal (every boot the "
        "sizing's provisioning delay, every restart the policy's restart delay, exact reports); "
        "measured-restarts and measured-reports: the ideal world with only that truth measured "
        "(ablations)",
    )
    ap.add_argument(
        "--deadline-factor",
        type=positive_float,
        default=2.0,
        help="E4: each job's deadline, this x its JCT alone on its requested GPUs on demand",
    )
    ap.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the cost floors (their keys are null): quicker, for a look at costs and JCTs",
    )
    ap.add_argument(
        "--frontier",
        nargs="?",
        const="auto",
        default=None,
        metavar="auto|X,Y,...",
        help="run every strategy at each --min-efficiency knob, or (auto, the default) sweep "
        "each one's knob until its frontier flattens at both ends, and write each one's "
        "(cost, mean JCT) frontier",
    )
    ap.add_argument(
        "--frontier-max-runs",
        type=positive_int,
        default=SweepSpec().max_runs,
        metavar="N",
        help="--frontier auto: at most N knobs per strategy (each runs every workload)",
    )
    ap.add_argument(
        "--limit-jobs",
        type=positive_int,
        default=0,
        metavar="N",
        help="give each workload's first N jobs the spec fields --limit-markets and "
        "--limit-offerings, and report where they ran",
    )
    ap.add_argument("--limit-markets", type=_names, default=None, metavar="M,...")
    ap.add_argument("--limit-offerings", type=_names, default=None, metavar="KEY,...")
    ap.add_argument(
        "--frontier-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="--frontier: take the points of an earlier --frontier JSON of the same experiment, "
        "workloads and settings, and run only the knobs still asked for",
    )
    ap.add_argument("-j", "--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.limit_jobs and args.limit_markets is None and args.limit_offerings is None:
        ap.error("--limit-jobs wants --limit-markets or --limit-offerings")
    knobs: list[float] = []
    spec: SweepSpec | None = None
    if args.frontier is not None and args.frontier.strip() == "auto":
        if args.frontier_max_runs < len(SweepSpec().grid):
            ap.error(f"--frontier-max-runs wants at least {len(SweepSpec().grid)} (the grid)")
        spec = SweepSpec(max_runs=args.frontier_max_runs)
    elif args.frontier is not None:
        try:
            knobs = sorted({float(x) for x in args.frontier.split(",") if x.strip()})
        except ValueError:
            ap.error(f"--frontier wants comma-separated numbers, got {args.frontier!r}")
        if not 2 <= len(knobs) <= 20 or not all(0 <= k <= SweepSpec().knob_max for k in knobs):
            ap.error(
                f"--frontier wants auto or 2 to 20 knobs in [0, {SweepSpec().knob_max:g}], "
                f"got {args.frontier!r}"
            )
    traces: dict[str, str] = {}
    for item in args.spot_trace:
        family, sep, path = item.partition("=")
        if not sep:
            family, path = "", item
        if not Path(path).is_file():
            ap.error(f"--spot-trace wants [FAMILY=]FILE with an existing file, got {item!r}")
        if family and family not in SPOT_FAMILIES:
            ap.error(f"--spot-trace: unknown family {family!r}; one of {', '.join(SPOT_FAMILIES)}")
        traces.update({f: path for f in ([family] if family else SPOT_FAMILIES)})
    if traces:
        load_traces(traces)  # fail before any simulation on a bad trace
    workloads: list[str] = (
        ["E1"]
        if args.experiment == "E1"
        else [str(p) for p in paper_workloads("1.0")[: args.workloads]]
    )
    names = EXPERIMENTS[args.experiment]
    if args.strategies is not None:
        wanted = [n.strip() for n in args.strategies.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown or not wanted:
            ap.error(
                f"--strategies: {args.experiment} has {', '.join(names)}; got {args.strategies!r}"
            )
        names = tuple(n for n in names if n in wanted)
    if spec is None and knobs:
        spec = _grid_spec(knobs)
    if args.frontier_from is not None and spec is None:
        ap.error("--frontier-from goes with --frontier")
    if spec is not None:
        try:
            earlier = _earlier_points(args, names, workloads)
        except (OSError, ValueError, InvalidInputError) as e:
            ap.error(f"--frontier-from {args.frontier_from}: {e}")
        return _frontier(args, names, workloads, spec, traces or None, earlier, auto=not knobs)
    tasks = [
        _task(args, s, w, traces or None, args.min_efficiency) for s in names for w in workloads
    ]
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for row in pool.map(_one, tasks):
            rows.append(row)
            print(
                f"  {row['strategy']:22s} {row['workload']:12s} ${row['cost_usd']:10.2f} "
                f"mean JCT {row['mean_jct_s']:8.0f} s  preemptions {row['preemptions']:3d}  "
                f"({row['wall_s']:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    # What the policies and the sizing were allowed to know of job lengths: every job's
    # script declares its length (SimConfig's default), as the controller reads it.
    out: dict = {
        "experiment": args.experiment,
        "lengths": SimConfig().lengths,
        "world": args.world,
        "strategies": {},
    }
    if args.experiment == "E4":
        out["deadline_factor"] = args.deadline_factor
    for s in names:
        mine = [r for r in rows if r["strategy"] == s]
        out["strategies"][s] = {
            "cost_usd": round(sum(r["cost_usd"] for r in mine), 2),
            "mean_jct_s": float(np.mean([r["mean_jct_s"] for r in mine])),
            "p99_jct_s": float(np.percentile([j for r in mine for j in r["jcts_s"]], 99)),
            "preemptions": sum(r["preemptions"] for r in mine),
            "instance_hours": sum(r["instance_hours"] for r in mine),
            "peak_usd_per_hour": max(r["peak_usd_per_hour"] for r in mine),
            "idle_usd": sum(r["idle_usd"] for r in mine),
            **sum_churn_json(r["churn"] for r in mine),
            "floor_usd": _sum_or_none(r["floor_usd"] for r in mine),
            "floor_at_jct_usd": _sum_or_none(r["floor_at_jct_usd"] for r in mine),
            "per_application": _per_application(mine),
            "per_workload": {
                r["workload"]: {
                    "cost_usd": r["cost_usd"],
                    "mean_jct_s": r["mean_jct_s"],
                    "floor_usd": r["floor_usd"],
                    "floor_at_jct_usd": r["floor_at_jct_usd"],
                    "floor_slot_s": r["floor_slot_s"],
                    "floor_wall_s": r["floor_wall_s"],
                    "launches": r["churn"]["launches"],
                    "restarts_per_job": r["churn"]["restarts_per_job"],
                    "reversals": r["churn"]["reversals"],
                    "idle_usd_by_cause": r["churn"]["idle_usd_by_cause"],
                }
                for r in mine
            },
        }
        mine_out = out["strategies"][s]
        mine_out["cost_over_floor"] = (
            None
            if mine_out["floor_at_jct_usd"] is None
            else _over(mine_out["cost_usd"], mine_out["floor_at_jct_usd"])
        )
        if args.limit_jobs:
            out["strategies"][s].update(
                limited_jobs=[n for r in mine for n in r["limited_jobs"]],
                limited_gpu_s=sum(r["limited_gpu_s"] for r in mine),
                limited_outside_gpu_s=sum(r["limited_outside_gpu_s"] for r in mine),
            )
        if args.experiment == "E4":
            count = sum(r["deadline_jobs"] for r in mine)
            misses = [f"{r['workload']}/{n}" for r in mine for n in r["deadline_misses"]]
            out["strategies"][s].update(
                deadlines_met=1.0 - len(misses) / max(1, count),
                deadline_jobs=count,
                deadline_misses=misses,
            )
    out["ratios"] = _ratios(args.experiment, out["strategies"])
    out["elapsed_s"] = time.perf_counter() - started
    write_json_atomic(args.out, out)
    for s, v in out["strategies"].items():
        print(
            f"{s:22s} cost ${v['cost_usd']:10.2f}  mean JCT {v['mean_jct_s']:8.0f} s  "
            f"p99 {v['p99_jct_s']:8.0f} s  instance-h {v['instance_hours']:8.1f}  "
            f"preemptions {v['preemptions']}"
        )
    print("where the money went (USD attributed to jobs' GPUs | share of the mean JCT, s):")
    for s, v in out["strategies"].items():
        parts = "  ".join(
            f"{app} {a['cost_usd']:.0f}|{a['jct_share_s']:.0f}"
            for app, a in sorted(v["per_application"].items())
        )
        print(f"  {s:22s} idle {v['idle_usd']:8.0f}  {parts}")
    print("churn: launches, restarts per job, reversals; idle USD by cause:")
    for s, v in out["strategies"].items():
        causes = "  ".join(f"{c} {usd:.0f}" for c, usd in v["idle_usd_by_cause"].items())
        print(
            f"  {s:22s} launches {v['launches']:5d}  restarts/job {v['restarts_per_job']:5.2f}  "
            f"reversals {v['reversals']:4d}  idle {v['idle_usd']:8.0f}: {causes}"
        )
    floors = {s: v for s, v in out["strategies"].items() if v["cost_over_floor"] is not None}
    if floors:
        print("cost floor (USD): (a) no time limit, (b) every job by its JCT here; cost / (b):")
    for s, v in floors.items():
        print(
            f"  {s:22s} floor {v['floor_usd']:10.2f}  at JCT {v['floor_at_jct_usd']:10.2f}  "
            f"cost / floor {v['cost_over_floor']:.3f}"
        )
    for k, v in out["ratios"].items():
        print(f"{k}: cost {v['cost']:.3f}, mean JCT {v['mean_jct']:.3f}")
    for s, v in out["strategies"].items():
        if "deadlines_met" in v:
            print(
                f"{s:22s} deadlines met {v['deadlines_met']:.3f} of {v['deadline_jobs']}"
                f"  missed: {', '.join(v['deadline_misses']) or 'none'}"
            )
    return 0


def _task(
    args: argparse.Namespace,
    strategy: str,
    workload: str,
    traces: dict[str, str] | None,
    min_efficiency: float,
) -> _Run:
    """The arguments of one :func:`_one` run."""
    return _Run(
        experiment=args.experiment,
        strategy=strategy,
        workload=workload,
        traces=traces,
        budget_usd_per_hour=args.budget,
        min_efficiency=min_efficiency,
        optimistic_nodes=args.optimistic_nodes,
        spot_prices=args.spot_prices,
        seed=args.seed,
        deadline_factor=args.deadline_factor,
        with_floor=not args.no_floor,
        max_jobs=args.max_jobs,
        limit_jobs=args.limit_jobs,
        world=args.world,
        limit_markets=args.limit_markets,
        limit_offerings=args.limit_offerings,
    )


def _sum_or_none(values: Iterable[float | None]) -> float | None:
    """The sum, or ``None`` where a value is missing (a run without its floor)."""
    items = list(values)
    if any(v is None for v in items):
        return None
    return float(sum(v for v in items if v is not None))


def _over(cost_usd: float, floor_usd: float) -> float | None:
    """``cost / floor``; ``None`` where the floor is zero (no work)."""
    return cost_usd / floor_usd if floor_usd > 0 else None


#: The fleet whose frontier the others' are checked against.
FRONTIER_REFERENCE = "coadapt"


def _grid_spec(knobs: list[float]) -> SweepSpec:
    """An explicit ``--frontier X,Y,...`` (2 or more knobs, ascending): those knobs and no
    more; an end they leave unsettled is ``stopped``."""
    return SweepSpec(grid=tuple(knobs), max_runs=len(knobs))


def _frontier(
    args: argparse.Namespace,
    names: tuple[str, ...],
    workloads: list[str],
    spec: SweepSpec,
    traces: dict[str, str] | None,
    earlier: dict[str, list[dict]],
    *,
    auto: bool,
) -> int:
    """``--frontier``: every strategy at the knobs :func:`next_knob` names for it (every knob
    of an explicit grid; see the module docstring). Each round asks every strategy not done for
    its next knob and runs those, every workload each, in the pool; the JSON is written after
    each round (``"complete": false`` until the last), so a sweep cut short leaves its points."""
    started = time.perf_counter()
    points: dict[str, list[dict]] = {s: list(earlier.get(s, ())) for s in names}
    taken = {s: sorted(p["knob"] for p in pts) for s, pts in points.items()}
    pending = set(names)
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        while pending:
            asked: list[tuple[str, float]] = []
            for s in names:
                if s not in pending:
                    continue
                knob = next_knob(points_from_json(points[s]) if points[s] else [], spec)
                if knob is None:
                    pending.discard(s)
                else:
                    asked.append((s, knob))
            tasks = [_task(args, s, w, traces, k) for s, k in asked for w in workloads]
            rows = []
            for task, row in zip(tasks, pool.map(_one, tasks), strict=True):
                row["knob"] = task.min_efficiency
                rows.append(row)
                print(
                    f"  {row['strategy']:16s} knob {row['knob']:6.4g} {row['workload']:12s} "
                    f"${row['cost_usd']:10.2f} mean JCT {row['mean_jct_s']:8.0f} s  "
                    f"peak {row['peak_instances']:4d} instances  ({row['wall_s']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            for s, k in asked:
                points[s].append(_point(k, [r for r in rows if r["strategy"] == s]))
            if asked:
                out = _frontier_json(args, points, taken, spec, auto=auto, complete=False)
                out["elapsed_s"] = time.perf_counter() - started
                write_json_atomic(args.out, out)
    out = _frontier_json(args, points, taken, spec, auto=auto, complete=True)
    out["elapsed_s"] = time.perf_counter() - started
    write_json_atomic(args.out, out)
    for s, pts in out["frontier"].items():
        for p in pts:
            print(
                f"{s:16s} knob {p['knob']:6.4g}  cost ${p['cost_usd']:10.2f}  "
                f"mean JCT {p['mean_jct_s']:8.0f} s  peak {p['peak_instances']} instances"
            )
        ends = out["sweep"]["fleets"][s]
        print(
            f"{s:16s} ends: "
            + "; ".join(
                f"{e} {ends[e]['status']} ({_change(ends[e]['change'])} in {ends[e]['axis']})"
                for e in ("fast", "cheap")
            )
        )
    if "frontier_checks" in out:
        _print_checks(out["frontier_checks"])
    return 0


def _frontier_json(
    args: argparse.Namespace,
    points: dict[str, list[dict]],
    taken: dict[str, list[float]],
    spec: SweepSpec,
    *,
    auto: bool,
    complete: bool,
) -> dict:
    """``--frontier``'s JSON (module docstring) of the points run so far (``taken``: the knobs
    of each strategy taken from ``--frontier-from``)."""
    cap = SizingConfig().max_instances
    frontier = {
        s: [p | {"at_max_instances": p["peak_instances"] >= cap} for p in pts]
        for s, pts in points.items()
    }
    frontier = {s: sorted(pts, key=lambda p: p["knob"]) for s, pts in frontier.items()}
    parsed = {s: points_from_json(p, f"frontier.{s}") for s, p in frontier.items()}
    out: dict = {
        "experiment": args.experiment,
        "lengths": SimConfig().lengths,
        "world": args.world,
        "knobs": sorted({p["knob"] for pts in frontier.values() for p in pts}),
        "frontier": frontier,
        "sweep": {
            "mode": "auto" if auto else "grid",
            "spec": spec.to_json(),
            "max_instances": cap,
            "fleets": {
                s: {"runs": len(pts), "from_file": taken[s]}
                | {e: state.to_json() for e, state in sweep_ends(pts, spec).items()}
                for s, pts in parsed.items()
            },
        },
        "settings": _settings(args),
        "complete": complete,
    }
    if FRONTIER_REFERENCE in frontier and len(frontier) > 1:
        out["frontier_checks"] = check_frontiers(parsed, FRONTIER_REFERENCE, END_TOLERANCE)
    return out


def _settings(args: argparse.Namespace) -> dict:
    """What besides the knob decides a frontier point: ``--frontier-from`` refuses a file
    whose settings differ."""
    return {
        "workloads": args.workloads,
        "max_jobs": args.max_jobs,
        "budget": args.budget,
        "optimistic_nodes": args.optimistic_nodes,
        "spot_prices": args.spot_prices,
        "seed": args.seed,
        "spot_trace": sorted(args.spot_trace),
        "with_floor": not args.no_floor,
    }


def _earlier_points(
    args: argparse.Namespace, names: tuple[str, ...], workloads: list[str]
) -> dict[str, list[dict]]:
    """``--frontier-from``'s points per strategy of ``names`` (none without the flag); raises
    :class:`~autoscaler.errors.InvalidInputError` (or ``OSError``/``ValueError`` for an
    unreadable file) where the file is not a frontier of this experiment, workloads and
    settings."""
    if args.frontier_from is None:
        return {}
    if args.frontier_from.stat().st_size > 50_000_000:
        raise InvalidInputError("larger than 50 MB", field="frontier_from")
    data = json.loads(args.frontier_from.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("frontier"), dict):
        raise InvalidInputError("not a --frontier JSON (no 'frontier')", field="frontier")
    if data.get("experiment") != args.experiment:
        raise InvalidInputError(
            f"its experiment is {data.get('experiment')!r}, not {args.experiment}",
            field="experiment",
        )
    settings = data.get("settings")
    if settings is not None and settings != _settings(args):
        raise InvalidInputError(
            f"its settings {settings} differ from this run's {_settings(args)}", field="settings"
        )
    stems = {Path(w).stem for w in workloads}
    out: dict[str, list[dict]] = {}
    for s in names:
        items = data["frontier"].get(s)
        if items is None:
            continue
        points_from_json(items, f"frontier.{s}")  # each point's figures checked
        for n, item in enumerate(items):
            runs = item.get("per_workload")
            if not isinstance(runs, dict) or set(runs) != stems:
                raise InvalidInputError(
                    f"frontier.{s}[{n}] ran other workloads than {sorted(stems)}",
                    field=f"frontier.{s}[{n}].per_workload",
                )
        knobs = [item["knob"] for item in items]
        if len(set(knobs)) != len(knobs):
            raise InvalidInputError(f"frontier.{s}: a knob twice", field=f"frontier.{s}")
        out[s] = [dict(item) for item in items]
    return out


def _change(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def _point(knob: float, mine: list[dict]) -> dict:
    """One knob's point of one strategy from its workloads' rows: cost summed, mean JCT the
    mean of the workloads' (as without ``--frontier``), the largest fleet of any."""
    point = {
        "knob": knob,
        "cost_usd": round(sum(r["cost_usd"] for r in mine), 2),
        "mean_jct_s": float(np.mean([r["mean_jct_s"] for r in mine])),
        "p99_jct_s": float(np.percentile([j for r in mine for j in r["jcts_s"]], 99)),
        "preemptions": sum(r["preemptions"] for r in mine),
        "peak_instances": max(r["peak_instances"] for r in mine),
        "peak_gpus": max(r["peak_gpus"] for r in mine),
        "per_workload": {
            r["workload"]: {
                "cost_usd": r["cost_usd"],
                "mean_jct_s": r["mean_jct_s"],
                "peak_instances": r["peak_instances"],
            }
            for r in mine
        },
    }
    # Floors, where the run computes them (USD summed over workloads as cost is).
    for key in sorted({key for r in mine for key in r if key.startswith("floor")}):
        values = [r.get(key) for r in mine]
        if all(isinstance(v, int | float) for v in values):
            point[key] = float(sum(values))  # type: ignore[arg-type]
    return point


def _print_checks(checks: dict) -> None:
    ref = checks["reference"]
    lo, hi = checks["range_s"]
    print(f"frontier checks, {ref} (mean JCT {lo:.0f}-{hi:.0f} s) against each fleet:")
    for name, dom in checks["dominance"].items():
        ratios = ", ".join(
            f"{p['mean_jct_s']:.0f} s {p['cost_ratio']:.3f}{'' if p['holds'] else ' FAIL'}"
            for p in dom["points"]
        )
        reach, cheap = checks["reach"][name], checks["cheapest"][name]
        print(
            f"  vs {name}: dominance {'holds' if dom['holds'] else 'FAILS'} "
            f"[{ratios or 'no point in range'}]; reach {reach['reference_min_jct_s']:.0f} s vs "
            f"{reach['min_jct_s']:.0f} s {'holds' if reach['holds'] else 'FAILS'}; cheapest "
            f"${cheap['reference_min_cost_usd']:.2f} vs ${cheap['min_cost_usd']:.2f} "
            f"{'holds' if cheap['holds'] else 'FAILS'}"
        )
    print("  all hold" if checks["holds"]["all"] else f"  holds: {checks['holds']}")


def _per_application(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per application over the workloads of ``rows``: USD attributed to its jobs (summed,
    as ``cost_usd`` is) and its share of the mean JCT (averaged, as ``mean_jct_s`` is)."""
    out: dict[str, dict[str, float | None]] = {}
    for r in rows:
        for app, a in r["per_application"].items():
            mine = out.setdefault(
                app,
                {"cost_usd": 0.0, "jct_share_s": 0.0, "floor_usd": 0.0, "floor_at_jct_usd": 0.0},
            )
            for key in ("cost_usd", "floor_usd", "floor_at_jct_usd"):
                mine[key] = float(mine[key] or 0.0) + a.get(key, 0.0)
            mine["jct_share_s"] = float(mine["jct_share_s"] or 0.0) + a["jct_share_s"] / len(rows)
    floored = all("floor_usd" in a for r in rows for a in r["per_application"].values())
    for mine in out.values():
        mine["cost_over_floor"] = _over(
            float(mine["cost_usd"] or 0.0), float(mine["floor_at_jct_usd"] or 0.0)
        )
        if not floored:  # a run without floors (--no-floor): none, not zero
            mine.update(floor_usd=None, floor_at_jct_usd=None, cost_over_floor=None)
    return out


#: Per experiment, the (numerator, denominator) strategies of the ratios printed, in order
#: (the acceptance criteria's first).
_RATIOS: dict[str, tuple[tuple[str, str], ...]] = {
    "E1": (
        ("coadapt-ondemand", "throughput-autoscale"),
        ("coadapt", "throughput-autoscale"),
        ("coadapt", "pollux-autoscale"),
        ("coadapt-ondemand", "throughput-anytype"),
    ),
    "E2": (
        ("coadapt", "static-ondemand"),
        ("coadapt", "cheapest-spot"),
        ("coadapt", "pollux-autoscale"),
        ("coadapt", "throughput-autoscale"),
    ),
    "E3": tuple(("coadapt", v) for v in ("coadapt-t4", "coadapt-v100", "coadapt-a100")),
    "E4": (("coadapt", "uniform-progress"), ("coadapt", "ondemand-only")),
}


def _ratios(experiment: str, s: dict) -> dict:
    """The ratios of :data:`_RATIOS`, ``"a / b"``: cost and mean JCT; those whose strategies
    did not run are left out."""
    return {
        f"{a} / {b}": {
            "cost": s[a]["cost_usd"] / s[b]["cost_usd"],
            "mean_jct": s[a]["mean_jct_s"] / s[b]["mean_jct_s"],
        }
        for a, b in _RATIOS[experiment]
        if a in s and b in s
    }


if __name__ == "__main__":
    sys.exit(main())
