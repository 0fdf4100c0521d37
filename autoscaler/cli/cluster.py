"""``coadapt up | submit | status | logs | cancel | retry | down | agent | demo``: a cluster
in a user's hands (thin: parse, call :mod:`autoscaler.controller`, print).

Every command finds the cluster through its state folder (``--state-dir``, default
``$COADAPT_HOME/cluster``, ``~/.coadapt/cluster`` without it): ``up`` writes ``up.json`` there
(the API URL and its pid) and the tokens file; the others read them. Only the ``local``
provider runs on this machine; ``up --provider aws|gcp`` runs on the controller machine that
``coadapt deploy`` (:mod:`autoscaler.cli.deploy`) creates.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from autoscaler.cli.common import (
    STORE_URL_FIX,
    Json,
    StateDir,
    StoreUrl,
    api_failure,
    cluster_store_location,
    deployed_client,
    fail,
    open_cluster_store,
    recorded_deployment,
    resolve_state_dir,
)
from autoscaler.cli.tables import Column, render_table


def _client(state_dir: Path | None) -> Any:
    """The API of the cluster in the state folder: the local ``coadapt up``'s (``up.json``),
    else a deployment's controller (``deploy.json``; ``COADAPT_CONTROLLER_URL`` overrides its
    address, e.g. through a tunnel)."""
    from autoscaler.controller.api import ApiClient

    state = resolve_state_dir(state_dir)
    up = state / "up.json"
    if up.exists():
        url = json.loads(up.read_text())["url"]
        return ApiClient(url, _users_token(state), timeout_s=10.0)
    if (state / "deploy.json").exists():
        return deployed_client(state, recorded_deployment(state), None)
    fail(f"no cluster is up in {state} (start one with: coadapt up --state-dir {state})")


def _users_token(state: Path) -> str:
    """The users' token of the cluster in ``state``; a one-line failure when the tokens file is
    missing, open to others or damaged."""
    from autoscaler.controller.credentials import TokenFileError, load_token

    try:
        return load_token(state / "tokens.json", "user")
    except TokenFileError as e:
        fail(str(e))


def register(app: typer.Typer) -> None:
    """Add the cluster commands to the ``coadapt`` app."""
    app.command("up")(up)
    app.command("submit")(submit)
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("cancel")(cancel)
    app.command("retry")(retry)
    app.command("describe")(describe)
    app.command("delete")(delete)
    app.command("down")(down)
    app.command("demo")(demo)
    app.command("events")(events)
    app.command("dashboard")(dashboard)
    app.command("agent")(agent)


def up(
    ctx: typer.Context,
    provider: Annotated[
        str, typer.Option(help="Where instances come from: local, aws or gcp.")
    ] = "local",
    provider_config: Annotated[
        Path | None,
        typer.Option(
            help="For aws/gcp: the deployment's provider.json (terraform writes it on the "
            "controller machine; see terraform/aws or terraform/gcp)."
        ),
    ] = None,
    cluster_id: Annotated[
        str, typer.Option(help="The cluster's id (tags every instance it launches).")
    ] = "coadapt-local",
    state_dir: StateDir = None,
    interval_s: Annotated[float, typer.Option(help="Seconds between rounds.")] = 10.0,
    host: Annotated[
        str, typer.Option(help="API address to listen on (0.0.0.0 on a cloud controller).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="API port (0: any free one).")] = 0,
    max_instances: Annotated[int, typer.Option(help="Fleet size cap.")] = 4,
    max_gpu_slots: Annotated[
        int | None, typer.Option(help="Local provider: GPU slots on this machine.")
    ] = None,
    max_gpus: Annotated[
        int | None,
        typer.Option(help="Fleet GPU cap (local default: --max-gpu-slots)."),
    ] = None,
    store: StoreUrl = None,
    new_store: Annotated[
        bool,
        typer.Option(
            "--new-store",
            help="Start with a new, empty store although the state folder holds an earlier "
            "cluster's files (an existing store is moved aside, not deleted).",
        ),
    ] = False,
    agent_interval_s: Annotated[
        float, typer.Option(help="Local provider: seconds between two polls of each agent.")
    ] = 2.0,
    heartbeat_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds an agent may go unheard, counted only while this controller runs, "
            "before its instance is presumed dead (default: max(60, 10 x --agent-interval-s))."
        ),
    ] = None,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet", "-q", help="Print only warnings: notices, preemptions, failures, refusals."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="Also print the controller's own log (rounds, jobs) on stderr."
        ),
    ] = False,
    job_isolation: Annotated[
        str,
        typer.Option(
            help="Local provider: 'user' runs each job as its own unprivileged user, away from "
            "the state folder's tokens (needs root, and the working folder and Python open to "
            "other users); 'none' runs jobs as this user; 'auto' isolates when it can and "
            "says so."
        ),
    ] = "auto",
    job_log_max_mib: Annotated[
        float,
        typer.Option(
            help="What each job's log keeps per instance, in MiB (its latest output; the "
            "rest is dropped and coadapt logs says how much)."
        ),
    ] = 64.0,
    min_free_mib: Annotated[
        float,
        typer.Option(
            help="MiB kept free on the state folder's disk: below it up refuses to start, or "
            "stops with one line and a disk-full event, and no job is started."
        ),
    ] = 64.0,
    retention_days: Annotated[
        float,
        typer.Option(
            help="Days the store keeps trainer reports, prices and events (0: forever); "
            "what the bill reads is always kept."
        ),
    ] = 30.0,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="On a cluster that coadapt down brought down: relaunch its unfinished jobs "
            "(asked on a terminal; without a terminal up refuses unless given this).",
        ),
    ] = False,
    detach: Annotated[
        bool,
        typer.Option(
            "--detach",
            "-d",
            help="Run in the background, its output in up.log in the state folder; returns "
            "once the API serves (coadapt down stops it).",
        ),
    ] = False,
    api_urls: Annotated[
        str | None,
        typer.Option(
            "--api-urls",
            help="With --store: the API addresses of every controller of the store, "
            "comma-separated (http://host:port,...), given to the local agents, which try "
            "them in turn (default: this process's own).",
        ),
    ] = None,
) -> None:
    """Run the controller (API, rounds, fleet) in the foreground, or with -d in the
    background (its output in <state-dir>/up.log). Ctrl-C or SIGTERM stops it and leaves the
    fleet and its jobs running (the next coadapt up takes them back, at the same address);
    coadapt down releases every instance and stops it, also when up is no longer running.
    On a cluster that coadapt down brought down, its unfinished jobs are relaunched only
    with --resume (asked on a terminal). On aws/gcp it runs on the controller machine a
    deployment made (coadapt deploy), reading that deployment's provider config.

    With --store (PostgreSQL), several up processes may share one store, on one machine
    (one state folder, each with its own --port) or several: every one serves the API, one
    leads (a lease in the store) and runs the rounds, the others stand by and take over
    within two round intervals when it dies; each says whether it leads or stands by.

    It prints one line per event that matters (launch, ready, notice, preemption, rescale,
    move, rebatch, refusal, completion, release, ...), with its time and its reason; coadapt
    events shows the same story from the store."""
    from autoscaler.controller.credentials import TokenFileError
    from autoscaler.controller.events import Event, format_event
    from autoscaler.controller.service import (
        BroughtDownError,
        ServiceError,
        UpConfig,
        run_up,
        unfinished_after_down,
        up_is_stale,
    )
    from autoscaler.controller.store.postgres import is_postgres_url, masked_url
    from autoscaler.errors import InvalidInputError

    os.umask(0o077)  # what up and its agents write is private to this user
    if provider not in ("local", "aws", "gcp"):
        fail(f"--provider {provider}: choose local, aws or gcp.", 2)
    if provider != "local" and provider_config is None:
        fail(f"--provider {provider} needs --provider-config (the deployment's provider.json)", 2)
    if interval_s <= 0 or max_instances < 1:
        fail("--interval-s must be > 0 and --max-instances >= 1", 2)
    if not 0 < agent_interval_s <= 3600 or not (
        heartbeat_timeout_s is None or 0 < heartbeat_timeout_s <= 86400
    ):
        fail("--agent-interval-s must be in (0, 3600] and --heartbeat-timeout-s in (0, 86400]", 2)
    if max_gpu_slots is not None and max_gpu_slots < 1:
        fail(
            f"--max-gpu-slots {max_gpu_slots}: the local provider needs at least 1 GPU slot; "
            "give a count >= 1, or leave it out for 2 per CPU core",
            2,
        )
    if max_gpus is not None and max_gpus < 1:
        fail(f"--max-gpus {max_gpus}: give a count >= 1, or leave it out", 2)
    if not 0 <= port <= 65535:
        fail(f"--port {port}: give a port 1-65535, or 0 for the recorded one", 2)
    if quiet and verbose:
        fail("--quiet and --verbose: choose one", 2)
    if not 0.0625 <= job_log_max_mib <= 1 << 20 or not 0 <= min_free_mib <= 1 << 30:
        fail("--job-log-max-mib must be 0.0625-1048576 and --min-free-mib 0-2**30", 2)
    if not 0 <= retention_days <= 36_500:
        fail(f"--retention-days {retention_days}: give 0 (forever) to 36500", 2)
    if store is not None and not is_postgres_url(store):
        fail(STORE_URL_FIX, 2)
    _configure_logging(verbose=verbose)
    state = resolve_state_dir(state_dir)
    if state.exists() and not state.is_dir():
        fail(f"--state-dir {state} is a file, not a folder; name a folder (created if missing)", 2)
    if store is None and not new_store:  # a team's store, as cluster.json records it
        recorded = cluster_store_location(state, None)
        if isinstance(recorded, str):
            store = recorded
            typer.echo(f"coadapt: the store is {masked_url(store)}, as {state / 'cluster.json'} "
                       "records it (its password from PGPASSWORD or ~/.pgpass)")  # fmt: skip
    urls: tuple[str, ...] = ()
    if api_urls is not None:
        urls = tuple(u.strip() for u in api_urls.split(",") if u.strip())
        if (
            store is None
            or not urls
            or len(urls) > 16
            or not all(re.fullmatch(r"https?://[\w.\-]+(:\d{1,5})?", u) for u in urls)
        ):
            fail("--api-urls takes, with --store, up to 16 addresses http://host:port, "
                 "comma-separated", 2)  # fmt: skip
    if (state / "up.json").exists() and store is not None and not up_is_stale(state / "up.json"):
        typer.echo("coadapt: another coadapt up serves this folder; this one shares its store "
                   "(the leader lease decides which runs the rounds)")  # fmt: skip
    if (state / "up.json").exists() and store is None:
        if not up_is_stale(state / "up.json"):
            fail(f"a cluster is already up in {state} (coadapt down --state-dir {state})")
        typer.echo(f"coadapt: {state / 'up.json'} was left by a coadapt up that is gone; "
                   "starting again (the store picks up where it stopped)")  # fmt: skip
        (state / "up.json").unlink()
    waiting = () if resume or new_store else unfinished_after_down(state, store)
    if waiting:
        if not sys.stdin.isatty():
            fail(str(BroughtDownError(state, waiting)))
        resume = typer.confirm(
            f"coadapt: {state} was brought down (coadapt down) with {len(waiting)} unfinished "
            f"job(s): {', '.join(waiting)}. Relaunch them (instances are launched for them)?",
            default=False,
        )
        if not resume:
            fail(f"not started; coadapt up --resume --state-dir {state} relaunches them, "
                 "--new-store starts empty")  # fmt: skip
    if detach:
        _detach(ctx, state, resume=resume)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    cfg = UpConfig(
        state,
        cluster_id=cluster_id,
        interval_s=interval_s,
        host=host,
        port=port,
        max_instances=max_instances,
        max_gpu_slots=max_gpu_slots,
        max_gpus=max_gpus,
        provider=provider,
        provider_config=provider_config,
        new_store=new_store,
        job_isolation=job_isolation,
        job_log_max_bytes=int(job_log_max_mib * (1 << 20)),
        min_free_bytes=int(min_free_mib * (1 << 20)),
        agent_interval_s=agent_interval_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        retention_s=retention_days * 86_400.0 or None,
        resume=resume,
        store_url=store,
        api_urls=urls,
    )

    def ready(url: str) -> None:
        where = f"store {masked_url(store)}, " if store else ""
        typer.echo(f"coadapt: up at {url} ({where}{state})")
        typer.echo(f"coadapt: the dashboard's address: coadapt dashboard --state-dir {state}")

    def told(event: Event) -> None:
        if event.warning or not quiet:
            typer.echo(format_event(event))

    try:
        report = run_up(
            cfg,
            stop,
            on_ready=ready,
            on_event=told,
            on_note=lambda line: typer.echo(f"coadapt: {line}"),
        )
    except InvalidInputError as e:
        fail(str(e), 2)
    except TokenFileError as e:
        fail(str(e))
    except ServiceError as e:
        fail(str(e))
    if not report.released:
        typer.echo(
            f"coadapt: stopped; {len(report.remaining)} instance(s) and their jobs keep running "
            f"(coadapt up --state-dir {state} takes them back, coadapt down releases them)"
        )
        return
    if not report.clean:
        fail(f"instances still listed after down: {', '.join(report.remaining)}")
    typer.echo("coadapt: down; no instance left")


UP_LOG = "up.log"
"""Where ``coadapt up -d`` writes its output, in the state folder (appended to)."""
DETACH_WAIT_S = 120.0
"""How long ``coadapt up -d`` waits for the background ``up`` to serve before it gives up."""


def _detach(ctx: typer.Context, state: Path, *, resume: bool) -> None:
    """``coadapt up -d``: start the same ``coadapt up`` (every option given, less ``-d``) as
    its own session in the background, its output appended to ``<state>/up.log``, and return
    once it serves (its ``up.json`` names it), saying where its log is; a background ``up``
    that exits first fails here with the end of its log."""
    import subprocess

    from autoscaler.controller.service import UpRecord

    argv = [sys.executable, "-m", "autoscaler.cli", "up"]
    store = ctx.params.get("store")
    store_env = {"COADAPT_STORE_URL": str(store)} if store else {}
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        # Said below, or not passed on (the store's URL goes in the environment: it may hold
        # a password, and a command line is seen by every user of the machine).
        own = param.name in ("detach", "resume", "state_dir", "store")
        if own or value is None or value == param.default:
            continue
        if getattr(param, "is_flag", False):
            names = param.opts if value else getattr(param, "secondary_opts", [])
            argv += names[:1]
        else:
            argv += [param.opts[0], str(value)]
    if resume:
        argv.append("--resume")
    argv += ["--state-dir", str(state)]
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = state / UP_LOG
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            start_new_session=True,  # no SIGHUP when the terminal closes
            env={**os.environ, "PYTHONUNBUFFERED": "1", **store_env},
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + DETACH_WAIT_S
    while time.monotonic() < deadline:
        record = UpRecord.read(state / "up.json")
        if record is not None and record.pid == child.pid:
            typer.echo(f"coadapt: up at {record.url} in the background (pid {child.pid}); its "
                       f"log: {log_path}; coadapt down --state-dir {state} stops it")  # fmt: skip
            return
        code = child.poll()
        if code is not None:
            with open(log_path, "rb") as f:
                f.seek(start)
                said = f.read().decode(errors="replace").strip().splitlines()
            for line in said[:-1]:
                typer.echo(line, err=True)
            last = said[-1].removeprefix("coadapt: ") if said else "(no output)"
            fail(f"the background coadapt up exited ({code}): {last}")
        time.sleep(0.1)
    fail(
        f"the background coadapt up (pid {child.pid}) does not serve after "
        f"{DETACH_WAIT_S:.0f} s; see {log_path} (coadapt down --state-dir {state} stops it)"
    )


def submit(
    spec: Annotated[Path, typer.Argument(help="The job's YAML spec.")],
    state_dir: StateDir = None,
    json_out: Json = False,
    name: Annotated[
        str | None,
        typer.Option(
            "--name", help="Submit the spec under this job name instead of the one it gives."
        ),
    ] = None,
) -> None:
    """Submit a job (YAML spec: see examples/jobs/)."""
    from autoscaler.controller.api import ApiError
    from autoscaler.controller.jobbook import JobSubmission
    from autoscaler.controller.jobspec import JobSpecError, load_job_spec
    from autoscaler.errors import InvalidInputError

    # A cluster on this machine runs the script from this machine's disk: its path is the
    # spec folder's, checked here. A deployed cluster's nodes have their own disks.
    state = resolve_state_dir(state_dir)
    deployed = not (state / "up.json").exists() and (state / "deploy.json").exists()
    try:
        parsed = load_job_spec(spec, resolve=not deployed)
        submission = parsed.submission()
    except JobSpecError as e:
        fail(str(e), 2)
    if name is not None:  # the one check of a job's fields, the new name included
        try:
            fields = json.loads(submission.to_json())
            submission = JobSubmission.from_mapping({**fields, "name": name})
        except InvalidInputError as e:
            fail(f"--name {name[:80]!r}: {e}", 2)
    try:
        job = _client(state_dir).submit_job(submission)
    except ApiError as e:
        fail(api_failure(e, state_dir))
    typer.echo(json.dumps(job.to_dict()) if json_out else f"submitted {job.name}")


def _stored_status(state: Path, store_url: str | None) -> dict[str, Any]:
    """What :func:`_status_doc` answers, read from the cluster's store (opened read-only)."""
    from autoscaler.controller.api import instance_to_dict, jobs_in_store
    from autoscaler.controller.errors import StoreError

    try:
        with open_cluster_store(state, store_url) as store:
            jobs = [j.to_dict() for j in jobs_in_store(store)]
            instances = [instance_to_dict(r) for r in store.list_instances()]
    except StoreError as e:
        fail(str(e))
    return {"jobs": jobs, "instances": instances}


