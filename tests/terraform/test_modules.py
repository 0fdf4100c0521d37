"""The terraform modules, read with python-hcl2 (no terraform binary or provider registry is
needed): every file parses; every variable is typed and described; the outputs the CLI reads
exist; IMDSv2; no public bucket; no ingress from anywhere; the controller may do exactly what
the adapters are tested to call (``providers/aws/permissions.py``,
``providers/gcp/permissions.py``)."""

from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import re
import shutil
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from autoscaler.controller.cloud_setup import INSTANCE_ARN_TAG
from autoscaler.controller.deploy import OUTPUTS, load_hcl
from providers.aws.permissions import controller_iam_actions
from providers.gcp.permissions import controller_permissions

ROOT = Path(__file__).resolve().parents[2]
MODULES = {cloud: ROOT / "terraform" / cloud for cloud in ("aws", "gcp")}
EXAMPLES = {cloud: ROOT / "terraform" / "examples" / cloud for cloud in ("aws", "gcp")}
ANYWHERE = {"0.0.0.0/0", "::/0"}


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tf"))


@functools.cache
def _parsed(tf: Path) -> dict[str, Any]:
    """``load_hcl(tf)``, read once per test session: python-hcl2 takes about a second for a
    module, and the checks below read each module many times (read-only)."""
    return load_hcl(tf)


def _merged(directory: Path) -> dict[str, list[Any]]:
    merged: dict[str, list[Any]] = {}
    for tf in _files(directory):
        for kind, blocks in _parsed(tf).items():
            merged.setdefault(kind, []).extend(blocks)
    return merged


def _named(directory: Path, kind: str) -> dict[str, Any]:
    """``variable`` / ``output`` / ``locals`` blocks by name."""
    return {
        name: body for block in _merged(directory).get(kind, []) for name, body in block.items()
    }


def _resources(directory: Path, kind: str = "resource") -> Iterator[tuple[str, str, Any]]:
    """``(type, name, body)`` of every resource (or data source)."""
    for block in _merged(directory).get(kind, []):
        for rtype, by_name in block.items():
            for name, body in by_name.items():
                yield rtype, name, body


def _of_type(directory: Path, rtype: str, kind: str = "resource") -> list[tuple[str, Any]]:
    return [(n, b) for t, n, b in _resources(directory, kind) if t == rtype]


