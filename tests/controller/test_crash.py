"""Crash safety: kill -9 the controller at 20 seeded random points, restart it, and check.

Each run is a real process (``tests/controller/world.py``) killed with SIGKILL at the N-th
passage of one crash point (between a store write and a cloud call, or between a cloud
answer and its record); the point and N are drawn from a seeded generator and printed, so a
failure names the run to reproduce (``python -m tests.controller.world --dir D --cloud fake
--kill-point P --kill-at N``, repeating the earlier runs of the printed sequence). The cloud
outlives the process: the fake provider's file-backed cloud, or a real moto server for aws.

After every kill: every job is still in the store; every live instance of the cluster
carries a request id the store knows (intent is written before every launch, so nothing can
leak); no request id has two live instances (no double launch). At the end a run without a
kill finishes every job and releases the fleet, and the cloud lists nothing.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from autoscaler.controller.loop import CRASH_POINTS
from autoscaler.controller.store import JobStatus, Store
from coadapt_common.clock import FakeClock
from providers.tags import CLUSTER_ID_TAG, REQUEST_ID_TAG

from .world import CLUSTER

ROOT = Path(__file__).resolve().parents[2]
KILLS = 20
JOBS = 3
WORK = 10**9  # GPU-rounds per job while killing: the jobs outlive the 20 kills
FINAL_WORK = 50  # ... and in the last run, which must finish them

pytestmark = pytest.mark.slow


def _run(
    d: Path, cloud: str, kill_at: int, url: str | None, point: str | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tests.controller.world", "--dir", str(d), "--cloud", cloud]
    work = WORK if kill_at else FINAL_WORK
    cmd += ["--kill-at", str(kill_at), "--jobs", str(JOBS), "--work", str(work)]
    if point:
        cmd += ["--kill-point", point]
    if url:
        cmd += ["--moto-url", url]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def _live_fake(d: Path) -> list[tuple[str, str]]:
    """(instance id, request id) of the fake cloud's live instances of the cluster."""
    state = json.loads((d / "cloud.json").read_text())
    return [
        (i["id"], i["tags"].get(REQUEST_ID_TAG, ""))
        for i in state["instances"]
        if i["terminated_at_s"] is None and i["tags"].get(CLUSTER_ID_TAG) == CLUSTER
    ]


def _live_aws(url: str) -> list[tuple[str, str]]:
    from emulators.aws_moto import admin_client

    ec2 = admin_client(url, "ec2")
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{CLUSTER_ID_TAG}", "Values": [CLUSTER]},
            {"Name": "instance-state-name", "Values": ["pending", "running", "stopping"]},
        ]
    )
    out = []
    for page in pages:
        for res in page["Reservations"]:
            for inst in res["Instances"]:
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                out.append((inst["InstanceId"], tags.get(REQUEST_ID_TAG, "")))
    return out


def _check(d: Path, live: list[tuple[str, str]], where: str) -> None:
    store = Store.open(d / "store.db", FakeClock())
    try:
        assert len(store.list_jobs()) == JOBS, f"{where}: a job went missing"
        known = {r.request_id for r in store.list_instances()}
        unknown = [iid for iid, req in live if req not in known]
        assert not unknown, f"{where}: instances no store row knows (leaks): {unknown}"
        twice = [req for req, n in Counter(req for _, req in live).items() if n > 1]
        assert not twice, f"{where}: two live instances for one request id: {twice}"
    finally:
        store.close()


def _crash_run(d: Path, cloud: str, url: str | None, seed: int) -> None:
    rng = random.Random(seed)
    points: Counter[str] = Counter()

    def live() -> list[tuple[str, str]]:
        return _live_fake(d) if cloud == "fake" else _live_aws(url or "")

    plan = [CRASH_POINTS[k % len(CRASH_POINTS)] for k in range(KILLS)]
    rng.shuffle(plan)  # every point, in a seeded order
    for k, point in enumerate(plan):
        kill_at = rng.randint(1, 3)
        where = f"{cloud} kill {k + 1}/{KILLS}: --kill-point {point} --kill-at {kill_at}"
        print(where)
        out = _run(d, cloud, kill_at, url, point)
        assert out.returncode == -9, f"{where}: exit {out.returncode}\n{out.stdout}{out.stderr}"
        line = next(x for x in out.stdout.splitlines() if x.startswith("KILL "))
        assert line.startswith(f"KILL {kill_at} "), out.stdout
        points[line.split()[2]] += 1
        _check(d, live(), where)
    print(f"{cloud}: kills per crash point {dict(points)}")
    assert set(points) == set(CRASH_POINTS)  # every kind of point was hit
    out = _run(d, cloud, 0, url)
    assert out.returncode == 0 and "DONE clean=True" in out.stdout, out.stdout + out.stderr
    assert live() == [], f"{cloud}: instances left after down"
    store = Store.open(d / "store.db", FakeClock())
    try:
        assert {j.status for j in store.list_jobs()} == {JobStatus.COMPLETED}
    finally:
        store.close()


@pytest.mark.parametrize("seed", [1])
def test_kill9_with_the_fake_cloud(tmp_path: Path, seed: int) -> None:
    _crash_run(tmp_path, "fake", None, seed)


def test_kill9_with_aws_on_moto(tmp_path: Path) -> None:
    pytest.importorskip("moto")
    from emulators.aws_moto import shared_moto_server

    server = shared_moto_server()
    foreign = _foreign_instances(server.url)
    _crash_run(tmp_path, "aws", server.url, 2)
    # Ownership: across 21 controller processes, instances without our cluster tag (none, or
    # another cluster's) were never listed, adopted or terminated.
    from emulators.aws_moto import admin_client

    found = admin_client(server.url, "ec2").describe_instances(InstanceIds=foreign)
    states = [i["State"]["Name"] for r in found["Reservations"] for i in r["Instances"]]
    assert states == ["running", "running"]
    store = Store.open(tmp_path / "store.db", FakeClock())
    try:
        assert not {r.provider_instance_id for r in store.list_instances()} & set(foreign)
    finally:
        store.close()


def _foreign_instances(url: str) -> list[str]:
    """One untagged instance and one of another coadapt cluster, made behind our back."""
    from emulators.aws_moto import admin_client, default_network

    image_id, subnets = default_network(url)
    ec2 = admin_client(url, "ec2")
    ids = []
    for tags in ([], [{"Key": CLUSTER_ID_TAG, "Value": "another-cluster"}]):
        spec = [{"ResourceType": "instance", "Tags": tags}] if tags else []
        out = ec2.run_instances(
            ImageId=image_id,
            InstanceType="g4dn.xlarge",
            MinCount=1,
            MaxCount=1,
            SubnetId=next(iter(subnets.values())),
            TagSpecifications=spec,
        )
        ids.append(out["Instances"][0]["InstanceId"])
    return ids
