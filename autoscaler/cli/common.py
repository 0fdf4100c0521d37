"""What the CLI's command modules share: the cluster's state folder, failing with a message,
and the API client of a deployed cluster (thin, like the commands)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

STATE_HELP = "The cluster's state folder (default: $COADAPT_HOME/cluster or ~/.coadapt/cluster)."


def default_state_dir() -> Path:
    home = os.environ.get("COADAPT_HOME")
    return (Path(home) if home else Path.home() / ".coadapt") / "cluster"


StateDir = Annotated[Path | None, typer.Option("--state-dir", help=STATE_HELP)]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
StoreUrl = Annotated[
    str | None,
    typer.Option(
        "--store",
        envvar="COADAPT_STORE_URL",
        show_envvar=True,
        help="A team's store: a postgresql://user@host:port/db URL whose (existing) "
        "database keeps every table (default: the SQLite file store.db in the state "
        "folder, or the store the folder records: coadapt up --store records it, without "
        "the password). Give the password in COADAPT_STORE_URL or PGPASSWORD, not on the "
        "command line.",
    ),
]
STORE_URL_FIX = (
    "--store takes a postgresql://user@host:port/database URL (without it the store "
    "is the SQLite file store.db in the state folder)"
)


def open_cluster_store(state: Path, store_url: str | None) -> Any:
    """The cluster's store (:func:`~autoscaler.controller.service.open_cluster_store`),
    read-only; a store that cannot be found or opened fails in one line."""
    from autoscaler.controller.errors import StoreError
    from autoscaler.controller.service import ServiceError
    from autoscaler.controller.service import open_cluster_store as open_store
    from coadapt_common.clock import SystemClock

    cluster_store_location(state, store_url)  # a bad --store: input, exit status 2
    try:
        return open_store(state, SystemClock(), store_url=store_url)
    except (StoreError, ServiceError) as e:
        fail(str(e))


def cluster_store_location(state: Path, store_url: str | None) -> Path | str | None:
    """Where the cluster's store is (:func:`~autoscaler.controller.service.
    cluster_store_location`); ``None``: nowhere. A bad ``--store`` fails in one line."""
    from autoscaler.controller.service import ServiceError
    from autoscaler.controller.service import cluster_store_location as location

    try:
        return location(state, store_url)
    except ServiceError as e:
        fail(str(e), 2)


def fail(message: str, code: int = 1) -> NoReturn:
    """The one error style: ``coadapt: <what>; <how to fix>`` on stderr, one line, exit
    status ``code`` (2: bad input, 1: the action failed)."""
    typer.echo(f"coadapt: {message}", err=True)
    raise typer.Exit(code)


def api_failure(e: Any, state: Path | None = None) -> str:
    """What a refused or failed API call means for the user, in the one error style
    (``<what>; <how to fix>``) and without the HTTP status: ``e`` is an
    :class:`~autoscaler.controller.api.ApiError`, ``state`` the state folder used."""
    where = f" --state-dir {state}" if state is not None else ""
    status = int(getattr(e, "status", 0) or 0)
    message = str(getattr(e, "message", e)).rstrip(".")
    if status == 0:
        return (
            f"cannot reach the cluster's controller ({message}); is coadapt up running? "
            f"(coadapt up{where} starts it)"
        )
    if status in (401, 403):
        return (
            f"the controller refused this state folder's token ({message}); use the state "
            "folder of the coadapt up that runs the cluster"
        )
    if status == 404:
        return f"{message}; coadapt status{where} lists the jobs"
    if status == 409:
        return f"{message}; coadapt status{where} shows where it stands"
    if status in (400, 413, 422):
        return f"the controller refused the request: {message}; correct it and try again"
    return f"the controller failed ({message}); see the output of coadapt up, then try again"


class CoadaptGroup(TyperGroup):
    """The ``coadapt`` command group: as Typer's, but a usage error (an unknown option, a bad
    value, a missing argument) is told in the one error style, ``coadapt: <command>: <what>;
    see coadapt <command> --help``, exit status 2, instead of click's usage block."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        from typer._click.exceptions import ClickException, UsageError

        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)
        except UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "coadapt"
            what = e.format_message().rstrip(".").replace("Value error, ", "")
            what = what[:1].lower() + what[1:]
            command = where.partition(" ")[2]
            if command:
                what = f"{command}: {what}"
            typer.echo(f"coadapt: {what}; see {where} --help", err=True)
            sys.exit(e.exit_code)
        except ClickException as e:
            typer.echo(f"coadapt: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        except typer.Abort:
            typer.echo("coadapt: stopped", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def resolve_state_dir(state_dir: Path | None) -> Path:
    return state_dir if state_dir is not None else default_state_dir()


def _user_token(outputs: dict[str, Any], cloud: str, state: Path) -> str:
    """The users' API token of a deployed cluster: ``<state>/tokens.json`` when there, else
    (AWS) read from the deployment's SSM parameter with the caller's credentials and kept in
    that file (0600)."""
    from autoscaler.controller.credentials import TokenFileError, load_token
    from coadapt_common.atomic import write_bytes_atomic

    path = state / "tokens.json"
    if path.exists():
        try:
            return load_token(path, "user")
        except TokenFileError as e:
            fail(str(e))
    if cloud == "aws":
        import boto3

        ssm = boto3.client("ssm", region_name=outputs["region"])
        value = ssm.get_parameter(Name=outputs["user_token_parameter"], WithDecryption=True)
        token = str(value["Parameter"]["Value"])
        if len(token) < 32:
            fail(
                f"the controller has not published its token in {outputs['user_token_parameter']}"
                " yet (it is still booting?); try again in a minute"
            )
        data = (json.dumps({"user": token}) + "\n").encode()
        write_bytes_atomic(path, data, durable=True, mode=0o600, replace=False)
        return token
    fail(
        f"no user token: write it to {path} (chmod 600) with\n  gcloud secrets versions access "
        f"latest --secret {outputs['user_token_secret']} --project {outputs['project']} | "
        "python3 -c 'import json,sys; print(json.dumps({\"user\": sys.stdin.read().strip()}))' "
        f"> {path}",
        2,
    )


def recorded_deployment(state: Path) -> Any:
    """The deployment recorded in ``state`` (``deploy.json``), with its outputs; fails with a
    message when there is none, or when it never completed."""
    from autoscaler.controller.deploy import load_deployment
    from autoscaler.errors import InvalidInputError

    try:
        record = load_deployment(state)
    except InvalidInputError as e:
        fail(str(e), 2)
    if not record.outputs:
        fail(f"{state / 'deploy.json'} has no outputs: the deployment never completed")
    return record


def deployed_client(state: Path, record: Any, controller_url: str | None) -> Any:
    """An API client for ``record``, the deployment in ``state`` (``controller_url``, else
    ``$COADAPT_CONTROLLER_URL``, else the deployment's ``controller_url`` output)."""
    from autoscaler.controller.api import ApiClient

    outputs = dict(record.outputs)
    url = controller_url or os.environ.get("COADAPT_CONTROLLER_URL") or outputs["controller_url"]
    return ApiClient(str(url), _user_token(outputs, record.cloud, state), timeout_s=15.0)