def _status_doc(client: Any) -> dict[str, Any]:
    jobs = [j.to_dict() for j in client.list_jobs()]
    from autoscaler.controller.api import instance_to_dict

    instances = [instance_to_dict(r) for r in client.list_instances()]
    leader = client.fleet().get("leader")
    return {"jobs": jobs, "instances": instances, "leader": leader}


def leader_line(leader: dict[str, Any] | None, now_s: float) -> str | None:
    """The line ``coadapt status`` prints about the controllers of a shared store: which one
    leads and since when (``None``: a store with one controller, nothing to say)."""
    if not leader or not leader.get("shared") or leader.get("holder") is None:
        return None
    since = leader.get("since_s")
    when = "" if since is None else f" since {clock_text(float(since), now_s)}"
    return f"leader: {leader['holder']} (epoch {leader['epoch']}){when}"


JOB_COLUMNS = (
    Column("job", key=True),
    Column("status"),
    Column("GPUs", numeric=True),
    Column("batch", numeric=True, drop_rank=5),
    Column("progress", numeric=True),
    Column("restarts", numeric=True, drop_rank=1),
    Column("retries", numeric=True, drop_rank=2),
    Column("submitted", numeric=True, drop_rank=3),
    Column("started", numeric=True, drop_rank=4),
    Column("elapsed", numeric=True, drop_rank=6),
    Column("ETA", numeric=True, drop_rank=8),
    Column("deadline", numeric=True, drop_rank=7),
)
INSTANCE_COLUMNS = (
    Column("instance", key=True),
    Column("status"),
    Column("offering", drop_rank=1, key=True),
    Column("GPUs"),
    Column("$/h", numeric=True),
)
SHOWN_REASONS = ("failed", "refused")  # ended with a cause: always said
"""Job statuses whose reason ``coadapt status`` prints under the table (a queued or running
job's reason is said when it failed before: ``last failure``)."""


