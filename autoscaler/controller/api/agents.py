"""The agents' endpoints: register, heartbeat, assignments and job exits, each for the
instance its credential names.

* **Assignments** list only ``running`` jobs: a cancelled or ended job disappears at once (its
  agent stops it), and a job queued for a retry is started again only when the next round
  places it. ``nodes`` is every instance of the job with its GPUs, in rank order (by instance
  key), this one included; ``rendezvous`` is ``HOST:PORT`` on the first node
  (:func:`rendezvous_endpoint`), ``HOST`` being the address its agent gave with ``register``
  or ``heartbeat`` (:meth:`ApiState.remember`), ``null`` until it is known.
* **A job exit is counted once per run**: the exit of a job that is not ``running`` is
  answered with its status and ``"counted": false``, without calling ``on_job_exit``; an exit
  from an instance the running job is not assigned to is a 409.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import re
from collections.abc import Mapping
from typing import Any, Final

from werkzeug.wrappers import Request, Response

from autoscaler.controller.api.auth import principal_of
from autoscaler.controller.api.logs import printable
from autoscaler.controller.api.state import ApiState, Route
from autoscaler.controller.api.wire import json_response
from autoscaler.controller.client import ApiError, instance_to_dict
from autoscaler.controller.credentials import Role
from autoscaler.controller.errors import StaleVersionError
from autoscaler.controller.events import EventKind
from autoscaler.controller.jobbook import JOB_NAME_PATTERN, JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.store import JobBatch, JobStatus

__all__ = [
    "MAX_RESTART_JOBS",
    "RENDEZVOUS_PORT_BASE",
    "RENDEZVOUS_PORT_SPAN",
    "ROUTES",
    "rendezvous_endpoint",
]

RENDEZVOUS_PORT_BASE: Final = 29500
RENDEZVOUS_PORT_SPAN: Final = 1000
MAX_RESTART_JOBS: Final = 256
"""The most jobs a restarted agent may name as adopted or lost (its own bound,
``agent.MAX_ADOPTED``, is the same)."""
_log = logging.getLogger(__name__)
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")


def rendezvous_endpoint(job: str, host: str, node: str = "") -> str:
    """``HOST:PORT`` of ``job``'s c10d rendezvous on ``host``, the address of its first node
    ``node`` (an instance key): the port is stable per job and node (``RENDEZVOUS_PORT_BASE``
    plus a hash of both modulo ``RENDEZVOUS_PORT_SPAN``), so jobs whose first node is the
    same instance get different ports unless their names collide, and two clusters on one
    machine (the local provider's instances share its address) do not meet on a job name
    they both use: their instance keys differ."""
    digest = hashlib.sha256(f"{job}\0{node}".encode()).digest()
    port = RENDEZVOUS_PORT_BASE + int.from_bytes(digest[:4], "big") % RENDEZVOUS_PORT_SPAN
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _register(state: ApiState, request: Request) -> Response:
    body = state.body(request)
    key = body.get("instance_key")
    if not isinstance(key, str) or not key:
        raise ApiError(400, "instance_key must be a non-empty string", "instance_key")
    subject = principal_of(request).subject
    if key != subject:
        raise ApiError(403, f"this credential is for instance {subject!r}, not {key!r}")
    address = _address(body)
    row = state.store().get_instance(key)
    if row.status is not InstanceStatus.RUNNING:
        raise ApiError(409, f"instance {key!r} is {row.status.value}, not running")
    restart = body.get("restart")
    if restart is not None:
        adopted, lost = _restart_lists(restart)
        _agent_restarted(state, key, adopted, lost)
    state.remember(key, address)
    _log.info("agent of instance %s registered", key)
    return json_response(instance_to_dict(row))


def _agent_restarted(state: ApiState, key: str, adopted: list[str], lost: list[str]) -> None:
    """An agent restarted (its previous life ended without stopping its jobs): one event,
    and each job whose launcher it found gone, still assigned to this instance, starts
    again from its checkpoint: a restart of that job (:meth:`Store.record_relaunch`)."""
    store = state.store()
    assigned = {job for job, k in store.list_assignments() if k == key}
    relaunched = [job for job in lost if job in assigned]
    for job in relaunched:
        store.record_relaunch(job, key)
    parts = ["its agent restarted (the previous one ended without stopping its jobs)"]
    if adopted:
        parts.append(f"it adopted the running launcher of {', '.join(adopted)}")
    if relaunched:
        parts.append(
            f"the launcher of {', '.join(relaunched)} was gone: it starts again from its checkpoint"
        )
    if not adopted and not relaunched:
        parts.append("no job of it was running")
    said = "; ".join(parts)
    store.add_events([(state.clock.now_s(), EventKind.AGENT_RESTART.value, key, said)])
    _log.warning("agent of instance %s: %s", key, said)


def _heartbeat(state: ApiState, request: Request, instance_key: str) -> Response:
    address = _address(state.body(request, optional=True))
    store = state.store()
    now = state.clock.now_s()
    store.record_heartbeat(instance_key, now)
    state.remember(instance_key, address)
    row = store.get_instance(instance_key)
    answer = {"instance_key": instance_key, "at_s": now, "status": row.status.value}
    if principal_of(request).renew:  # made with the previous agent key: the new one
        answer["credential"] = state.credentials.current().agent_credential(instance_key)
        _log.info("agent of instance %s renewed its credential", instance_key)
    return json_response(answer)


def _assignments(state: ApiState, request: Request, instance_key: str) -> Response:
    store = state.store()
    row = store.get_instance(instance_key)
    addresses = state.addresses()
    credentials = state.credentials.current()
    out = []
    for mine in store.assignment_rows(instance=instance_key):
        job = store.get_job(mine.job_name)
        if job.status is not JobStatus.RUNNING:
            continue
        nodes = [(a.instance_key, a.gpus) for a in store.assignment_rows(job=job.name)]
        if not any(key == instance_key for key, _ in nodes):
            continue  # released since the first read
        spec = JobSubmission.from_json(job.spec_json)
        first = addresses.get(nodes[0][0])
        out.append(
            {
                "job": job.name,
                "status": job.status.value,
                "gpus": dict(nodes)[instance_key],
                "nodes": [[key, gpus] for key, gpus in nodes],
                "node_rank": [key for key, _ in nodes].index(instance_key),
                "addresses": {key: addresses.get(key) for key, _ in nodes},
                "rendezvous": None
                if first is None
                else rendezvous_endpoint(job.name, first, nodes[0][0]),
                "command": list(spec.command),
                "checkpoint_uri": spec.checkpoint_uri,
                "batch": _launch_batch(store.get_batch(job.name), nodes),
                "spec": dataclasses.asdict(spec),
                "report_token": credentials.report_credential(job.name),
            }
        )
    return json_response(
        {"instance_key": instance_key, "instance_status": row.status.value, "assignments": out}
    )


def _job_exit(state: ApiState, request: Request, instance_key: str, name: str) -> Response:
    body = state.body(request)
    failed = body.get("failed")
    if not isinstance(failed, bool):
        raise ApiError(400, "failed must be true or false", "failed")
    cause = body.get("cause")
    if cause is not None and not (isinstance(cause, str) and cause.strip()):
        raise ApiError(400, "cause must be a non-empty string", "cause")
    deterministic = body.get("deterministic", False)
    if not isinstance(deterministic, bool) or (deterministic and not failed):
        raise ApiError(
            400, "deterministic must be true or false (true only if failed)", "deterministic"
        )
    store = state.store()
    store.get_instance(instance_key)
    with state.exit_lock:  # the nodes of one run report at once: one of them counts
        job = store.get_job(name)
        if job.status is not JobStatus.RUNNING:
            return json_response({"job": name, "status": job.status.value, "counted": False})
        if not store.list_assignments(job=name, instance=instance_key):
            raise ApiError(
                409,
                f"job {name!r} is not assigned to instance {instance_key!r}: processes "
                "the controller stopped are not reported",
            )
        final = {"deterministic": True} if deterministic else {}
        status = JobStatus(state.on_job_exit(name, failed=failed, **final))
        if failed and cause is not None:  # why it failed last: coadapt status shows it
            with contextlib.suppress(StaleVersionError):  # changed meanwhile: it moved on
                after = store.get_job(name)
                store.update_job(name, after.version, reason=printable(cause))
    _log.info("job %s exited on %s (failed=%s): now %s", name, instance_key, failed, status)
    return json_response({"job": name, "status": status.value, "counted": True})


def _launch_batch(planned: JobBatch | None, nodes: list[tuple[str, int]]) -> dict[str, int] | None:
    """The batch an assignment starts the job with (``--batch-size``, ``--accum-steps``):
    the planned one when it was planned for the job's GPUs now."""
    if planned is None or planned.gpus != sum(g for _, g in nodes):
        return None
    return {
        "global_batch_size": planned.global_batch_size,
        "local_batch_size": planned.local_batch_size,
        "accum_steps": planned.accum_steps,
    }


def _restart_lists(value: object) -> tuple[list[str], list[str]]:
    """A register body's ``restart``: ``{"adopted": [jobs], "lost": [jobs]}`` (job names,
    at most :data:`MAX_RESTART_JOBS` each); 400 otherwise."""
    if not isinstance(value, dict) or set(value) - {"adopted", "lost"}:
        raise ApiError(400, 'restart must be {"adopted": [...], "lost": [...]}', "restart")
    out: list[list[str]] = []
    for name in ("adopted", "lost"):
        jobs = value.get(name, [])
        if not isinstance(jobs, list) or len(jobs) > MAX_RESTART_JOBS:
            raise ApiError(
                400, f"restart.{name} must be a list of at most {MAX_RESTART_JOBS} jobs", "restart"
            )
        if not all(isinstance(j, str) and JOB_NAME_PATTERN.fullmatch(j) for j in jobs):
            raise ApiError(400, f"restart.{name} must hold job names", "restart")
        out.append(sorted(set(jobs)))
    return out[0], out[1]


def _address(body: Mapping[str, Any]) -> str | None:
    address = body.get("address")
    if address is None:
        return None
    if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
        raise ApiError(400, "address must be a host name or an IP address", "address")
    return address


ROUTES: Final[tuple[Route, ...]] = (
    ("POST", "/v1/agents/register", Role.AGENT, _register),
    ("POST", "/v1/agents/<instance_key>/heartbeat", Role.AGENT, _heartbeat),
    ("GET", "/v1/agents/<instance_key>/assignments", Role.AGENT, _assignments),
    ("POST", "/v1/agents/<instance_key>/jobs/<name>/exit", Role.AGENT, _job_exit),
)
"""The agents' routes."""
