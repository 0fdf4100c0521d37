"""The ``coadapt`` command line: thin — parse, build objects, call the core, print."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from autoscaler import __version__
from autoscaler.cli.cluster import register as register_cluster_commands
from autoscaler.cli.common import CoadaptGroup
from autoscaler.cli.cost import cost_app
from autoscaler.cli.deploy import register as register_deploy_commands
from autoscaler.cli.prices import prices_app
from autoscaler.cli.tokens import register as register_token_commands
from autoscaler.decide.views import PolicyName

if TYPE_CHECKING:
    from autoscaler.sim.cluster import ClusterSpec

app = typer.Typer(
    rich_markup_mode=None,  # plain help: option names whole at 80 columns
    cls=CoadaptGroup,  # usage errors in the one error style
    name="coadapt",
    help=(
        "Coadapt: goodput-driven autoscaling of elastic PyTorch training on spot GPU fleets.\n\n"
        "Decides every job's GPUs, placement, batch size and learning-rate scaling each round "
        "(Pollux); replays workloads on a simulated cluster (simulate)."
    ),
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(cost_app, name="cost")
app.add_typer(prices_app, name="prices")
register_cluster_commands(app)
register_deploy_commands(app)
register_token_commands(app)


@app.callback()
def _root() -> None:
    """coadapt: goodput-driven autoscaling of elastic PyTorch training on spot GPU fleets."""


@app.command()
def version() -> None:
    """Print coadapt's version."""
    typer.echo(f"coadapt {__version__}")