def job_cause(job: dict[str, Any]) -> str | None:
    """The one line ``coadapt status`` prints for a job under its table: why it failed or was
    refused, or (queued or running again after a failure) its last failure; None when there
    is nothing to say (a completed job, a cancelled one, one that never failed)."""
    reason = job.get("reason")
    if not reason:
        return None
    if job["status"] in SHOWN_REASONS:
        return f"{job['name']} ({job['status']}): {reason}"
    if job["status"] in ("queued", "running") and job.get("retries", 0) > 0:
        return f"{job['name']} ({job['status']}, retry {job['retries']}): last failure: {reason}"
    return None


def clock_text(at_s: float | None, now_s: float) -> str:
    """A time in a table cell: ``HH:MM:SS`` (local) within a day of ``now_s``, else
    ``YYYY-MM-DD HH:MM``; ``-`` for none."""
    if at_s is None:
        return "-"
    form = "%H:%M:%S" if abs(now_s - at_s) < 86_400 else "%Y-%m-%d %H:%M"
    return time.strftime(form, time.localtime(at_s))


def span_text(seconds: float) -> str:
    """A duration in a table cell: ``42s``, ``7m05s``, ``3h02m``, ``2d04h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


def eta_text(eta_s: float | None, now_s: float) -> str:
    """A job's ETA in a table cell, relative to ``now_s``: ``in 3m05s``; ``now`` once it is
    due; ``-`` for none (not running, no declared length or model yet, a cluster not up)."""
    if eta_s is None:
        return "-"
    left = float(eta_s) - now_s
    return "now" if left < 1.0 else f"in {span_text(left)}"


def elapsed_s(job: dict[str, Any], now_s: float) -> float | None:
    """How long a job has run since its first placement: to its last change once it ended,
    else to ``now_s`` (``None``: never started)."""
    started = job.get("started_at_s")
    if started is None:
        return None
    end = job.get("updated_at_s", now_s) if job["status"] in ENDED else now_s
    return max(0.0, float(end) - float(started))


def _render_status(doc: dict[str, Any], *, wide: bool = False) -> None:
    """The jobs and the live instances as two tables fitted to the terminal (``wide``: every
    column), and under the jobs one line per failed or refused job with its cause."""
    from rich.console import Console

    console = Console()
    now_s = time.time()
    rows = []
    for j in doc["jobs"]:
        gpus = sum(j.get("assignment", {}).values())
        progress, target = j.get("progress"), j.get("target_progress")
        shown = "-" if progress is None else f"{progress:.0f}"
        if progress is not None and target:
            shown += f"/{target:.0f}"
        batch = "-"
        if j.get("batch_size"):
            batch = f"{j['batch_size']}"
            if j.get("accumulation_steps", 1) > 1:
                batch += f" ({j['local_batch_size']}x{j['accumulation_steps']})"
        rows.append(
            [
                j["name"],
                j["status"],
                str(gpus),
                batch,
                shown,
                str(j.get("restarts", 0)),
                str(j.get("retries", 0)),
                clock_text(j.get("submitted_at_s"), now_s),
                clock_text(j.get("started_at_s"), now_s),
                "-" if (took := elapsed_s(j, now_s)) is None else span_text(took),
                eta_text(j.get("eta_s"), now_s),
                clock_text(j.get("deadline_s"), now_s),
            ]
        )
    render_table(console, JOB_COLUMNS, rows, title="jobs", wide=wide)
    for j in doc["jobs"]:
        line = job_cause(j)
        if line is not None:  # one line whatever its length (the terminal wraps it)
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    live = [i for i in doc["instances"] if i["status"] not in ("terminated", "allocation_failed")]
    fleet = [
        [
            i["instance_key"],
            i["status"],
            i["offering_key"],
            f"{i['gpus']} x {i['gpu_type']}",
            f"{i['price_usd_per_hour']:.4f}",
        ]
        for i in live
    ]
    render_table(console, INSTANCE_COLUMNS, fleet, title="instances", wide=wide)
    said = leader_line(doc.get("leader"), now_s)
    if said is not None:
        console.print(said, markup=False, highlight=False, soft_wrap=True)


def status(
    state_dir: StateDir = None,
    json_out: Json = False,
    watch: Annotated[
        bool, typer.Option("--watch", help="Refresh every 2 s (Ctrl-C stops).")
    ] = False,
    wide: Annotated[
        bool, typer.Option("--wide", help="Show every column, however wide the terminal.")
    ] = False,
    store_url: StoreUrl = None,
) -> None:
    """Jobs (status, GPUs, batch, progress, submitted, started, elapsed, ETA, deadline, and
    why a job failed or was refused) and the fleet (offering, $/h); of a local cluster that
    is not up, as its store last recorded them (read-only). The ETA is a running job's, by
    its fitted model at the GPUs it holds, once its length is known (its script's
    declaration, else its spec's length:; "-" otherwise, and for a cluster that is not up).
    Times are local; --json gives them as Unix seconds, the deadline also as deadline_utc
    (ISO-8601 UTC), fixed at submission, the ETA as eta_s and eta_utc."""
    from autoscaler.controller.api import ApiError

    state = resolve_state_dir(state_dir)
    stored = (
        not any((state / f).exists() for f in ("up.json", "deploy.json"))
        and cluster_store_location(state, store_url) is not None
    )
    client = None if stored else _client(state_dir)
    if stored:
        typer.echo(f"coadapt: no cluster is up in {state}; as its store last recorded it", err=True)
    while True:
        try:
            doc = _status_doc(client) if client is not None else _stored_status(state, store_url)
        except ApiError as e:
            fail(api_failure(e, state_dir))
        if json_out:
            typer.echo(json.dumps(doc))
        else:
            _render_status(doc, wide=wide)
        if not watch:
            return
        time.sleep(2.0)


ENDED = ("completed", "failed", "cancelled", "refused")
FOLLOW_POLL_S = 1.0  # how often logs -f looks for new lines and the job's status


class _LogSource:
    """Where ``coadapt logs`` reads a job's logs and status: the state folder itself when the
    cluster's store is known there (a local cluster, up or not: ``store.db``, or the database
    ``cluster.json`` records or ``store_url`` names), else the deployment's API."""

    def __init__(self, state_dir: Path | None, job: str, store_url: str | None = None) -> None:
        from autoscaler.controller.api import JOB_NAME_PATTERN

        self.state = resolve_state_dir(state_dir)
        self.job = job
        self.store: Any = None
        self.client: Any = None
        self.collapser: Any = None  # what coadapt logs shows (_print_logs)
        if not JOB_NAME_PATTERN.fullmatch(job):
            fail(
                f"{job!r} is not a job name; coadapt status --state-dir {self.state} lists them", 2
            )
        if cluster_store_location(self.state, store_url) is not None:
            from autoscaler.controller.errors import StoreError
            from autoscaler.controller.service import ServiceError
            from autoscaler.controller.service import open_cluster_store as open_store
            from coadapt_common.clock import SystemClock

            try:
                self.store = open_store(self.state, SystemClock(), store_url=store_url)
            except (StoreError, ServiceError) as e:
                fail(f"{e}; the job logs are in {self.state / 'logs' / job}")
        else:
            self.client = _client(state_dir)
        self.status()  # an unknown job fails here, before anything is printed

    def status(self) -> tuple[str, str | None]:
        """The job's status and reason now."""
        from autoscaler.controller.api import ApiError
        from autoscaler.controller.errors import StoreError, UnknownRowError

        try:
            if self.store is not None:
                row = self.store.get_job(self.job)
                return row.status.value, row.reason
            info = self.client.get_job(self.job)
            return info.status.value, info.reason
        except ApiError as e:
            fail(api_failure(e, self.state))
        except StoreError as e:
            if not isinstance(e, UnknownRowError):
                fail(f"{e}; the job logs are in {self.state / 'logs' / self.job}")
            fail(f"no job {self.job!r} in {self.state}; coadapt status --state-dir "
                 f"{self.state} lists the jobs")  # fmt: skip

    def chunk(self, offset: int) -> Any:
        """The logs from byte ``offset`` (a :class:`~autoscaler.controller.api.LogChunk`)."""
        from autoscaler.controller.api import ApiError, read_job_logs

        if self.store is not None:
            return read_job_logs(self.state / "logs", self.job, offset)
        try:
            return self.client.job_logs(self.job, offset)
        except ApiError as e:
            fail(api_failure(e, self.state))

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def logs(
    job: Annotated[str, typer.Argument(help="The job's name.")],
    state_dir: StateDir = None,
    follow: Annotated[
        bool,
        typer.Option(
            "-f",
            "--follow",
            help="Keep printing new lines until the job ends (a queued job is waited for; "
            "Ctrl-C stops).",
        ),
    ] = False,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s", help="With --follow: stop after this many seconds (default: none)."
        ),
    ] = None,
    json_out: Json = False,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Write the logs as the job wrote them, terminal escapes included (by "
            "default every control character but line breaks and tabs is shown as ?).",
        ),
    ] = False,
    store_url: StoreUrl = None,
) -> None:
    """A job's logs (every instance it ran on), read from the state folder whether or not
    the cluster is up (a deployed cluster's through its controller). What the job wrote
    cannot drive your terminal: escapes (a title change, a screen clear, colours) are shown
    as ?, unless --raw. A torchrun traceback seen before (the launcher's, after each failed
    try) is one line; the script's own output is shown whole (--raw: all of it)."""
    if timeout_s is not None and not timeout_s > 0:
        fail(f"--timeout-s {timeout_s}: give a number of seconds > 0, or leave it out", 2)
    source = _LogSource(state_dir, job, store_url)
    try:
        if json_out:
            typer.echo(json.dumps(source.chunk(0).to_dict()))
            return
        offset = _print_logs(source, 0, raw, ended=not follow)
        if not follow:
            if offset == 0:  # nothing written yet: say why
                status, reason = source.status()
                why = f" ({reason})" if reason and status in SHOWN_REASONS else ""
                typer.echo(f"coadapt: {job} is {status}{why}; no logs yet", err=True)
            return
        _follow(source, offset, timeout_s, raw)
    finally:
        source.close()