def _one(value: Any) -> Any:
    """A nested block as hcl2 gives it (a list of one body) or a plain value."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


@pytest.mark.parametrize("directory", [*MODULES.values(), *EXAMPLES.values()], ids=str)
def test_every_file_parses(directory: Path) -> None:
    assert _files(directory), f"no .tf files in {directory}"
    for tf in _files(directory):
        assert isinstance(_parsed(tf), dict)


@pytest.mark.parametrize("cloud", MODULES)
def test_every_variable_has_a_type_and_a_description(cloud: str) -> None:
    variables = _named(MODULES[cloud], "variable")
    assert variables
    for name, body in variables.items():
        assert body.get("type"), f"variable {name} has no type"
        assert str(body.get("description", "")).strip(), f"variable {name} has no description"


@pytest.mark.parametrize("cloud", MODULES)
def test_the_outputs_the_cli_reads_exist_and_the_example_passes_them_on(cloud: str) -> None:
    outputs = _named(MODULES[cloud], "output")
    for name in OUTPUTS[cloud]:
        assert name in outputs, f"terraform/{cloud} has no output {name}"
        assert str(outputs[name].get("description", "")).strip(), f"output {name} undescribed"
        assert name in _named(EXAMPLES[cloud], "output"), f"examples/{cloud} drops {name}"


@pytest.mark.parametrize("cloud", MODULES)
def test_every_output_and_variable_is_in_the_module_readme(cloud: str) -> None:
    readme = (MODULES[cloud] / "README.md").read_text()
    for name in [*_named(MODULES[cloud], "variable"), *_named(MODULES[cloud], "output")]:
        assert f"`{name}`" in readme, f"terraform/{cloud}/README.md does not list {name}"


@pytest.mark.parametrize("cloud", MODULES)
def test_the_module_configures_no_provider(cloud: str) -> None:
    assert "provider" not in _merged(MODULES[cloud])


# ------------------------------------------------------------------------------------- GCP


def test_gcp_controller_role_holds_exactly_what_the_adapter_calls() -> None:
    (role,) = [b for _, b in _of_type(MODULES["gcp"], "google_project_iam_custom_role")]
    assert role["permissions"] == "${local.controller_permissions}"
    declared = _named(MODULES["gcp"], "locals")["controller_permissions"]
    assert set(declared) == controller_permissions() and len(declared) == len(set(declared))


def test_gcp_service_accounts_get_no_broad_project_role() -> None:
    project_roles = {b["role"] for _, b in _of_type(MODULES["gcp"], "google_project_iam_member")}
    assert project_roles == {
        "roles/logging.logWriter",
        "${google_project_iam_custom_role.controller.name}",
    }
    for _, binding in _of_type(MODULES["gcp"], "google_secret_manager_secret_iam_member"):
        assert binding["role"] in {
            "roles/secretmanager.secretVersionAdder", "roles/secretmanager.secretAccessor"
        }  # fmt: skip
    (checkpoints,) = [b for _, b in _of_type(MODULES["gcp"], "google_storage_bucket_iam_member")]
    assert "node" in checkpoints["member"] and checkpoints["role"] == "roles/storage.objectUser"


def test_gcp_nodes_read_no_secret_and_the_controller_adds_only_the_users_token() -> None:
    """No shared agents' secret: each node's own credential comes in its startup script
    (autoscaler/controller/cloud_setup.py), so the node account reads nothing in Secret Manager;
    the controller adds versions to the users' token and (team_store) reads the store's
    password, each by a binding on that one secret."""
    secrets = [n for n, _ in _of_type(MODULES["gcp"], "google_secret_manager_secret")]
    assert sorted(secrets) == ["store_password", "user_token"]
    grants = {
        (b["secret_id"], b["role"])
        for _, b in _of_type(MODULES["gcp"], "google_secret_manager_secret_iam_member")
    }  # fmt: skip
    assert grants == {
        ("${google_secret_manager_secret.user_token.secret_id}",
         "roles/secretmanager.secretVersionAdder"),
        ("${google_secret_manager_secret.store_password[0].secret_id}",
         "roles/secretmanager.secretAccessor"),
    }  # fmt: skip
    for _, binding in _of_type(MODULES["gcp"], "google_secret_manager_secret_iam_member"):
        assert binding["member"] == "serviceAccount:${google_service_account.controller.email}"
    assert "agent_token_secret" not in str(_named(MODULES["gcp"], "locals")["provider_config"])


def test_gcp_bucket_is_private_and_versioned() -> None:
    (bucket,) = [b for _, b in _of_type(MODULES["gcp"], "google_storage_bucket")]
    assert bucket["uniform_bucket_level_access"] is True
    assert bucket["public_access_prevention"] == "enforced"
    assert _one(bucket["versioning"])["enabled"] is True
    for _, member in _of_type(MODULES["gcp"], "google_storage_bucket_iam_member"):
        assert member["member"] not in ("allUsers", "allAuthenticatedUsers")


def test_gcp_no_firewall_rule_admits_the_internet() -> None:
    rules = _of_type(MODULES["gcp"], "google_compute_firewall")
    assert rules
    for name, rule in rules:
        # Egress rules only deny (the nodes' way to the team store).
        assert rule.get("direction", "INGRESS") == "INGRESS" or "allow" not in rule, name
        sources = rule.get("source_ranges", [])
        assert not (isinstance(sources, list) and ANYWHERE & set(sources)), name
        assert str(rule.get("description", "")).strip(), f"rule {name} undescribed"
    for name in ("api_allowed_cidrs", "ssh_allowed_cidrs"):
        validations = _named(MODULES["gcp"], "variable")[name].get("validation", [])
        assert any("0.0.0.0/0" in str(v["condition"]) for v in validations), name


def test_gcp_controller_vm_is_shielded_without_an_address_by_default() -> None:
    (vm,) = [b for _, b in _of_type(MODULES["gcp"], "google_compute_instance")]
    shielded = _one(vm["shielded_instance_config"])
    assert all(shielded[k] is True for k in ("enable_secure_boot", "enable_vtpm",
                                             "enable_integrity_monitoring"))  # fmt: skip
    assert _named(MODULES["gcp"], "variable")["controller_external_ip"]["default"] is False
    assert vm["metadata"]["block-project-ssh-keys"] == "true"


# ------------------------------------------------------------------------------------- AWS

_DOC_REF = re.compile(r"data\.aws_iam_policy_document\.(\w+)(?:\[0\])?\.json")


def _policy_actions(role: str) -> set[str]:
    """Every action of every policy document attached to ``aws_iam_role.<role>`` (inline
    role policies, or managed policies and their attachments)."""
    module = MODULES["aws"]
    docs = {n: b for n, b in _of_type(module, "aws_iam_policy_document", "data")}
    policies = {n: b for n, b in _of_type(module, "aws_iam_policy")}
    attached: list[str] = []
    for _, b in _of_type(module, "aws_iam_role_policy"):
        if f"aws_iam_role.{role}." in str(b.get("role", "")):
            attached += _DOC_REF.findall(str(b["policy"]))
    for _, b in _of_type(module, "aws_iam_role_policy_attachment"):
        if f"aws_iam_role.{role}." in str(b.get("role", "")):
            for name in re.findall(r"aws_iam_policy\.(\w+)\.arn", str(b["policy_arn"])):
                attached += _DOC_REF.findall(str(policies[name]["policy"]))
    assert attached, f"no policy attached to aws_iam_role.{role}"
    actions: set[str] = set()
    for name in attached:
        for statement in docs[name].get("statement", []):
            assert statement.get("effect", "Allow") in ("Allow", "Deny")
            if statement.get("effect", "Allow") == "Allow":
                found = statement.get("actions", [])
                actions |= set(found if isinstance(found, list) else [found])
    return actions


def test_aws_controller_policy_grants_exactly_the_adapters_calls() -> None:
    """The adapter's calls, and (team_store) reading the store's one secret."""
    assert _policy_actions("controller") == controller_iam_actions() | {
        "secretsmanager:GetSecretValue"
    }


def test_aws_node_policy_is_its_token_and_the_job_storage_role() -> None:
    """No S3 right of its own: a node's agent hands each job a session of the job-storage
    role (autoscaler/controller/job_storage.py), and jobs cannot reach the node role."""
    allowed = {"sts:AssumeRole", "ssm:GetParameter", "kms:Decrypt", "kms:GenerateDataKey"}
    actions = _policy_actions("node")
    assert actions <= allowed and {"sts:AssumeRole", "ssm:GetParameter"} <= actions
    assert _statements("node")["JobStorage"]["resources"] == ["${aws_iam_role.job_storage.arn}"]


def test_aws_job_storage_role_is_the_checkpoint_prefix_assumable_by_nodes_only() -> None:
    allowed = {"s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:ListBucket",
               "kms:Decrypt", "kms:GenerateDataKey"}  # fmt: skip
    actions = _policy_actions("job_storage")
    assert actions <= allowed and {"s3:PutObject", "s3:ListBucket"} <= actions
    jobs = _statements("job_storage")
    assert jobs["Checkpoints"]["resources"] == ["${aws_s3_bucket.checkpoints.arn}/checkpoints/*"]
    (listing,) = jobs["ListCheckpoints"]["condition"]
    assert listing == {"test": "StringLike", "variable": "s3:prefix", "values": ["checkpoints/*"]}
    docs = dict(_of_type(MODULES["aws"], "aws_iam_policy_document", "data"))
    (trust,) = docs["assume_from_nodes"]["statement"]
    assert trust["actions"] == ["sts:AssumeRole"]
    assert trust["principals"] == [{"type": "AWS", "identifiers": ["${aws_iam_role.node.arn}"]}]
    role = dict(_of_type(MODULES["aws"], "aws_iam_role"))["job_storage"]
    assert "assume_from_nodes" in role["assume_role_policy"]
    assert role["max_session_duration"] == 3600  # the agent's DurationSeconds
    config = str(_named(MODULES["aws"], "locals")["provider_config"])
    assert "job_storage_role_arn" in config
    template = (MODULES["aws"] / "templates" / "node-user-data.sh.tftpl").read_text()
    assert "--job-storage-role-arn '${job_role_arn}'" in template


def _statements(doc: str) -> dict[str, Any]:
    docs = dict(_of_type(MODULES["aws"], "aws_iam_policy_document", "data"))
    body = docs[doc]
    return {st["sid"]: st for st in body["statement"]}


def test_aws_a_node_reads_its_own_credential_and_no_other_secret() -> None:
    """The nodes' one SSM grant: GetParameter under the credentials path, only when the
    parameter's instance-ARN tag is the calling instance's (a policy variable, escaped for
    terraform), and only for instance-profile callers; the users' token is not theirs."""
    node = _statements("node")
    ssm = [st for st in node.values() if any(a.startswith("ssm:") for a in st["actions"])]
    assert [st["sid"] for st in ssm] == ["OwnCredential"]
    (own,) = ssm
    assert own["actions"] == ["ssm:GetParameter"]
    assert own["resources"] == ["${local.agents_arn}/*"]
    conditions = {(c["test"], c["variable"]): c["values"] for c in own["condition"]}
    assert conditions == {
        ("StringEquals", "ssm:resourceTag/${local.instance_tag}"): ["$${ec2:SourceInstanceARN}"],
        ("Null", "ec2:SourceInstanceARN"): ["false"],
    }
    assert "user_token" not in str(node)
    locals_ = _named(MODULES["aws"], "locals")
    assert locals_["instance_tag"] == INSTANCE_ARN_TAG  # the tag the controller writes
    assert locals_["agents_arn"].endswith(":parameter${local.agent_credential_path}")
    config = str(locals_["provider_config"])
    assert "agent_credential_path" in config and "instance_arn_prefix" in config
    # The controller writes and deletes the credentials, tags them with that tag only, and
    # never reads one.
    controller = _statements("controller")
    tagging = controller["TagNodeCredentials"]["condition"]
    assert tagging == [
        {"test": "ForAllValues:StringEquals", "variable": "aws:TagKeys",
         "values": ["${local.instance_tag}"]}
    ]  # fmt: skip
    assert not any("ssm:GetParameter" in st["actions"] for st in controller.values())


