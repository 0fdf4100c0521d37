"""``coadapt deploy aws|gcp`` and ``coadapt destroy`` (thin: parse, call
:mod:`autoscaler.controller.deploy` and the controller's API, print)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from autoscaler.cli.common import (
    STATE_HELP,
    deployed_client,
    fail,
    recorded_deployment,
    resolve_state_dir,
)

TERRAFORM_DIR = Path(__file__).resolve().parents[2] / "terraform"
EXIT_NO_TERRAFORM = 3


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.command("destroy")(destroy)


def _parse_vars(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name:
            fail(f"--var {pair!r}: use NAME=VALUE", 2)
        try:
            out[name] = json.loads(raw)  # numbers, lists, maps, booleans
        except ValueError:
            out[name] = raw
    return out


def _stream(command: Sequence[str], workdir: Path) -> None:
    typer.echo(f"coadapt: $ {' '.join(command)}")
    subprocess.run(list(command), cwd=workdir, check=True)


def _print_commands(workdir: Path, commands: Sequence[Sequence[str]], then: str) -> None:
    typer.echo(f"  cd {workdir}")
    for command in commands:
        typer.echo("  " + " ".join(command))
    typer.echo(then)


def deploy(
    cloud: Annotated[str, typer.Argument(help="The cloud: aws or gcp.")],
    var_file: Annotated[
        Path | None, typer.Option(help="Variables: a .json object or an HCL .tfvars file.")
    ] = None,
    var: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE (JSON values allowed), after --var-file; repeatable."),
    ] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_HELP)] = None,
    module_dir: Annotated[
        Path | None, typer.Option(help="The terraform module (default: terraform/<cloud>).")
    ] = None,
    outputs_file: Annotated[
        Path | None,
        typer.Option(help="Record this 'terraform output -json' file instead of running."),
    ] = None,
) -> None:
    """Create (or update) a cluster on AWS or GCP with the terraform module in terraform/:
    renders the module's variables (those the cluster config <state-dir>/deploy.json recorded,
    then --var-file, then --var), runs terraform (or tofu) init, plan and apply, and records
    the variables and the outputs in the cluster config. Without a terraform binary
    it writes the files and prints the exact commands to run."""
    from autoscaler.controller.deploy import (
        CLOUDS,
        DeployError,
        Deployment,
        find_terraform,
        load_deployment,
        parse_outputs,
        read_outputs,
        read_var_file,
        render_root,
        run_terraform,
        terraform_commands,
    )
    from autoscaler.errors import InvalidInputError
    from coadapt_common.atomic import write_json_atomic

    if cloud not in CLOUDS:
        fail(f"{cloud!r}: choose aws or gcp", 2)
    module = (module_dir or TERRAFORM_DIR / cloud).resolve()
    if not (module / "variables.tf").is_file():
        fail(f"no terraform module at {module} (run from a coadapt checkout or --module-dir)", 2)
    state = resolve_state_dir(state_dir)
    workdir = state / "deploy" / cloud
    try:
        # An update starts from the variables the cluster config recorded.
        previous = load_deployment(state) if (state / "deploy.json").exists() else None
        if previous is not None and previous.cloud != cloud:
            fail(
                f"{state} holds a {previous.cloud} deployment: coadapt destroy it first, or "
                "use another --state-dir",
                2,
            )
        variables = dict(previous.variables) if previous is not None else {}
        variables.update(read_var_file(var_file) if var_file else {})
        variables.update(_parse_vars(var or []))
        root = render_root(cloud, module, variables)
    except InvalidInputError as e:
        fail(str(e), 2)
    workdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(workdir / "main.tf.json", root)
    # The outputs of a previous apply stay recorded until a new apply replaces them.
    record = Deployment(
        cloud, module, workdir, variables, previous.outputs if previous is not None else {}
    )
    if outputs_file is not None:
        try:
            outputs = parse_outputs(outputs_file.read_text(), cloud, str(outputs_file))
        except OSError as e:
            fail(f"{outputs_file}: {e}", 2)
        except DeployError as e:
            fail(str(e), 2)
        Deployment(cloud, module, workdir, variables, outputs).save(state)
        typer.echo(f"coadapt: recorded the outputs in {state / 'deploy.json'}")
        return
    record.save(state)
    binary = find_terraform()
    commands = terraform_commands(binary or "terraform")
    if binary is None:
        typer.echo(
            "coadapt: no terraform (or tofu) on PATH. The root module is written; run:", err=True
        )
        _print_commands(
            workdir,
            [*commands, ["terraform", "output", "-json", ">", "outputs.json"]],
            f"then: coadapt deploy {cloud} --state-dir {state} --outputs-file "
            f"{workdir / 'outputs.json'} (same variables)",
        )
        raise typer.Exit(EXIT_NO_TERRAFORM)
    try:
        run_terraform(commands, workdir, _stream)
        outputs = read_outputs(binary, workdir, cloud)
    except DeployError as e:
        fail(f"{e} (the outputs recorded before are kept; fix it and run coadapt deploy again)")
    Deployment(cloud, module, workdir, variables, outputs).save(state)
    typer.echo(f"coadapt: deployed; controller at {outputs['controller_url']}")
    typer.echo(f"coadapt: outputs recorded in {state / 'deploy.json'}")


def destroy(
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help=STATE_HELP)] = None,
    controller_url: Annotated[
        str | None,
        typer.Option(
            help="Reach the controller here (a tunnel) instead of the deployment's address."
        ),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="How long to wait for the release.")] = 600.0,
) -> None:
    """Release every instance through the controller, confirm that none is left, then run
    terraform destroy. Refuses (and names them) while instances remain, or when the
    controller cannot be reached."""
    from autoscaler.controller.api import ApiError
    from autoscaler.controller.deploy import (
        DeployError,
        find_terraform,
        run_terraform,
        terraform_commands,
    )

    state = resolve_state_dir(state_dir)
    record = recorded_deployment(state)
    client = deployed_client(state, record, controller_url)
    url = client.base_url
    try:
        released_at = client.release_fleet()
        typer.echo(f"coadapt: asked the controller at {url} to release every instance")
        deadline = time.monotonic() + timeout_s
        while True:
            listing = client.fleet().get("release_listing") or {}
            confirmed = listing.get("at_s", -1.0) >= released_at and not listing.get("error")
            if (confirmed and not listing["instances"]) or time.monotonic() >= deadline:
                break
            time.sleep(min(5.0, max(0.1, timeout_s / 20)))
        rows = {
            r.provider_instance_id: r for r in client.list_instances() if r.provider_instance_id
        }
    except (ApiError, OSError) as e:
        fail(
            f"cannot reach the controller at {url} ({getattr(e, 'message', e)}); refusing to "
            "destroy: instances it "
            "launched would keep running (and billing) without it"
        )
    if not confirmed or listing["instances"]:
        if not confirmed:
            why = listing.get("error") or "the controller has not listed the cloud since"
            fail(f"refusing to destroy: no confirmed release after {timeout_s:.0f} s ({why})")
        names = ", ".join(
            f"{i} ({rows[i].instance_key}, {rows[i].status})" if i in rows else i
            for i in listing["instances"]
        )
        fail(
            f"refusing to destroy: {len(listing['instances'])} instance(s) still listed after "
            f"{timeout_s:.0f} s: {names}"
        )
    typer.echo("coadapt: no instance left; destroying the deployment")
    binary = find_terraform()
    commands = terraform_commands(binary or "terraform", destroy=True)
    if binary is None:
        typer.echo("coadapt: no terraform (or tofu) on PATH; run:", err=True)
        _print_commands(record.workdir, commands, "")
        raise typer.Exit(EXIT_NO_TERRAFORM)
    try:
        run_terraform(commands, record.workdir, _stream)
    except DeployError as e:
        fail(str(e))
    (state / "deploy.json").rename(state / "deploy.destroyed.json")
    typer.echo("coadapt: destroyed")