def _print_logs(source: _LogSource, offset: int, raw: bool = False, *, ended: bool = True) -> int:
    """Print everything from ``offset`` that is there now (its control characters shown as
    ``?`` and torchrun's repeated tracebacks as one line, unless ``raw``:
    :func:`~autoscaler.controller.api.printable`,
    :class:`~autoscaler.controller.api.logs.TracebackCollapser`); the offset after it. With
    ``ended`` false (following), a traceback still being written is held for the next call."""
    from autoscaler.controller.api import printable
    from autoscaler.controller.api.logs import TracebackCollapser

    collapser = source.collapser
    if collapser is None and not raw:
        collapser = source.collapser = TracebackCollapser()
    while True:
        chunk = source.chunk(offset)
        text = chunk.text if collapser is None else collapser.feed(chunk.text)
        last = not chunk.more or chunk.next_offset == offset
        if last and ended and collapser is not None:
            text += collapser.flush()
        sys.stdout.write(text if raw else printable(text, lines=True))
        sys.stdout.flush()
        if last:
            return int(chunk.next_offset)
        offset = chunk.next_offset


def _follow(source: _LogSource, offset: int, timeout_s: float | None, raw: bool = False) -> None:
    """Print new lines until the job ends (then its status on stderr: exit status 0 when it
    completed, 1 otherwise) or ``timeout_s`` passes; a queued job is waited for."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    told_queued = False
    while True:
        status, reason = source.status()
        # after the status: nothing written before it ends
        offset = _print_logs(source, offset, raw, ended=status in ENDED)
        if status in ENDED:
            if status == "completed":
                return
            fail(f"job {source.job} {status}" + (f": {reason}" if reason else ""))
        if status == "queued" and not told_queued:
            typer.echo(
                f"coadapt: {source.job} is queued; waiting for it to start (Ctrl-C stops)",
                err=True,
            )
            told_queued = True
        if deadline is not None and time.monotonic() >= deadline:
            fail(f"job {source.job} still {status} after {timeout_s:g} s; run coadapt logs -f "
                 "again to go on following")  # fmt: skip
        time.sleep(FOLLOW_POLL_S)


def cancel(
    job: Annotated[str, typer.Argument(help="The job's name.")],
    state_dir: StateDir = None,
) -> None:
    """Cancel a job (its processes stop at the next round)."""
    from autoscaler.controller.api import ApiError

    try:
        info = _client(state_dir).cancel_job(job)
    except ApiError as e:
        fail(api_failure(e, state_dir))
    typer.echo(f"{info.name}: {info.status}")


def retry(
    job: Annotated[str, typer.Argument(help="The job's name.")],
    state_dir: StateDir = None,
) -> None:
    """Queue a refused or failed job again (once its cause is fixed: a larger fleet, a
    repaired script); its failure count starts over."""
    from autoscaler.controller.api import ApiError

    try:
        info = _client(state_dir).retry_job(job)
    except ApiError as e:
        fail(api_failure(e, state_dir))
    typer.echo(f"{info.name}: {info.status}")


def delete(
    job: Annotated[str, typer.Argument(help="The job's name.")],
    state_dir: StateDir = None,
) -> None:
    """Delete an ended job (completed, failed, cancelled or refused): its name can be
    submitted again. Nothing of the bill goes: its history (placements, reports, events,
    cost share), its logs and, on a cluster on this machine, its checkpoints are kept under
    <name>~<n> (coadapt events and coadapt cost report show it so): a job submitted again
    under the name starts afresh. A job with its own checkpoint_uri, or a cluster that
    checkpoints to a bucket, keeps its checkpoints where they are: a job submitted again
    there resumes from them. Needs the cluster up."""
    from autoscaler.controller.api import ApiError

    try:
        answer = _client(state_dir).delete_job(job)
    except ApiError as e:
        fail(api_failure(e, state_dir))
    kept = answer.get("kept_as")
    logs, checkpoints = answer.get("logs"), answer.get("checkpoints")
    typer.echo(f"{job}: deleted; its history is kept as {kept}" +
               (f", its logs in {logs}" if logs else "") +
               (f", its checkpoints in {checkpoints}" if checkpoints else ""))  # fmt: skip


DESCRIBE_WIDTH_CHARS = 18  # the labels' column of coadapt describe


def describe(
    job: Annotated[str, typer.Argument(help="The job's name.")],
    state_dir: StateDir = None,
    json_out: Json = False,
    store_url: StoreUrl = None,
) -> None:
    """Everything about one job: its spec, status and reason, times, ETA and deadline, its
    placements (which instance's GPUs, when), batch, the events about it and its GPU-hours
    and cost so far; through the cluster's API when it is up, else from its store."""
    from autoscaler.controller.api import ApiError

    state = resolve_state_dir(state_dir)
    up = any((state / f).exists() for f in ("up.json", "deploy.json"))
    if not up and cluster_store_location(state, store_url) is None:
        fail(f"no cluster is up in {state} and no store is there (coadapt up --state-dir "
             f"{state} makes one)")  # fmt: skip
    if up:
        try:
            client = _client(state_dir)
            info = client.get_job(job).to_dict()
            history = client.job_history(job)
        except ApiError as e:
            fail(api_failure(e, state_dir))
    else:
        typer.echo(f"coadapt: no cluster is up in {state}; as its store last recorded it",
                   err=True)  # fmt: skip
        info, history = _stored_job(state, job, store_url)
    doc = {**info, "history": history, "cost_usd": _job_cost_usd(state, job, store_url)}
    if json_out:
        typer.echo(json.dumps(doc))
        return
    _render_describe(doc)


def _stored_job(
    state: Path, job: str, store_url: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Job ``job``'s answer and history, read from the cluster's store (read-only)."""
    from autoscaler.controller.api.answers import job_history, one_job
    from autoscaler.controller.errors import StoreError, UnknownRowError
    from coadapt_common.clock import SystemClock

    clock = SystemClock()
    try:
        with open_cluster_store(state, store_url) as store:
            row = store.get_job(job)  # no ETA: a cluster that is not up makes no progress
            return one_job(store, row, etas=False), job_history(store, job, clock.now_s())
    except UnknownRowError:
        fail(f"no job {job!r} in {state}; coadapt status --state-dir {state} lists the jobs")
    except StoreError as e:
        fail(str(e))


def _job_cost_usd(state: Path, job: str, store_url: str | None) -> float | None:
    """Job ``job``'s share of the bill so far (what coadapt cost report's jobs table says),
    when the cluster's store is known in ``state`` (a local cluster, up or not); else None."""
    from autoscaler.accounting.billing import cost_record_from_store
    from autoscaler.accounting.costs import job_costs
    from autoscaler.controller.errors import StoreError
    from autoscaler.controller.service import ServiceError
    from autoscaler.controller.service import open_cluster_store as open_store
    from autoscaler.errors import InvalidInputError
    from coadapt_common.clock import SystemClock

    if cluster_store_location(state, store_url) is None:
        return None
    clock = SystemClock()
    try:
        with open_store(state, clock, store_url=store_url) as store:
            record = cost_record_from_store(store, clock.now_s())
    except (StoreError, ServiceError, InvalidInputError):
        return None
    return next((c.cost_usd for c in job_costs(record) if c.job_id == job), 0.0)


def _render_describe(doc: dict[str, Any]) -> None:
    """``coadapt describe``'s text: labelled lines, then the placements and the events."""
    from autoscaler.controller.events import format_event
    from autoscaler.controller.store import EventRow

    now_s = time.time()
    history = doc["history"]

    def line(label: str, value: object) -> None:
        typer.echo(f"{label + ':':<{DESCRIBE_WIDTH_CHARS}}{value}")

    progress, target = doc.get("progress"), doc.get("target_progress")
    shown = "-" if progress is None else f"{progress:.0f}"
    if progress is not None and target:
        shown += f" of {target:.0f}"
    took = elapsed_s(doc, now_s)
    deadline = doc.get("deadline_s")
    line("name", doc["name"])
    line("status", doc["status"])
    if doc.get("reason"):
        line("reason", doc["reason"])
    line("submitted", clock_text(doc.get("submitted_at_s"), now_s))
    line("started", clock_text(doc.get("started_at_s"), now_s))
    line("elapsed", "-" if took is None else span_text(took))
    eta = doc.get("eta_s")
    line("ETA", "-" if eta is None else
         f"{eta_text(eta, now_s)} ({doc.get('eta_utc')}, by its fitted model)")  # fmt: skip
    line("deadline", "-" if deadline is None else
         f"{clock_text(deadline, now_s)} ({doc.get('deadline_utc')})")  # fmt: skip
    line("GPUs", f"{doc.get('gpus', 0)}")
    if doc.get("batch_size"):
        line("batch", f"{doc['batch_size']} ({doc['local_batch_size']} per GPU x "
                      f"{doc['accumulation_steps']} steps)")  # fmt: skip
    line("progress", shown)
    line("restarts", doc.get("restarts", 0))
    line("retries", doc.get("retries", 0))
    line("GPU-hours", f"{history.get('gpu_s', 0.0) / 3600:.4f}")
    cost = doc.get("cost_usd")
    line("cost (USD)", "- (from coadapt cost report on the controller)" if cost is None
         else f"{cost:.4f}")  # fmt: skip
    typer.echo("spec:")
    for key, value in sorted(doc.get("spec", {}).items()):
        if value is not None:
            typer.echo(f"  {key}: {json.dumps(value)}")
    typer.echo("placements:" + ("" if history["placements"] else " none"))
    for p in history["placements"]:
        end = "now" if p["to_s"] is None else clock_text(p["to_s"], now_s)
        typer.echo(f"  {clock_text(p['from_s'], now_s)} - {end}  {p['gpus']} GPU(s) on "
                   f"{p['instance_key']}")  # fmt: skip
    typer.echo("events:" + ("" if history["events"] else " none"))
    for n, e in enumerate(history["events"]):
        row = EventRow(n, e["at_s"], e["kind"], doc["name"], e["message"])
        typer.echo(f"  {format_event(row)}")


def down(
    state_dir: StateDir = None,
    timeout_s: Annotated[float, typer.Option(help="Seconds to wait for the release.")] = 300.0,
    store_url: StoreUrl = None,
) -> None:
    """Release every instance of the cluster and stop its coadapt up: it confirms none is
    left. With coadapt up running it asks it to (checking first that the process up.json
    names is that coadapt up: its pid, start time and command line; and that this state
    folder's user token is the cluster's). With none running (stopped, killed, crashed) it
    lists the cloud under the cluster's tag and releases what it finds from here; on the
    local provider that stops each instance's agent and its jobs. A cluster already down:
    it says so and exits 0. Its unfinished jobs wait for coadapt up --resume."""
    from autoscaler.controller.api import ApiClient, ApiError, load_tokens
    from autoscaler.controller.errors import ControllerError
    from autoscaler.controller.service import UpProcess, UpRecord
    from autoscaler.errors import InvalidInputError

    if not 0 < timeout_s <= 86_400:
        fail(f"--timeout-s {timeout_s}: give 1-86400 seconds", 2)
    state = resolve_state_dir(state_dir)
    up_file = state / "up.json"
    if not up_file.exists():
        if cluster_store_location(state, store_url) is None and (state / "deploy.json").exists():
            fail(f"{state} holds a deployment, whose controller runs coadapt up: coadapt "
                 f"destroy --state-dir {state} releases its fleet")  # fmt: skip
        _down_without_up(state, timeout_s, "no coadapt up runs for it", store_url)
        return
    record = UpRecord.read(up_file)
    if record is None:
        fail(f"{up_file} is not a record of a running coadapt up; nothing was stopped. If no "
             f"coadapt up runs for {state}, remove it")  # fmt: skip
    pid, started, url = record.pid, record.started, record.url
    process = record.process()
    if process is UpProcess.GONE:  # killed, crashed, rebooted: released from here
        _down_without_up(state, timeout_s, f"its coadapt up (pid {pid}) is gone", store_url)
        up_file.unlink(missing_ok=True)
        return
    if process is not UpProcess.OURS:
        fail(
            f"{up_file} names pid {pid}, which is not the coadapt up that wrote it (its "
            "command line differs): nothing was stopped. If no coadapt up runs for "
            f"{state}, remove {up_file}; its instances keep running until an up takes them "
            "back"
        )
    try:
        token = load_tokens(state / "tokens.json").user
    except (ControllerError, InvalidInputError) as e:  # one line, no traceback
        fail(f"cannot read the user token: {e}; nothing was stopped")
    client = ApiClient(str(url), token, timeout_s=10.0)
    try:
        serving = client.service()
    except ApiError as e:
        if e.status in (401, 403):
            fail(f"the user token in {state / 'tokens.json'} is not this cluster's: nothing "
                 "was stopped; use the state folder of the coadapt up that runs it")  # fmt: skip
        fail(f"could not ask coadapt up (pid {pid}) to stop: {e.message}; nothing was stopped")
    if (serving.get("pid"), serving.get("started")) != (pid, started):
        fail(f"the API at {url} is served by another process than pid {pid}: nothing was "
             "stopped")  # fmt: skip
    try:
        client.service_down()
    except ApiError as e:
        fail(f"could not ask coadapt up (pid {pid}) to stop: {e.message}; nothing was stopped")
    deadline = time.monotonic() + timeout_s
    while record.process() is UpProcess.OURS and time.monotonic() < deadline:
        time.sleep(0.5)
    if record.process() is UpProcess.OURS:
        fail(f"`coadapt up` (pid {pid}) is still releasing after {timeout_s:.0f} s; run coadapt "
             "down again to wait longer")  # fmt: skip
    typer.echo("coadapt: down")


def _down_without_up(state: Path, timeout_s: float, why: str, store_url: str | None) -> None:
    """``coadapt down`` with no coadapt up running for ``state``: release from here
    (:func:`~autoscaler.controller.service.down_without_up`) and say what was done."""
    from autoscaler.controller.events import Event, format_event
    from autoscaler.controller.service import ServiceError, down_without_up

    def told(event: Event) -> None:
        typer.echo(format_event(event))

    try:
        done = down_without_up(state, timeout_s=timeout_s, on_event=told, store_url=store_url)
    except ServiceError as e:
        fail(str(e))
    report = done.report
    if not report.released:
        fail(f"{state}: its store never planned a fleet, so the {len(report.remaining)} "
             f"instance(s) listed under cluster {done.cluster_id} are not known to be its "
             "own: nothing was released")  # fmt: skip
    if report.remaining:
        why_left = f" ({report.error})" if report.error else ""
        fail(f"instances still listed after down: {', '.join(report.remaining)}{why_left}; "
             f"run coadapt down --state-dir {state} again")  # fmt: skip
    if not done.found and done.was_down_at_s is not None:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(done.was_down_at_s))
        typer.echo(f"coadapt: already down (since {since}); no instance of cluster "
                   f"{done.cluster_id} is listed")  # fmt: skip
        return
    released = f"released {len(done.found)} instance(s) ({', '.join(done.found)})"
    typer.echo(f"coadapt: down ({why}): {released if done.found else 'none was listed'}; "
               "no instance left")  # fmt: skip