def test_aws_no_wildcard_action_is_allowed() -> None:
    for _, doc in _of_type(MODULES["aws"], "aws_iam_policy_document", "data"):
        for statement in doc.get("statement", []):
            if statement.get("effect", "Allow") != "Allow":
                continue  # the bucket's TLS-only rule denies s3:*
            found = statement.get("actions", [])
            assert not any("*" in a for a in (found if isinstance(found, list) else [found]))


def test_aws_imdsv2_is_required_and_volumes_are_encrypted() -> None:
    (template,) = [b for _, b in _of_type(MODULES["aws"], "aws_launch_template")]
    metadata = _one(template["metadata_options"])
    assert metadata["http_tokens"] == "required"
    assert metadata["http_put_response_hop_limit"] == 2
    assert metadata["instance_metadata_tags"] == "enabled"  # the node reads its request id
    ebs = _one(_one(template["block_device_mappings"])["ebs"])
    assert ebs["encrypted"] in (True, "true")
    for _, instance in _of_type(MODULES["aws"], "aws_instance"):
        assert _one(instance["metadata_options"])["http_tokens"] == "required"
        assert _one(instance["root_block_device"])["encrypted"] is True


def test_aws_bucket_is_private_encrypted_and_versioned() -> None:
    module = MODULES["aws"]
    (block,) = [b for _, b in _of_type(module, "aws_s3_bucket_public_access_block")]
    for key in ("block_public_acls", "block_public_policy", "ignore_public_acls",
                "restrict_public_buckets"):  # fmt: skip
        assert block[key] is True, key
    (versioning,) = [b for _, b in _of_type(module, "aws_s3_bucket_versioning")]
    assert _one(versioning["versioning_configuration"])["status"] == "Enabled"
    assert _of_type(module, "aws_s3_bucket_server_side_encryption_configuration")
    assert _of_type(module, "aws_s3_bucket_lifecycle_configuration")


