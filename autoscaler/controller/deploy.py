"""``coadapt deploy`` / ``coadapt destroy``: the terraform modules in ``terraform/`` driven
from the cluster's state folder.

A deployment lives in ``<state>/deploy/<cloud>/``: ``main.tf.json`` (a root module, written
by :func:`render_root`, that calls ``terraform/<cloud>`` with the deployment's variables and
passes its outputs through) and terraform's own files. ``<state>/deploy.json`` is the cluster
config: the cloud, the variables, the module and, once applied, the module's outputs (what
``destroy`` and the CLI read). Variables come from ``--var-file`` (JSON, or HCL ``.tfvars``)
and ``--var KEY=VALUE``, checked against the module's declared variables before terraform
runs. terraform (or OpenTofu's ``tofu``) runs when it is on ``PATH``; without it the files are
still written and :class:`TerraformMissingError` carries the exact commands to run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.errors import AutoscalerError, InvalidInputError
from coadapt_common.atomic import write_json_atomic

__all__ = [
    "CLOUDS",
    "OUTPUTS",
    "DeployError",
    "Deployment",
    "TerraformMissingError",
    "find_terraform",
    "load_deployment",
    "load_hcl",
    "module_variables",
    "parse_outputs",
    "read_var_file",
    "render_root",
    "terraform_commands",
]

CLOUDS = ("aws", "gcp")
# The module outputs the CLI reads (the terraform modules are tested to declare them).
OUTPUTS: Mapping[str, tuple[str, ...]] = {
    "aws": (
        "cluster_id", "region", "controller_url", "controller_instance_id", "checkpoint_bucket",
        "interruption_queue_url", "launch_template_id", "agent_credential_path",
        "user_token_parameter", "node_security_group_id", "provider_config",
    ),
    "gcp": (
        "cluster_id", "project", "region", "controller_url", "controller_instance_name",
        "checkpoint_bucket", "user_token_secret",
        "node_service_account_email", "provider_config",
    ),
}  # fmt: skip
_PROVIDER_BLOCK: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "aws": ("aws", ("region",)),
    "gcp": ("google", ("project", "region")),
}


class DeployError(AutoscalerError):
    """A deployment step failed (terraform's exit status and the step are in the message)."""


class TerraformMissingError(DeployError):
    """No ``terraform`` or ``tofu`` on ``PATH``: ``commands`` are what to run by hand."""

    def __init__(self, message: str, commands: Sequence[Sequence[str]], workdir: Path) -> None:
        super().__init__(message)
        self.commands = [list(c) for c in commands]
        self.workdir = workdir


@dataclass(frozen=True)
class Deployment:
    """The cluster config ``<state>/deploy.json``."""

    cloud: str
    module_dir: Path
    workdir: Path
    variables: Mapping[str, Any]
    outputs: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "cloud": self.cloud,
            "module_dir": str(self.module_dir),
            "workdir": str(self.workdir),
            "variables": dict(self.variables),
            "outputs": dict(self.outputs),
        }

    def save(self, state_dir: Path) -> None:
        write_json_atomic(state_dir / "deploy.json", self.to_json())


def load_deployment(state_dir: Path) -> Deployment:
    """``<state>/deploy.json``; :class:`InvalidInputError` when there is none (never deployed
    from this state folder) or it is damaged."""
    path = state_dir / "deploy.json"
    try:
        data = json.loads(path.read_text())
        return Deployment(
            data["cloud"],
            Path(data["module_dir"]),
            Path(data["workdir"]),
            dict(data["variables"]),
            dict(data.get("outputs") or {}),
        )
    except FileNotFoundError as e:
        raise InvalidInputError(
            f"no deployment in {state_dir} (create one with coadapt deploy aws|gcp)",
            field="state_dir",
        ) from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InvalidInputError(f"{path}: not a deployment record: {e}", field="state_dir") from e


def load_hcl(path: Path) -> dict[str, Any]:
    """A ``.tf`` / ``.tfvars`` file as python-hcl2 reads it: strings unquoted, blocks as lists
    of ``{name: body}`` (``variable``, ``resource``, ``data``, ``output``...), expressions as
    ``"${...}"`` strings."""
    import hcl2
    from hcl2.api import SerializationOptions

    options = SerializationOptions(strip_string_quotes=True, explicit_blocks=False)
    with path.open() as f:
        return dict(hcl2.load(f, serialization_options=options))