def _configure_logging(*, verbose: bool) -> None:
    """The controller's log on stderr, one line per record: warnings and errors, and with
    ``verbose`` its informational records too."""
    import logging

    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


def events(
    state_dir: StateDir = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    last: Annotated[int, typer.Option(help="Only the last N events (0: all).", min=0)] = 0,
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object per line instead of text.")
    ] = False,
    store_url: StoreUrl = None,
) -> None:
    """The cluster's story from its store, whether or not it is up: launches, notices,
    preemptions, moves, rescales, rebatches, refusals, completions, releases, each with its
    time and its reason (what coadapt up prints). With --json, a drain or a notice also
    gives the age of the instance (instance_age_s: seconds since its launch)."""
    from autoscaler.controller.errors import StoreError
    from autoscaler.controller.events import event_json, format_event
    from autoscaler.controller.store import Store

    state = resolve_state_dir(state_dir)

    def show(rows: tuple[Any, ...], store: Store) -> None:
        for row in rows:
            if json_out:
                typer.echo(json.dumps(event_json(row, store)))
            else:
                typer.echo(format_event(row))

    if follow:  # Ctrl-C ends it, also when started where SIGINT is ignored (a shell's &)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with open_cluster_store(state, store_url) as store:
            rows = store.events_after(0)
            while len(rows) == 10_000:  # read on past a page
                rows = rows + store.events_after(rows[-1].seq)
            cursor = rows[-1].seq if rows else 0
            show(rows[-last:] if last else rows, store)
            if not rows and not follow:
                typer.echo(f"coadapt: no events yet in {state}", err=True)
            while follow:
                time.sleep(1.0)
                new = store.events_after(cursor)
                if new:
                    cursor = new[-1].seq
                    show(new, store)
    except StoreError as e:
        fail(str(e))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def dashboard(
    state_dir: StateDir = None,
    open_it: Annotated[
        bool, typer.Option("--open", help="Open it in a web browser as well.")
    ] = False,
) -> None:
    """Print the address of the cluster's dashboard, with the users' token in it (the part
    after # never leaves the browser: it is not sent to the server or written to its logs).
    The token is a secret: do not paste the address where others can read it."""
    state = resolve_state_dir(state_dir)
    up_file = state / "up.json"
    if not up_file.exists():
        fail(f"no cluster is up in {state} (start one with: coadapt up --state-dir {state})")
    try:
        url = str(json.loads(up_file.read_text())["url"])
    except (ValueError, KeyError, TypeError, OSError) as e:
        fail(f"{up_file}: unreadable ({e}); restart coadapt up")
    address = f"{url.rstrip('/')}/dashboard#token={_users_token(state)}"
    typer.echo(address)
    if open_it:
        import webbrowser

        if not webbrowser.open(address):
            typer.echo("coadapt: no web browser found here; open the address above", err=True)