def _ingress_cidrs() -> Iterator[tuple[str, Any]]:
    module = MODULES["aws"]
    for name, sg in _of_type(module, "aws_security_group"):
        for rule in sg.get("ingress", []):
            yield name, rule.get("cidr_blocks", []), rule.get("ipv6_cidr_blocks", [])
    for name, rule in _of_type(module, "aws_security_group_rule"):
        if rule.get("type") == "ingress":
            yield name, rule.get("cidr_blocks", []), rule.get("ipv6_cidr_blocks", [])
    for name, rule in _of_type(module, "aws_vpc_security_group_ingress_rule"):
        yield name, [rule.get("cidr_ipv4")], [rule.get("cidr_ipv6")]


def test_aws_no_ingress_from_anywhere() -> None:
    for name, v4, v6 in _ingress_cidrs():
        for cidrs in (v4, v6):
            assert not (isinstance(cidrs, list) and ANYWHERE & set(cidrs)), name
    for name in ("api_allowed_cidrs", "ssh_allowed_cidrs"):
        validations = _named(MODULES["aws"], "variable")[name].get("validation", [])
        assert any("0.0.0.0/0" in str(v["condition"]) for v in validations), name


def test_aws_node_user_data_starts_the_agent_the_way_the_cli_takes_it() -> None:
    text = "\n".join(t.read_text() for t in (MODULES["aws"] / "templates").glob("*.tftpl"))
    for flag in ("agent", "--request-id", "--cluster-id", "--token-file", "--notice-source aws",
                 "--checkpoint-root", "up --provider aws", "--provider-config",
                 "--isolate-jobs"):  # fmt: skip
        assert flag in text, flag


def test_terraform_resources_never_carry_the_nodes_ownership_tags() -> None:
    """The controller lists (and may terminate) instances tagged coadapt-cluster-id with
    coadapt-managed-by = coadapt: its own machine must never look like one of its nodes."""
    aws_tags = str(_named(MODULES["aws"], "locals")["tags"])
    gcp_labels = str(_named(MODULES["gcp"], "locals")["common_labels"])
    assert "coadapt-cluster-id" not in aws_tags
    for tags in (aws_tags, gcp_labels):
        assert re.search(r'"?coadapt-managed-by"? = "terraform"', tags), tags


# ------------------------------------------------------------- AWS: the team store (team_store)


def _refs(value: Any, resource: str) -> bool:
    return resource in str(value)


def test_aws_team_store_is_off_by_default() -> None:
    """Without team_store: one controller, its SQLite file, no database, no balancer."""
    variables = _named(MODULES["aws"], "variable")
    assert variables["team_store"]["default"] is False
    assert variables["controller_count"]["default"] is None
    locals_ = _named(MODULES["aws"], "locals")
    assert locals_["controller_count"] == (
        "${coalesce(var.controller_count, var.team_store ? 2 : 1)}"
    )
    for rtype in ("aws_db_instance", "aws_lb", "aws_lb_target_group", "aws_security_group"):
        for name, body in _of_type(MODULES["aws"], rtype):
            if name in ("controller", "node"):
                continue
            assert body["count"] == "${local.team_store ? 1 : 0}", (rtype, name)


def test_aws_team_store_database_is_private_encrypted_protected_and_backed_up() -> None:
    (db,) = [b for _, b in _of_type(MODULES["aws"], "aws_db_instance")]
    assert db["engine"] == "postgres"
    assert db["publicly_accessible"] is False
    assert db["storage_encrypted"] is True and db["kms_key_id"] == "${var.kms_key_arn}"
    assert db["deletion_protection"] is True and db["skip_final_snapshot"] is False
    assert db["backup_retention_period"] == "${var.store_backup_retention_days}"
    validations = _named(MODULES["aws"], "variable")["store_backup_retention_days"]["validation"]
    assert ">= 1" in str(validations)
    # RDS makes the password and keeps it in Secrets Manager: terraform never holds it.
    assert db["manage_master_user_password"] is True
    assert "password" not in db and "master_password" not in db
    assert db["vpc_security_group_ids"] == ["${aws_security_group.store[0].id}"]
    (group,) = [b for _, b in _of_type(MODULES["aws"], "aws_db_subnet_group")]
    assert group["subnet_ids"] == "${local.subnet_ids}"  # the private subnets
    (params,) = [b for _, b in _of_type(MODULES["aws"], "aws_db_parameter_group")]
    assert {"name": "rds.force_ssl", "value": "1"} in params["parameter"]


def test_aws_team_store_is_reachable_from_the_controllers_only() -> None:
    store_sg = "aws_security_group.store"
    (sg,) = [b for n, b in _of_type(MODULES["aws"], "aws_security_group") if n == "store"]
    assert "ingress" not in sg and "egress" not in sg
    rules = [
        (n, b) for n, b in _of_type(MODULES["aws"], "aws_vpc_security_group_ingress_rule")
        if _refs(b["security_group_id"], store_sg)
    ]  # fmt: skip
    assert [n for n, _ in rules] == ["store_from_controllers"]
    (rule,) = [b for _, b in rules]
    assert rule["referenced_security_group_id"] == "${aws_security_group.controller.id}"
    assert rule["from_port"] == rule["to_port"] == "${local.store_port}"
    assert "cidr_ipv4" not in rule and "cidr_ipv6" not in rule
    for _, rule in _of_type(MODULES["aws"], "aws_vpc_security_group_egress_rule"):
        if _refs(rule.get("referenced_security_group_id"), store_sg):
            assert rule["security_group_id"] == "${aws_security_group.controller.id}"


