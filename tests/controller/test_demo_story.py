"""`coadapt demo` as a new user runs it (issue 28, items 1 and 2): it tells the story (each
event with its time and reason, the preemption and the resume in words), ends with the cost
report, says where its state is, leaves no instance; and `coadapt cost report --state-dir`
on its store tells the truth: the run's real length, one preempted instance for the one
notice injected, the job preemption it caused, useful samples for every finished job, and a
total equal to the store's per-instance bills to the cent. Issue 41, item 7: the story has a
re-batch without a restart (a `rebatch` event, and
the job's own log shows the new batch within the same launch), a preemption and the resume,
savings against on-demand > 0 (the headline figure), events in time order, and each job's
progress in samples as a share; a scale-up (`rescale mlp-medium: 1 -> 2 GPUs`) when the
policy finds it pays, not in every run (see the last check). Slow: one real demo (~1-2 min)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COADAPT = [sys.executable, "-m", "autoscaler.cli"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]

STAMP = r"^\d\d:\d\d:\d\d "


def _coadapt(*args: str, env: dict[str, str], timeout_s: float = 120.0) -> str:
    out = subprocess.run(
        [*COADAPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stdout + out.stderr
    return out.stdout


def test_the_demo_tells_its_story_and_its_cluster_report_tells_the_truth(tmp_path: Path) -> None:
    env = {**os.environ, "COADAPT_HOME": str(tmp_path)}
    state = tmp_path / "demo"
    # ~1-2 min on a quiet machine; room for a loaded one (the jobs must all finish)
    demo = ("demo", "--state-dir", str(state), "--timeout-s", "600")
    out = _coadapt(*demo, env=env, timeout_s=720.0)

    # the story: timestamped events, the injected preemption and what it did, in words
    injected = re.findall(r"injecting a spot preemption: the cloud takes (i-\w+) back", out)
    assert len(injected) == 1, out[-4000:]
    victim = injected[0]
    assert re.search(STAMP + rf"notice +{victim}: spot interruption notice", out, re.M), out
    assert re.search(STAMP + rf"preemption +{victim}: ended after its spot notice", out, re.M)
    told = re.findall(STAMP + rf"(?:stop|move|rescale) +(\S+): .*its instance {victim} got a "
                      "spot", out, re.M)  # fmt: skip
    assert told, out[-4000:]
    moved = told[0]
    assert re.search(STAMP + rf"(?:resume|move|rescale) +{moved}: .*(checkpoint)", out, re.M)
    for job in ("mlp-small", "mlp-medium", "mlp-wide"):
        assert re.search(STAMP + rf"completion +{job}: completed in \d+ s", out, re.M), out
        assert re.search(STAMP + rf"start +{job}: placed on", out, re.M), out
    assert re.search(STAMP + r"launch +i-\w+: .*wanted by the plan", out, re.M)
    assert re.search(STAMP + r"release +i-\w+: released", out, re.M)
    # issue 41: one word per thing, a scale-up, a re-batch without a restart, time order
    assert not re.search(STAMP + r"rescale +\S+: (\d+) -> \1 GPU", out, re.M), out  # a move
    rebatched = re.findall(STAMP + r"rebatch +(\S+): batch \d+ ", out, re.M)
    assert rebatched, out[-6000:]
    log = _coadapt("logs", rebatched[0], "--state-dir", str(state), env=env)
    # its trainer took a new batch within one launch: "batch A -> B ... (attempt N)", and
    # that launch's attempt is the one it started with
    took = re.findall(r"elastic_mlp: batch \d+ .*-> \d+ .*without a restart \(attempt (\d+)\)",
                      log)  # fmt: skip
    assert took, log[-3000:]
    started = re.findall(r"elastic_mlp: attempt (\d+):", log)
    assert started and took[0] in started, log[-3000:]
    stamps = [
        line[:8]
        for line in out.splitlines()
        if re.match(STAMP, line) and line[9:19].strip() not in ("demo", "")
    ]
    assert stamps == sorted(stamps), "events out of time order"
    for job in ("mlp-small", "mlp-medium", "mlp-wide"):
        assert re.search(rf"coadapt demo: {job}: completed, (\d+) of \1 samples \(100 %\)", out)
    # the cost report at the end, and where the state is
    assert "Cost summary" in out and "instances preempted" in out
    assert f"is in {state}" in out and f"rm -r {state}" in out
    from providers.local import LocalProvider

    assert LocalProvider(state / "local").list_instances("coadapt-local") == []

    # the cluster's cost report on the demo's store, as a user runs it
    doc = json.loads(_coadapt("cost", "report", "--state-dir", str(state), "-f", "json", env=env))
    s = doc["summary"]
    assert 0 < s["run_hours"] < 1.0, s
    assert s["preempted_instances"] == len(injected), s
    assert s["preemptions"] >= 1, s
    assert s["savings_usd"] is not None and s["savings_usd"] > 0, s
    assert next(j for j in doc["jobs"] if j["job_id"] == moved)["preemptions"] >= 1
    finished = [j for j in doc["jobs"] if j["jct_hours"] is not None]
    assert {j["job_id"] for j in finished} == {"mlp-small", "mlp-medium", "mlp-wide"}
    assert all(j["useful_samples"] > 0 and j["cost_usd"] > 0 for j in finished), doc["jobs"]
    from autoscaler.accounting.costs import usd_to_cents
    from autoscaler.controller.store import Store
    from coadapt_common.clock import SystemClock

    with Store.open(state / "store.db", SystemClock()) as store:
        ran = [r.instance_key for r in store.list_instances() if r.provider_instance_id]
        per_instance = [store.total_cost_usd(key) for key in ran]
        assert all(usd > 0 for usd in per_instance)
    assert s["total_billed_usd"] == float(usd_to_cents(sum(per_instance)))
    assert s["instances"] == len(ran)
    table = _coadapt("cost", "report", "--state-dir", str(state), env=env)
    assert "0.00 " not in table.split("Cost per job")[1].split("Cost per offering")[0]

    # the same story again from the store, the cluster down
    events = _coadapt("events", "--state-dir", str(state), env=env)
    told = [line[:8] for line in events.splitlines() if re.match(STAMP, line)]
    assert told == sorted(told), events
    assert re.search(STAMP + rf"notice +{victim}:", events, re.M)
    assert re.search(STAMP + rf"preemption +{victim}:", events, re.M)

    # A scale-up (issue 41) is made only when it pays: mlp-medium needs about 21 s of work
    # left on 2 GPUs when mlp-wide frees them, which a loaded host's timing decides (seen in
    # 5 of 7 runs on this 2-core machine). When made, it is a rescale to more GPUs.
    for old_gpus, new_gpus in re.findall(STAMP + r"rescale +mlp-medium: (\d+) -> (\d+) GPU", out,
                                         re.M):  # fmt: skip
        assert int(new_gpus) != int(old_gpus), out