def agent(
    api: Annotated[str, typer.Option("--api", help="The controller API URL.")],
    token_file: Annotated[
        Path,
        typer.Option(
            "--token-file",
            help='This agent\'s own credential (a 0600 JSON file {"agent": ...}); renewed '
            "in place.",
        ),
    ],
    work_dir: Annotated[
        Path, typer.Option("--work-dir", help="Where this instance's jobs run (one folder each).")
    ],
    instance_key: Annotated[
        str | None,
        typer.Option(
            "--instance-key", help="This instance's id in the store (or give --request-id)."
        ),
    ] = None,
    request_id: Annotated[
        str | None,
        typer.Option(
            "--request-id",
            help="This instance's coadapt-request-id tag (a cloud node); needs --cluster-id.",
        ),
    ] = None,
    cluster_id: Annotated[
        str | None, typer.Option("--cluster-id", help="The cluster (with --request-id).")
    ] = None,
    logs_dir: Annotated[
        Path | None,
        typer.Option("--logs-dir", help="Where job logs go (default: inside --work-dir)."),
    ] = None,
    checkpoint_root: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-root",
            help="Where jobs without their own location checkpoint: a folder, s3:// or gs://.",
        ),
    ] = None,
    notice_dir: Annotated[
        Path | None,
        typer.Option("--notice-dir", help="The local provider's preemption-notice folder."),
    ] = None,
    notice_source: Annotated[
        str | None,
        typer.Option(
            "--notice-source",
            help="What says this instance is being reclaimed: local (the local provider's "
            "notice file), aws (IMDSv2 spot instance-action), gcp (metadata: preempted) or "
            "none; default: local with --notice-dir, else none.",
        ),
    ] = None,
    metadata_url: Annotated[
        str | None,
        typer.Option("--metadata-url", help="The cloud metadata service's URL (tests)."),
    ] = None,
    interval_s: Annotated[
        float, typer.Option("--interval-s", help="Seconds between two polls of the controller.")
    ] = 2.0,
    report_interval_s: Annotated[
        float,
        typer.Option("--report-interval-s", help="Seconds between two progress reports."),
    ] = 30.0,
    address: Annotated[
        str, typer.Option("--address", help="The address peers reach this node at.")
    ] = "127.0.0.1",
    isolate_jobs: Annotated[
        bool,
        typer.Option(
            "--isolate-jobs",
            help="Run each job as its own unprivileged user, in a mount namespace that shows "
            "it its own checkpoint folder: this agent's credential and folders are out of its "
            "reach (needs root).",
        ),
    ] = False,
    allow_job_metadata: Annotated[
        bool,
        typer.Option(
            "--allow-job-metadata",
            help="UNSAFE: on a cloud node (--notice-source aws or gcp), run jobs even where "
            "iptables cannot keep them off the instance metadata service (they could then take "
            "this node's credentials). Without it such an agent exits (status 3).",
        ),
    ] = False,
    job_storage_role_arn: Annotated[
        str | None,
        typer.Option(
            "--job-storage-role-arn",
            help="AWS: the role this node assumes to hand each job a credential for its own "
            "checkpoints (under an s3:// --checkpoint-root) and nothing else.",
        ),
    ] = None,
    job_log_max_bytes: Annotated[
        int | None,
        typer.Option(
            "--job-log-max-bytes", help="What each job's log keeps here (default 64 MiB)."
        ),
    ] = None,
    min_free_bytes: Annotated[
        int | None,
        typer.Option(
            "--min-free-bytes",
            help="Start no job while the disk of its log or checkpoints has less free.",
        ),
    ] = None,
    stop_grace_s: Annotated[
        float,
        typer.Option(
            "--stop-grace-s",
            help="Seconds a job asked to stop has to checkpoint before it is killed (1-3600; "
            "the instance's own shutdown must wait longer).",
        ),
    ] = 60.0,
) -> None:
    """One instance's node agent (coadapt up starts one on each instance it launches).

    It runs the jobs the controller places on this instance until SIGTERM or SIGINT; then
    every job stops with a checkpoint and nothing is left running."""
    from autoscaler.controller.service import agent_main

    if (instance_key is None) == (request_id is None):
        fail("give exactly one of --instance-key and --request-id", 2)
    argv = ["--api", api, "--token-file", str(token_file), "--work-dir", str(work_dir)]
    named: dict[str, object | None] = {
        "--instance-key": instance_key,
        "--request-id": request_id,
        "--cluster-id": cluster_id,
        "--logs-dir": logs_dir,
        "--checkpoint-root": checkpoint_root,
        "--notice-dir": notice_dir,
        "--notice-source": notice_source,
        "--metadata-url": metadata_url,
        "--interval-s": interval_s,
        "--report-interval-s": report_interval_s,
        "--address": address,
        "--job-log-max-bytes": job_log_max_bytes,
        "--min-free-bytes": min_free_bytes,
        "--stop-grace-s": stop_grace_s,
        "--job-storage-role-arn": job_storage_role_arn,
    }
    for flag, value in named.items():
        if value is not None:
            argv += [flag, str(value)]
    if isolate_jobs:
        argv.append("--isolate-jobs")
    if allow_job_metadata:
        argv.append("--allow-job-metadata")
    raise typer.Exit(agent_main(argv))