def test_aws_store_secret_is_readable_by_the_controller_role_only() -> None:
    store = _statements("controller_store")
    assert store["ReadStoreSecret"]["actions"] == ["secretsmanager:GetSecretValue"]
    assert store["ReadStoreSecret"]["resources"] == ["${local.store.secret_arn}"]
    locals_ = _named(MODULES["aws"], "locals")
    assert "aws_db_instance.store[0].master_user_secret[0].secret_arn" in str(locals_["store"])
    attached = [
        b for _, b in _of_type(MODULES["aws"], "aws_iam_role_policy")
        if "controller_store" in str(b["policy"])
    ]  # fmt: skip
    assert [b["role"] for b in attached] == ["${aws_iam_role.controller.id}"]
    for name, doc in _of_type(MODULES["aws"], "aws_iam_policy_document", "data"):
        if name != "controller_store":
            assert "secretsmanager" not in str(doc), name
    assert "secretsmanager" not in str(_policy_actions("node"))
    assert "secretsmanager" not in str(_policy_actions("job_storage"))


def test_aws_store_password_is_in_no_user_data_command_line_or_output() -> None:
    """The controller reads the secret at start (a root ExecStartPre) into a 0600 file under
    /run that systemd passes to `coadapt up` as COADAPT_STORE_URL: the password is in neither
    the user data (which anyone with ec2:DescribeInstanceAttribute reads) nor the command line
    (``/proc/PID/cmdline``), nor an output."""
    template = (MODULES["aws"] / "templates" / "controller-user-data.sh.tftpl").read_text()
    assert "ExecStartPre=+/opt/coadapt/bin/python /etc/coadapt/store-env.py" in template
    assert "EnvironmentFile=-/run/coadapt-store/env" in template
    assert "0o600" in template and "get_secret_value" in template
    (exec_start,) = [ln for ln in template.splitlines() if ln.startswith("ExecStart=")]
    assert "--store" not in exec_start and "password" not in exec_start.lower()
    (instance,) = [b for _, b in _of_type(MODULES["aws"], "aws_instance")]
    args = str(instance["user_data"])
    assert "local.store" in args and "password" not in args.lower()
    assert "password" not in str(_named(MODULES["aws"], "locals")["store"]).lower()
    for name, output in _named(MODULES["aws"], "output").items():
        assert "password" not in str(output["value"]).lower(), name
    module_text = "\n".join(t.read_text() for t in _files(MODULES["aws"]))
    assert "random_password" not in module_text and "master_password" not in module_text


def test_aws_team_store_controllers_sit_behind_an_internal_balancer() -> None:
    (lb,) = [b for _, b in _of_type(MODULES["aws"], "aws_lb")]
    assert lb["internal"] is True and lb["load_balancer_type"] == "network"
    (target,) = [b for _, b in _of_type(MODULES["aws"], "aws_lb_target_group")]
    assert _one(target["health_check"])["protocol"] == "TCP"
    (attach,) = [b for _, b in _of_type(MODULES["aws"], "aws_lb_target_group_attachment")]
    assert attach["count"] == "${local.team_store ? local.controller_count : 0}"
    (instance,) = [b for _, b in _of_type(MODULES["aws"], "aws_instance")]
    assert instance["count"] == "${local.controller_count}"
    # The agents (launch template) and the users (output) get the balancer's address.
    assert "aws_lb.api[0].dns_name" in _named(MODULES["aws"], "locals")["controller_host"]
    assert _named(MODULES["aws"], "output")["controller_url"]["value"] == "${local.controller_url}"


# ------------------------------------------------------------- GCP: the team store (team_store)

_GCP_STORE_RESOURCES = {
    "google_sql_database_instance", "google_sql_database", "google_sql_user", "random_password",
    "random_id", "google_secret_manager_secret_version", "google_compute_region_health_check",
    "google_compute_region_backend_service", "google_compute_forwarding_rule",
}  # fmt: skip


def _gcp(rtype: str, name: str) -> Any:
    return dict(_of_type(MODULES["gcp"], rtype))[name]


def test_gcp_team_store_is_off_by_default() -> None:
    """Without team_store: one controller (named and placed as before), its SQLite file, no
    database, no password, no balancer, no new firewall rule or grant."""
    variables = _named(MODULES["gcp"], "variable")
    assert variables["team_store"]["default"] is False
    assert variables["controller_count"]["default"] is None
    locals_ = _named(MODULES["gcp"], "locals")
    assert locals_["controller_count"] == (
        "${coalesce(var.controller_count, var.team_store ? 2 : 1)}"
    )
    for rtype, name, body in _resources(MODULES["gcp"]):
        if rtype in _GCP_STORE_RESOURCES or name in (
            "store_password", "controller_reads_store_password", "nodes_to_store",
            "health_checks_to_controllers",
        ):  # fmt: skip
            assert body["count"] == "${local.team_store ? 1 : 0}", (rtype, name)
    for name in ("store_range", "store"):
        rtype = "google_compute_global_address" if name == "store_range" else (
            "google_service_networking_connection"
        )  # fmt: skip
        assert _gcp(rtype, name)["count"] == "${local.team_store && local.create_network ? 1 : 0}"
    groups = _gcp("google_compute_instance_group", "controllers")
    assert groups["for_each"] == (
        "${local.team_store ? toset(distinct(local.controller_zones)) : toset([])}"
    )
    vm = _gcp("google_compute_instance", "controller")
    assert vm["count"] == "${local.controller_count}"
    assert vm["name"] == (
        '${count.index == 0 ? local.controller_name : "${local.controller_name}-${count.index}"}'
    )
    assert _one(vm["network_interface"])["network_ip"] == (
        "${local.team_store ? null : google_compute_address.controller.address}"
    )
    assert locals_["controller_zones"] == (
        "${[for i in range(local.controller_count) : var.zones[i % length(var.zones)]]}"
    )
    (precondition,) = vm["lifecycle"][0]["precondition"]
    assert precondition["condition"] == "${local.controller_count == 1 || var.team_store}"


