"""Keep jobs on a cloud node away from its instance metadata service.

On AWS and GCP every process of a node can reach the metadata service at ``169.254.169.254``
(``metadata.google.internal`` is that address; AWS also answers at ``fd00:ec2::254`` over
IPv6): there a job could take the node role's credentials (AWS) or read the startup script
that carries the node's agent credential (GCP). Jobs run as their own users, all within
``JOB_UID_BASE .. JOB_UID_BASE + JOB_UID_SPAN - 1`` (:mod:`coadapt_common.jobexec`), so one
netfilter rule per address, matched on the sending process's uid (``-m owner``, in the
``OUTPUT`` chain), rejects whatever any job sends there, while the agent (root) still reaches
it.

:func:`metadata_firewall_rules` builds the rules (pure); :func:`install_metadata_firewall`
adds each one that is not there yet (``-C`` first, then ``-I``: idempotent, so an agent that
restarts adds nothing twice) with the ``iptables`` / ``ip6tables`` executables found on
``PATH``, and raises :class:`FirewallError`, in one line, when one is missing or fails. The
agent (:func:`autoscaler.controller.service.agent_main`) installs them before it starts any
job and refuses to run when it cannot, unless told ``--allow-job-metadata`` (unsafe).

Limits: the rules were tested here with a stand-in ``iptables`` that records its arguments
(this machine has neither iptables nor ``CAP_NET_ADMIN``), never against a real kernel; they
cover jobs run as their own users (``--isolate-jobs``) only; a job still shares the node's
network otherwise (the controller, its peers, the internet); GCP's IPv6 metadata address
(``fd20:ce::254``, IPv6-only instances) is not covered.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Final

from autoscaler.controller.errors import ControllerError
from coadapt_common.jobexec import JOB_UID_BASE, JOB_UID_SPAN

__all__ = [
    "AWS_METADATA_IPV6",
    "METADATA_IPV4",
    "FirewallError",
    "install_metadata_firewall",
    "metadata_firewall_rules",
]

METADATA_IPV4: Final = "169.254.169.254"
"""The metadata service of AWS and GCP (IPv4)."""
AWS_METADATA_IPV6: Final = "fd00:ec2::254"
"""AWS's metadata service over IPv6 (Nitro instances)."""
CLOUDS: Final = ("aws", "gcp")
FIREWALL_TIMEOUT_S: Final = 30.0
"""How long one ``iptables`` call may take (``-w``: it waits for the xtables lock)."""


class FirewallError(ControllerError):
    """The jobs' metadata firewall could not be checked or installed (a missing executable,
    a refused rule); the message is one line."""


def metadata_firewall_rules(cloud: str) -> tuple[list[str], ...]:
    """The commands that add the rules keeping jobs from ``cloud``'s metadata service: one
    argv per address (``iptables`` for IPv4 on aws and gcp, ``ip6tables`` for AWS's IPv6
    address), each ``-w -I OUTPUT -d ADDRESS -m owner --uid-owner FIRST-LAST -j REJECT`` over
    the whole job uid range. :class:`ValueError` for another cloud (the local provider has no
    metadata service: nothing to add)."""
    if cloud not in CLOUDS:
        raise ValueError(f"no metadata firewall for {cloud!r}: aws or gcp")
    uids = f"{JOB_UID_BASE}-{JOB_UID_BASE + JOB_UID_SPAN - 1}"
    targets = [("iptables", f"{METADATA_IPV4}/32")]
    if cloud == "aws":
        targets.append(("ip6tables", f"{AWS_METADATA_IPV6}/128"))
    match = ["-m", "owner", "--uid-owner", uids, "-j", "REJECT"]
    return tuple([tool, "-w", "-I", "OUTPUT", "-d", address, *match] for tool, address in targets)


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=FIREWALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FirewallError(f"{argv[0]}: {e}") from e


def install_metadata_firewall(cloud: str) -> list[list[str]]:
    """Add each rule of :func:`metadata_firewall_rules` that ``iptables -C`` does not find;
    the commands it ran to add (empty: all were there). :class:`FirewallError` (one line: the
    command and what it said) when an executable is missing from ``PATH`` or an add fails."""
    added = []
    for rule in metadata_firewall_rules(cloud):
        tool = shutil.which(rule[0])
        if tool is None:
            raise FirewallError(f"{rule[0]} not found on PATH")
        check = [tool, *rule[1:]]
        check[check.index("-I")] = "-C"
        if _run(check).returncode == 0:
            continue
        add = [tool, *rule[1:]]
        out = _run(add)
        if out.returncode != 0:
            said = " ".join((out.stderr or out.stdout).split()) or f"exit status {out.returncode}"
            raise FirewallError(f"{' '.join(rule)}: {said}")
        added.append(add)
    return added