DEMO_JOBS = ("mlp-small", "mlp-medium", "mlp-wide")
DEMO_PREEMPTED = "mlp-small"
"""The job whose instance the demo's spot preemption takes (mlp-medium, undisturbed, learns
its goodput model in time to be scaled up)."""
ENDED_STATUSES = ("completed", "failed", "cancelled", "refused")


def demo(
    state_dir: Annotated[
        Path | None, typer.Option("--state-dir", help="Keep the demo's state here.")
    ] = None,
    timeout_s: Annotated[
        float, typer.Option(help="Seconds after which the demo gives up.")
    ] = 300.0,
) -> None:
    """A local fleet with spot instances at simulated, moving spot prices, three small real
    PyTorch jobs from examples/jobs, a spot preemption injected mid-run, the story as it
    happens (each event with its time and its reason), and the cost report at the end."""
    from autoscaler.controller.api import ApiClient, ApiError
    from autoscaler.controller.events import Event, format_event
    from autoscaler.controller.jobspec import load_job_spec
    from autoscaler.controller.service import UpConfig, run_up
    from providers.local import LocalProvider

    os.umask(0o077)
    examples = Path.cwd() / "examples" / "jobs"
    if not examples.is_dir():
        fail("run the demo from the coadapt checkout (it needs examples/jobs/)", 2)
    state = state_dir or Path(tempfile.mkdtemp(prefix="coadapt-demo-"))
    stop, ready, result = threading.Event(), list[str](), dict[str, Any]()
    cfg = UpConfig(
        state,
        interval_s=2.0,
        max_instances=4,
        max_gpu_slots=8,
        max_gpus=4,  # half the slots: room for a replacement fleet while one drains
        report_interval_s=2.0,  # the trainers report often: the policy learns them sooner
        local_spot_price_swing=0.4,  # simulated spot prices: +-40 % over two minutes
        local_spot_price_period_s=120.0,
        offerings_refresh_s=15.0,
        release_on_stop=True,  # the demo's fleet ends with it
    )

    def say(text: str) -> None:
        typer.echo(f"{time.strftime('%H:%M:%S')} {'demo':<10} {text}")

    def told(event: Event) -> None:
        typer.echo(format_event(event))

    thread = threading.Thread(
        target=lambda: result.setdefault(
            "down", run_up(cfg, stop, on_ready=ready.append, on_event=told)
        ),
        daemon=True,
    )
    typer.echo(
        "coadapt demo: a controller with a local fleet of simulated spot instances, three "
        "small PyTorch jobs, and a spot preemption injected while they train. Each line below "
        "is one event: its time, what happened and why."
    )
    thread.start()
    start = time.monotonic()
    while not ready and thread.is_alive():
        time.sleep(0.05)
    if not ready:
        fail("the controller did not start")
    say(f"controller up at {ready[0]}; its state is in {state}")
    client = ApiClient(ready[0], _users_token(state), timeout_s=30.0)
    doc: dict[str, Any] = {"jobs": [], "instances": []}
    try:
        for name in DEMO_JOBS:
            try:
                client.submit_job(load_job_spec(examples / f"{name}.yaml").submission())
            except ApiError as e:
                fail(f"could not submit {name}: {e.message}; the fleet is released")
        say(f"submitted {', '.join(DEMO_JOBS)}")
        preempted, placed_at, slow = None, None, False
        while time.monotonic() - start < timeout_s:
            try:
                doc = _status_doc(client)
            except ApiError as e:  # a loaded machine: the API answers late; ask again
                if not slow:
                    say(f"the controller's API answers slowly ({e.message}); asking again")
                slow = True
                time.sleep(2.0)
                continue
            jobs = {j["name"]: j for j in doc["jobs"]}
            target = jobs.get(DEMO_PREEMPTED, {})
            if target.get("assignment") and placed_at is None:
                placed_at = time.monotonic()
            # Once it has made progress (a checkpoint to resume from), or has run a while
            # without a report yet: the preemption must land while the job still runs.
            if (
                preempted is None
                and target.get("assignment")
                and placed_at is not None
                and (target.get("progress") or time.monotonic() - placed_at >= 6.0)
            ):
                victim = sorted(target["assignment"])[0]
                row = next(i for i in doc["instances"] if i["instance_key"] == victim)
                on_it = sorted(n for n, j in jobs.items() if victim in (j.get("assignment") or {}))
                LocalProvider(state / "local").preempt(row["provider_instance_id"], notice_s=30.0)
                preempted = victim
                samples = target.get("progress_samples")
                done = "" if samples is None else f"; {DEMO_PREEMPTED} is at {samples} samples"
                say(
                    f"injecting a spot preemption: the cloud takes {victim} back in 30 s (it "
                    f"runs {', '.join(on_it)}{done}); watch the jobs checkpoint, move and resume"
                )
            if all(j["status"] in ENDED_STATUSES for j in jobs.values()):
                break
            time.sleep(2.0)
        else:
            say(f"stopping after --timeout-s {timeout_s:.0f} s: not every job finished")
    finally:
        say("releasing the fleet")
        stop.set()
        thread.join(timeout=180)
    for j in doc["jobs"]:  # the last status read, in words (the instances are gone by now)
        done, target, share = j.get("progress_samples"), j.get("target_samples"), None
        shown = "no progress reported" if done is None else f"{done} samples"
        if done is not None and target:
            share = j.get("progress_share")
            shown = f"{done} of {target} samples ({100 * (share or 0):.0f} %)"
        why = f" ({j['reason']})" if j.get("reason") else ""
        counts = f"{j.get('restarts', 0)} restart(s), {j.get('retries', 0)} failure(s)"
        typer.echo(f"coadapt demo: {j['name']}: {j['status']}{why}, {shown}, {counts}")
    typer.echo(
        "(samples: progress counted in samples of each job's initial batch; a larger batch's "
        "step counts its statistical efficiency, so the share reaches 100 % at the declared "
        "length)"
    )
    typer.echo("")
    _demo_cost_report(state)
    down_report = result.get("down")
    if down_report is None or not down_report.clean:
        fail("instances were left after the demo")
    size_mb = sum(f.stat().st_size for f in state.rglob("*") if f.is_file()) / 1e6
    typer.echo(
        f"coadapt demo: done in {time.monotonic() - start:.0f} s; no instance left.\n"
        f"Its state ({size_mb:.0f} MB: store, logs, checkpoints) is in {state}:\n"
        f"  coadapt events --state-dir {state}    (the story again)\n"
        f"  coadapt logs mlp-medium --state-dir {state}\n"
        f"  coadapt cost report --state-dir {state} --format html --out report.html\n"
        f"  rm -r {state}    (when you are done with it)"
    )


def _demo_cost_report(state: Path) -> None:
    """The cost report of the demo's store: what `coadapt cost report --state-dir` prints."""
    from autoscaler.cli.cost import render_tables, store_report

    try:
        report = store_report(state)
    except typer.Exit:  # said in one line already; the demo still says where its state is
        return
    text = render_tables([report], plain=not sys.stdout.isatty(), width=None)
    typer.echo(text, nl=False)