def test_gcp_team_store_database_is_private_tls_only_backed_up_and_protected() -> None:
    db = _gcp("google_sql_database_instance", "store")
    assert db["database_version"] == "POSTGRES_15"
    settings = _one(db["settings"])
    ip = _one(settings["ip_configuration"])
    assert ip["ipv4_enabled"] is False and ip["ssl_mode"] == "ENCRYPTED_ONLY"
    assert ip["private_network"] == "${local.network_self_link}"
    assert "authorized_networks" not in ip
    backups = _one(settings["backup_configuration"])
    assert backups["enabled"] is True and backups["point_in_time_recovery_enabled"] is True
    assert _one(backups["backup_retention_settings"])["retained_backups"] == (
        "${var.store_backup_retention_days}"
    )
    variables = _named(MODULES["gcp"], "variable")
    assert ">= 1" in str(variables["store_backup_retention_days"]["validation"])
    assert db["deletion_protection"] == "${var.store_deletion_protection}"
    assert settings["deletion_protection_enabled"] == "${var.store_deletion_protection}"
    assert variables["store_deletion_protection"]["default"] is True
    assert variables["store_high_availability"]["default"] is True
    flags = {f["name"]: f["value"] for f in settings["database_flags"]}
    assert flags["log_connections"] == "on" and flags["log_lock_waits"] == "on"
    # Private services access on the module's own network, before the instance.
    peering = _gcp("google_compute_global_address", "store_range")
    assert peering["purpose"] == "VPC_PEERING" and peering["address_type"] == "INTERNAL"
    assert db["depends_on"] == ["${google_service_networking_connection.store}"]


def test_gcp_store_password_is_readable_by_the_controllers_only() -> None:
    """One accessor binding, on the store's password secret, for the controllers' service
    account; no project-wide Secret Manager or Cloud SQL role (the controllers connect to the
    private IP with the password: no cloudsql.client without the Auth Proxy)."""
    accessors = [
        (n, b) for n, b in _of_type(MODULES["gcp"], "google_secret_manager_secret_iam_member")
        if b["role"] == "roles/secretmanager.secretAccessor"
    ]  # fmt: skip
    assert [n for n, _ in accessors] == ["controller_reads_store_password"]
    (binding,) = [b for _, b in accessors]
    assert binding["secret_id"] == "${google_secret_manager_secret.store_password[0].secret_id}"
    assert binding["member"] == "serviceAccount:${google_service_account.controller.email}"
    for kind in ("google_project_iam_member", "google_project_iam_binding",
                 "google_project_iam_policy", "google_secret_manager_secret_iam_binding",
                 "google_secret_manager_secret_iam_policy"):  # fmt: skip
        for name, body in _of_type(MODULES["gcp"], kind):
            assert "secretmanager" not in str(body) and "cloudsql" not in str(body), name
    version = _gcp("google_secret_manager_secret_version", "store_password")
    assert version["secret"] == "${google_secret_manager_secret.store_password[0].id}"
    assert version["secret_data"] == "${random_password.store[0].result}"
    user = _gcp("google_sql_user", "store")
    assert user["password"] == "${random_password.store[0].result}"
    assert _gcp("random_password", "store")["length"] >= 32