def module_variables(module_dir: Path) -> dict[str, bool]:
    """The module's declared variables: name -> whether it is required (has no default)."""
    found: dict[str, bool] = {}
    for tf in sorted(module_dir.glob("*.tf")):
        for block in load_hcl(tf).get("variable", []):
            for name, body in block.items():
                found[name] = "default" not in body
    return found


def read_var_file(path: Path) -> dict[str, Any]:
    """Variables from a ``.json`` file (an object) or an HCL ``.tfvars`` file."""
    try:
        data = json.loads(path.read_text()) if path.suffix == ".json" else load_hcl(path)
    except FileNotFoundError as e:
        raise InvalidInputError(f"{path}: no such variables file", field="var_file") from e
    except Exception as e:  # the HCL parser raises its own errors
        raise InvalidInputError(f"{path}: cannot read variables: {e}", field="var_file") from e
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path}: variables must be an object", field="var_file")
    return data


def render_root(cloud: str, module_dir: Path, variables: Mapping[str, Any]) -> dict[str, Any]:
    """The root module (``main.tf.json``): the provider configured from the variables, the
    module with every variable, and the outputs the CLI reads. Refuses unknown variables and
    missing required ones, naming them."""
    declared = module_variables(module_dir)
    unknown = sorted(set(variables) - set(declared))
    if unknown:
        raise InvalidInputError(
            f"terraform/{cloud} has no variable {', '.join(unknown)} "
            f"(it has: {', '.join(sorted(declared))})",
            field="var",
        )
    missing = sorted(n for n, required in declared.items() if required and n not in variables)
    if missing:
        raise InvalidInputError(
            f"terraform/{cloud} needs {', '.join(missing)} (--var NAME=VALUE or --var-file)",
            field="var",
        )
    provider, keys = _PROVIDER_BLOCK[cloud]
    return {
        "provider": {provider: {k: variables[k] for k in keys if k in variables}},
        "module": {"coadapt": {"source": str(module_dir.resolve()), **variables}},
        "output": {
            name: {"value": f"${{module.coadapt.{name}}}", "sensitive": False}
            for name in OUTPUTS[cloud]
        },
    }


def find_terraform() -> str | None:
    """``terraform`` on ``PATH``, else OpenTofu's ``tofu``, else ``None``."""
    return shutil.which("terraform") or shutil.which("tofu")


def terraform_commands(binary: str, *, destroy: bool = False) -> list[list[str]]:
    """init, plan (to a plan file) and apply of that plan; or init and destroy."""
    init = [binary, "init", "-input=false"]
    if destroy:
        return [init, [binary, "destroy", "-input=false", "-auto-approve"]]
    return [
        init,
        [binary, "plan", "-input=false", "-out=coadapt.tfplan"],
        [binary, "apply", "-input=false", "coadapt.tfplan"],
    ]


Runner = Callable[[Sequence[str], Path], None]


def run_terraform(commands: Sequence[Sequence[str]], workdir: Path, run: Runner) -> None:
    """Run each command in ``workdir`` (``run`` streams its output); :class:`DeployError` on
    the first that fails."""
    for command in commands:
        try:
            run(command, workdir)
        except subprocess.CalledProcessError as e:
            raise DeployError(
                f"`{' '.join(command)}` failed (exit {e.returncode}) in {workdir}"
            ) from e


def read_outputs(binary: str, workdir: Path, cloud: str) -> dict[str, Any]:
    """``terraform output -json`` as ``{name: value}``; :class:`DeployError` if an output the
    CLI reads is missing."""
    done = subprocess.run(
        [binary, "output", "-json"], cwd=workdir, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise DeployError(f"`{binary} output -json` failed in {workdir}: {done.stderr.strip()}")
    return parse_outputs(done.stdout, cloud, f"`{binary} output -json`")


def parse_outputs(text: str, cloud: str, source: str) -> dict[str, Any]:
    """``terraform output -json``'s text as ``{name: value}``; :class:`DeployError` when it
    is not that, or lacks an output the CLI reads (``source`` names where it came from)."""
    try:
        raw = json.loads(text)
        outputs = {name: item["value"] for name, item in raw.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DeployError(f"{source}: not `terraform output -json` output: {e}") from e
    missing = [n for n in OUTPUTS[cloud] if n not in outputs]
    if missing:
        raise DeployError(f"{source}: no output {', '.join(missing)}")
    return outputs