@app.command()
def simulate(
    workload: Path | None = typer.Argument(
        None, help="Workload CSV (name,time,application,num_replicas,batch_size) or a folder."
    ),
    policy: list[PolicyName] = typer.Option(
        [PolicyName.COADAPT],
        "--policy",
        "-p",
        help="Scheduling policy (repeatable): coadapt (the default), pollux (the paper's, the "
        "reference), tiresias, optimus.",
    ),
    nodes: int = typer.Option(16, "--nodes", min=1, help="Nodes in the cluster (all T4)."),
    gpus_per_node: int = typer.Option(4, "--gpus-per-node", min=1, help="GPUs per node."),
    cluster: Path | None = typer.Option(
        None,
        "--cluster",
        help="YAML file of node groups (gpu_type, gpus_per_node, count) for a cluster of "
        "several GPU types; replaces --nodes/--gpus-per-node. Example: "
        "examples/clusters/mixed-64.yaml.",
    ),
    traces: Path | None = typer.Option(
        None,
        "--traces",
        help="Trace folder with one sub-folder per application (placements.csv, "
        "scalability.csv, validation-<M>.csv, optional placements-<gpu>.csv) instead of the "
        "shipped Pollux traces.",
    ),
    interval_s: float = typer.Option(60.0, "--interval-s", help="Scheduling round, seconds."),
    restart_delay_s: float = typer.Option(
        30.0, "--restart-delay-s", help="Cost of a rescale, seconds."
    ),
    interference: float = typer.Option(
        0.0, "--interference", help="Slowdown of multi-node jobs sharing a node, 0-1."
    ),
    avoid_interference: bool = typer.Option(
        True, "--avoid-interference/--allow-interference", help="Pollux: one multi-node job a node."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of randomised policies, >= 0."),
    lengths: str = typer.Option(
        "declared",
        "--lengths",
        help="What the policy may know of job lengths, as a controller would: declared "
        "(every job's script declares its length) or none.",
    ),
    world: str = typer.Option(
        "ideal",
        "--world",
        help="The world's own truths: ideal (restarts of exactly --restart-delay-s, exact "
        "trainer reports, boots of the sizing's provisioning delay: the paper simulator's "
        "world) or measured (restarts measured on our trainer and scaled by each model's "
        "checkpoint, noisy reports, boots from public start-up measurements); "
        "measured-restarts or measured-reports: the ideal world with only that truth measured "
        "(ablations).",
    ),
    speed_error: float = typer.Option(
        0.0,
        "--speed-error",
        help="Each (application, GPU type) pair whose speed comes from the speed table runs "
        "at its ratio times a seeded factor within 1 +- this (0-0.9).",
    ),
    suite: str | None = typer.Option(
        None,
        "--suite",
        help="The suite: 'paper' runs the paper's eight workloads under coadapt and the "
        "paper's three policies.",
    ),
    load: str | None = typer.Option(
        None, "--load", help="Load of the paper suite: 1.0 (default) or 0.5; needs --suite."
    ),
    fleet: str | None = typer.Option(
        None,
        "--fleet",
        help="Cloud mode: run on priced AWS instances (us-east-1, spot capacity from the Bamboo "
        "traces) sized every round by this fleet strategy, which also picks the policy: "
        "coadapt, coadapt-ondemand, coadapt-t4, coadapt-v100, coadapt-a100, static-ondemand, "
        "pollux-autoscale, throughput-autoscale, throughput-anytype or cheapest-spot. Runs in "
        "one process; the "
        "results JSON (--out) carries each run's cost record for 'coadapt cost report'.",
    ),
    budget_usd_per_hour: float | None = typer.Option(
        None, "--budget-usd-per-hour", help="Cloud mode: cap on the fleet's price, USD/hour."
    ),
    floor: bool = typer.Option(
        False,
        "--floor",
        help="Cloud mode: also compute each run's cost floor, the least any fleet on the "
        "experiment's offerings could have paid for the same work, (a) with no time limit and "
        "(b) every job by its finish time here; printed, and kept in --out for 'coadapt cost "
        "report'. Seconds per run.",
    ),
    processes: int = typer.Option(2, "--processes", "-j", min=1, help="Parallel workers."),
    out: Path | None = typer.Option(None, "--out", "-o", help="Write the results JSON here."),
    timing: bool = typer.Option(False, "--timing", help="Include policy wall times in --out."),
) -> None:
    """Replay workloads on a simulated GPU cluster driven by the Pollux traces; report JCTs.

    A folder of workloads runs in parallel processes. With --suite paper, the paper's eight
    workloads at --load run under coadapt and the paper's pollux, tiresias and optimus, the
    latter three next to their published results.
    JCT: job completion time (submission to finish). FTF: finish-time fairness, a job's JCT over
    its JCT alone on 1/N of the cluster (N: jobs present on average); below 1 is better than fair.
    """
    from autoscaler.sim.runner import limit_threads

    limit_threads()  # before numpy/scipy load: a threaded BLAS slows the model fits a lot
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from autoscaler.sim.config import LENGTHS, SimConfig
    from autoscaler.sim.results import results_table, write_results_json
    from autoscaler.sim.runner import PAPER_POLICIES, RunSpec, paper_workloads, run_many
    from autoscaler.sim.workload import workload_files
    from coadapt_common.errors import CoadaptError

    console, err = Console(), Console(stderr=True)
    if suite not in (None, "paper"):
        raise typer.BadParameter("the only suite is 'paper'", param_hint="--suite")
    if suite is None and workload is None:
        raise typer.BadParameter("give a WORKLOAD file or folder, or --suite paper")
    _check_simulate_args(workload, suite, load, seed, interval_s, restart_delay_s, out)
    if lengths not in LENGTHS:
        _usage_error(f"--lengths must be one of {', '.join(LENGTHS)}, got {lengths!r}")
    load = load or "1.0"
    try:
        files = paper_workloads(load) if suite else workload_files(workload)  # type: ignore[arg-type]
        if not files:
            _usage_error(f"{workload}: folder holds no *.csv workload file")
        cluster_spec = None
        if cluster is not None:
            cluster_spec = _load_cluster(cluster, files, traces)
        config = SimConfig(
            num_nodes=nodes,
            gpus_per_node=gpus_per_node,
            cluster=cluster_spec,
            traces_dir=None if traces is None else str(traces),
            interval_s=interval_s,
            restart_delay_s=restart_delay_s,
            interference=interference,
            interference_avoidance=avoid_interference,
            seed=seed,
            lengths=lengths,
            world=world,
            speed_error=speed_error,
        )
        suite_policies = [PolicyName.COADAPT, *PAPER_POLICIES]
        policies = suite_policies if suite else list(dict.fromkeys(policy))
        specs = [RunSpec(str(f), p, config) for p in policies for f in files]
        if fleet is not None:
            specs = [_fleet_spec(str(f), fleet, budget_usd_per_hour, config) for f in files]
            processes = 1
        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        single = len(specs) == 1  # one run: jobs completed; several: runs completed
        bar = Progress("{task.description}", *columns, console=err)
        task = bar.add_task(
            "jobs done" if single else "runs done", total=None if single else len(specs)
        )
        try:
            results = run_many(
                specs,
                processes=processes,
                on_start=bar.start,  # after every workload validated: bad input shows no bar
                on_done=None if single else lambda _s, _r: bar.advance(task),
                on_round=lambda _t, done, total: bar.update(task, completed=done, total=total),
            )
        finally:
            if bar.live.is_started:
                bar.stop()
        if floor and fleet is not None:
            results = _with_floors(specs, results, fleet)
    except CoadaptError as e:
        typer.echo(f"coadapt: {e}", err=True)  # plain text: names file, line and field verbatim
        raise typer.Exit(code=2) from None
    from autoscaler.sim.runner import compare_with_paper

    paper = compare_with_paper(results, load) if suite else None
    console.print(results_table(results, paper, title_suffix=f"paper suite at {load}x"))
    if fleet is not None:
        from autoscaler.accounting.costs import summarize, usd_to_cents

        for r in results:
            if r.cost is not None:
                s = summarize(r.cost)
                console.print(
                    f"{r.workload}: {fleet} cost ${usd_to_cents(s.total_usd)}, "
                    f"{s.instance_hours:.1f} instance-hours, {s.preemptions} preemptions, "
                    f"peak {s.peak_instances} instances"
                )
            if r.floor is not None:
                over = r.floor["cost_over_floor"]
                console.print(
                    f"{r.workload}: cost floor ${r.floor['floor_usd']:.2f} (no time limit), "
                    f"${r.floor['floor_at_jct_usd']:.2f} (every job by its JCT here); "
                    f"cost / floor {'-' if over is None else f'{over:.2f}'}"
                )
    if out is not None:
        write_results_json(out, results, include_timing=timing)
        console.print(f"results written to {out}")


def _experiment_of(fleet: str) -> str:
    from autoscaler.sim.experiments import EXPERIMENTS

    return "E2" if fleet in EXPERIMENTS["E2"] else "E3" if fleet in EXPERIMENTS["E3"] else "E1"


def _with_floors(specs: list, results: list, fleet: str) -> list:
    """``results`` (of ``specs``, in order) each with its cost floor over the whole menu of
    ``fleet``'s experiment (:func:`autoscaler.sim.floor_inputs.run_floor`)."""
    from dataclasses import replace

    from autoscaler.sim.experiments import experiment_menu
    from autoscaler.sim.floor_inputs import run_floor
    from autoscaler.sim.workload import load_workload

    menu = experiment_menu(_experiment_of(fleet))
    return [
        replace(r, floor=run_floor(load_workload(spec.workload).jobs, r, offerings=menu))
        if r.cost is not None
        else r
        for spec, r in zip(specs, results, strict=True)
    ]


def _fleet_spec(workload: str, fleet: str, budget: float | None, config: Any) -> Any:
    """The run of ``workload`` under fleet strategy ``fleet`` (cloud mode)."""
    from dataclasses import replace

    from autoscaler.decide.sizing import SizingConfig
    from autoscaler.sim.experiments import EXPERIMENTS, build_run
    from autoscaler.sim.runner import RunSpec

    experiment = _experiment_of(fleet)
    if fleet not in EXPERIMENTS[experiment]:
        names = sorted({n for names in EXPERIMENTS.values() for n in names})
        raise typer.BadParameter(f"unknown strategy {fleet!r}; one of {', '.join(names)}")
    run = build_run(
        experiment,
        fleet,
        sizing=SizingConfig(budget_usd_per_hour=budget),
        seed=config.seed,
        world=config.world,
    )
    options = tuple(sorted(run.policy_options.items()))
    return RunSpec(workload, PolicyName(run.policy), replace(config, cloud=run.cloud), options)


def _load_cluster(path: Path, files: list, traces: Path | None) -> ClusterSpec:
    """The cluster file, checked against the GPU types the workloads' applications can run on."""
    from autoscaler.model.gputypes import default_speed_table
    from autoscaler.sim.cluster import load_cluster
    from autoscaler.sim.workload import load_workload

    apps = sorted({job.application for f in files for job in load_workload(f).jobs})
    return load_cluster(path, speeds=default_speed_table(), applications=apps, traces_root=traces)


def _usage_error(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit status 2."""
    typer.echo(f"coadapt: {message}", err=True)
    raise typer.Exit(code=2)


def _check_simulate_args(
    workload: Path | None,
    suite: str | None,
    load: str | None,
    seed: int,
    interval_s: float,
    restart_delay_s: float,
    out: Path | None,
) -> None:
    """What can be checked before any simulation runs (so that no run's results are lost)."""
    if load is not None and suite is None:
        _usage_error("--load applies only to --suite paper (a WORKLOAD runs as given)")
    if seed < 0:
        _usage_error(f"--seed must be >= 0, got {seed}")
    if not (math.isfinite(interval_s) and interval_s > 0):
        _usage_error(f"--interval-s must be a finite number of seconds > 0, got {interval_s}")
    if not (math.isfinite(restart_delay_s) and restart_delay_s >= 0):
        _usage_error(
            f"--restart-delay-s must be a finite number of seconds >= 0, got {restart_delay_s}"
        )
    if workload is not None and not workload.exists():
        _usage_error(f"{workload}: no such file or folder")
    if out is not None:
        if out.is_dir():
            _usage_error(f"--out {out}: is a folder; give a file name")
        parent = out.parent if str(out.parent) else Path(".")
        if not parent.is_dir():
            _usage_error(f"--out {out}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
            _usage_error(f"--out {out}: not writable")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