def _render_controller_startup(store: dict[str, Any] | None) -> str:
    """The controller's startup script as terraform renders it (``templatefile`` in
    ``terraform console``: no provider needed)."""
    template = MODULES["gcp"] / "templates" / "controller-startup.sh.tftpl"
    args = {
        "pip_spec_shell": "'coadapt'", "provider_json": "{}",
        "controller_command": "/opt/coadapt/bin/coadapt up --provider gcp --port 8080",
        "store": store,
    }  # fmt: skip
    expression = f"jsonencode(templatefile({json.dumps(str(template))}, {_hcl(args)}))"
    done = subprocess.run(
        ["terraform", "console"], input=expression, capture_output=True, text=True, timeout=60,
        env={**os.environ, "TF_CLI_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rendered: str = json.loads(json.loads(done.stdout))
    return rendered


def _hcl(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_hcl(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


_STORE = {
    "host": "10.20.0.3", "port": 5432, "database": "coadapt", "user": "coadapt",
    "project": "team-project-1", "secret_id": "coadapt-team-a-store-password",
}  # fmt: skip


@pytest.mark.skipif(not shutil.which("terraform"), reason="needs a terraform binary")
def test_gcp_store_password_is_in_no_startup_script_command_line_or_output() -> None:
    """The controller reads the password at each start (a root ExecStartPre) into a 0600 file
    under /run that systemd passes to `coadapt up` as COADAPT_STORE_URL: it is in neither the
    startup script (instance metadata, readable with compute.instances.get), nor the command
    line, nor an output. Without the store the script starts `coadapt up` as before."""
    plain = _render_controller_startup(None)
    with_store = _render_controller_startup(_STORE)
    for script in (plain, with_store):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)
        (exec_start,) = [ln for ln in script.splitlines() if ln.startswith("ExecStart=")]
        assert "--store" not in exec_start and "password" not in exec_start.lower()
    assert "store" not in plain.replace("provider.json", "") and "COADAPT_STORE_URL" not in plain
    assert "ExecStartPre=+/opt/coadapt/bin/python /etc/coadapt/store-env.py" in with_store
    assert "EnvironmentFile=-/run/coadapt-store/env" in with_store
    assert "secrets/coadapt-team-a-store-password/versions/latest:access" in with_store
    compile(_store_env_script(with_store), "store-env.py", "exec")
    assert "random_password" not in str(_named(MODULES["gcp"], "locals")["store"])
    for name, output in _named(MODULES["gcp"], "output").items():
        assert "random_password" not in str(output["value"]), name
    assert "random_password" not in str(_gcp("google_compute_instance", "controller"))
    startup = _named(MODULES["gcp"], "locals")["controller_startup_script"]
    assert "local.store" in startup and "random_password" not in startup


class _GoogleApis(http.server.BaseHTTPRequestHandler):
    """A forward proxy standing in for the metadata server (plain HTTP) and Secret Manager
    (HTTPS through CONNECT, with the test's own certificate): what a controller's
    store-env.py talks to, on loopback."""

    token = "ya29.test-token"
    password = "p@ss/w:rd%+ \u00e9"
    secret_path = (
        "/v1/projects/team-project-1/secrets/coadapt-team-a-store-password/versions/latest:access"
    )
    context: ClassVar[ssl.SSLContext]
    seen: ClassVar[list[str]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # the metadata server, through the proxy
        url = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token"
        assert self.path == url and self.headers["Metadata-Flavor"] == "Google"
        self.seen.append("token")
        self._json(self.wfile, {"access_token": self.token, "expires_in": 3599})

    def do_CONNECT(self) -> None:  # Secret Manager, over TLS
        assert self.path == "secretmanager.googleapis.com:443"
        self.send_response(200)
        self.end_headers()
        with self.context.wrap_socket(self.connection, server_side=True) as tls:
            head = b""
            while b"\r\n\r\n" not in head:
                head += tls.recv(4096)
            lines = head.decode().split("\r\n")
            headers = dict(ln.split(": ", 1) for ln in lines[1:] if ": " in ln)
            assert lines[0] == f"GET {self.secret_path} HTTP/1.1", lines[0]
            assert headers["Authorization"] == f"Bearer {self.token}"
            self.seen.append("secret")
            data = base64.b64encode(self.password.encode()).decode()
            self._json(tls, {"name": "x", "payload": {"data": data}})
        self.close_connection = True

    @staticmethod
    def _json(out: Any, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        out.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode()
            + raw
        )


@pytest.mark.skipif(
    not (shutil.which("terraform") and shutil.which("openssl")),
    reason="needs a terraform binary (templatefile) and openssl (a test certificate)",
)
def test_gcp_controller_start_reads_the_store_password_into_a_private_environment_file(
    tmp_path: Path,
) -> None:
    """The store-env.py a controller runs before each start, as terraform renders it, run for
    real against loopback stand-ins for the metadata server and Secret Manager: it asks the
    metadata server for a token, reads the password's latest version with it, and writes a
    0600 file whose COADAPT_STORE_URL (TLS required) gives libpq back the exact password."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=secretmanager.googleapis.com",
         "-addext", "subjectAltName=DNS:secretmanager.googleapis.com",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    _GoogleApis.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    _GoogleApis.context.load_cert_chain(cert, key)
    _GoogleApis.seen = []
    run_dir = tmp_path / "run"
    script = _store_env_script(_render_controller_startup(_STORE))
    assert script.count("/run/coadapt-store") == 4
    (tmp_path / "store-env.py").write_text(script.replace("/run/coadapt-store", str(run_dir)))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GoogleApis)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proxy = f"http://127.0.0.1:{server.server_address[1]}"
        env = {
            "PATH": os.environ["PATH"], "http_proxy": proxy, "https_proxy": proxy,
            "SSL_CERT_FILE": str(cert),
        }  # fmt: skip
        done = subprocess.run([sys.executable, str(tmp_path / "store-env.py")], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr
    assert _GoogleApis.seen == ["token", "secret"]
    env_file = run_dir / "env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    (line,) = env_file.read_text().splitlines()
    name, _, quoted = line.partition("=")
    assert name == "COADAPT_STORE_URL" and quoted[0] == quoted[-1] == '"'
    from psycopg.conninfo import conninfo_to_dict

    assert conninfo_to_dict(quoted[1:-1]) == {
        "user": "coadapt", "password": _GoogleApis.password, "host": "10.20.0.3",
        "port": "5432", "dbname": "coadapt", "sslmode": "require",
    }  # fmt: skip


def _store_env_script(startup: str) -> str:
    match = re.search(r"<<'COADAPT_STORE_ENV'\n(.*?)\nCOADAPT_STORE_ENV\n", startup, re.S)
    assert match, "no store-env.py in the startup script"
    return match.group(1)


def test_gcp_team_store_controllers_sit_behind_an_internal_balancer() -> None:
    rule = _gcp("google_compute_forwarding_rule", "api")
    assert rule["load_balancing_scheme"] == "INTERNAL" and rule["ip_protocol"] == "TCP"
    assert rule["ports"] == ["${tostring(var.controller_port)}"]
    # The static internal address controller_url names: the agents and users keep it.
    assert rule["ip_address"] == "${google_compute_address.controller.address}"
    assert rule["allow_global_access"] is False
    assert _named(MODULES["gcp"], "locals")["controller_url"] == (
        "http://${google_compute_address.controller.address}:${var.controller_port}"
    )
    backends = _gcp("google_compute_region_backend_service", "api")
    assert backends["load_balancing_scheme"] == "INTERNAL" and backends["protocol"] == "TCP"
    assert backends["health_checks"] == ["${google_compute_region_health_check.api[0].id}"]
    (backend,) = [d["backend"] for d in backends["dynamic"]]
    assert backend["for_each"] == "${google_compute_instance_group.controllers}"
    check = _gcp("google_compute_region_health_check", "api")
    assert _one(check["tcp_health_check"])["port"] == "${var.controller_port}"
    groups = _gcp("google_compute_instance_group", "controllers")
    assert "google_compute_instance.controller[i].self_link" in str(groups["instances"])


def test_gcp_team_store_firewall_opens_only_the_health_checks_and_closes_the_store() -> None:
    """The balancer passes the clients' own addresses through, so the rules that admit the
    nodes and api_allowed_cidrs to the controllers serve it unchanged; the one new ingress
    rule admits Google's health checkers, to the API port of the controllers only. The nodes
    (their jobs) are denied any egress to the store's private IP."""
    checks = _gcp("google_compute_firewall", "health_checks_to_controllers")
    assert _named(MODULES["gcp"], "locals")["health_check_ranges"] == [
        "35.191.0.0/16", "130.211.0.0/22"
    ]  # fmt: skip
    assert checks["source_ranges"] == "${local.health_check_ranges}"
    assert checks["target_tags"] == ["${local.controller_tag}"]
    assert checks["allow"] == [{"protocol": "tcp", "ports": ["${tostring(var.controller_port)}"]}]
    closed = _gcp("google_compute_firewall", "nodes_to_store")
    assert closed["direction"] == "EGRESS" and closed["target_tags"] == ["${local.node_tag}"]
    assert closed["deny"] == [{"protocol": "all"}] and "allow" not in closed
    assert closed["destination_ranges"] == [
        "${google_sql_database_instance.store[0].private_ip_address}/32"
    ]  # fmt: skip
    nodes = _gcp("google_compute_firewall", "nodes_to_controller")
    assert nodes["source_tags"] == ["${local.node_tag}"]
    assert nodes["target_tags"] == ["${local.controller_tag}"]


TF_MIRROR_ROOT = Path("/opt/tf-plugins")
TF_MIRROR = TF_MIRROR_ROOT / "registry.terraform.io" / "hashicorp" / "aws"
GCP_PROVIDERS = [TF_MIRROR_ROOT / "registry.terraform.io" / "hashicorp" / p
                 for p in ("google", "random")]  # fmt: skip


def _terraform_test(cloud: str, tmp_path: Path, env: dict[str, str]) -> None:
    """``terraform init`` from the local provider mirror, then ``terraform test`` (the
    module's tests/*.tftest.hcl), on a copy of the module: every run passes."""
    module = tmp_path / cloud
    shutil.copytree(MODULES[cloud], module)
    rc = tmp_path / "tfrc"
    rc.write_text(
        f'provider_installation {{\n filesystem_mirror {{ path = "{TF_MIRROR_ROOT}" }}\n}}\n'
    )
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(rc), "TF_IN_AUTOMATION": "1", **env}
    for command in (["init", "-backend=false", "-input=false"], ["test"]):
        done = subprocess.run(
            ["terraform", *command], cwd=module, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "0 failed" in done.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("terraform") and TF_MIRROR.is_dir()),
    reason="needs a terraform binary and the hashicorp/aws provider in a local mirror",
)
def test_aws_plans_offline_with_terraform_test(tmp_path: Path) -> None:
    """Where terraform and the AWS provider are at hand: ``terraform test`` plans the module
    with fake credentials and overridden data sources (terraform/aws/tests/plan.tftest.hcl):
    a new VPC and an existing one plan, and every refused input is refused."""
    _terraform_test("aws", tmp_path, {
        "AWS_ACCESS_KEY_ID": "AKIAFAKEFAKEFAKEFAKE", "AWS_SECRET_ACCESS_KEY": "fake",
    })  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    not (shutil.which("terraform") and all(p.is_dir() for p in GCP_PROVIDERS)),
    reason="needs a terraform binary and hashicorp/google and hashicorp/random in a local mirror",
)
def test_gcp_plans_offline_with_terraform_test(tmp_path: Path) -> None:
    """Where terraform and the google and random providers are at hand: ``terraform test``
    plans the module with mock providers (terraform/gcp/tests/plan.tftest.hcl): the team
    store's resources exist only with team_store, the database has no public IP, the password's
    grant is on its one secret, controller_count places the controllers, and every refused
    input is refused."""
    _terraform_test("gcp", tmp_path, {})
