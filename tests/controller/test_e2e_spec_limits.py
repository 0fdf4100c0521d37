"""``markets: [on-demand]`` on a real local fleet: ``coadapt up`` (the controller service, the
local provider, which sells both markets, agents and real torchrun jobs), a job spec limited to
on demand beside one that is not. Both finish; every span in which the limited job held GPUs
(the store's assignment history) is on an on-demand instance, while the other job ran on spot:
the fleet was mixed and the limit held."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from autoscaler.controller.api import ApiClient, load_tokens
from autoscaler.controller.jobspec import load_job_spec
from autoscaler.controller.service import UpConfig, UpReport, run_up
from autoscaler.controller.store import Store
from coadapt_common.clock import FakeClock
from coadapt_common.procfs import PROC_ROOT

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROC_ROOT.is_dir(), reason="needs Linux /proc"),
]

SPEC = """\
name: {name}
command: [{script}, --epochs, 2, --initial-batch-size, 64]
gpus: {{min: 1, max: 2}}
batch_size: {{initial: 64, max: 512}}
local_batch_size: {{max: 256}}
"""


def test_an_on_demand_job_never_lands_on_spot_on_the_local_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the specs name examples/elastic_mlp.py from the repo root
    script = ROOT / "examples/elastic_mlp.py"
    (tmp_path / "od.yaml").write_text(
        SPEC.format(name="od", script=script) + "markets: [on-demand]\n"
    )
    (tmp_path / "any.yaml").write_text(SPEC.format(name="any", script=script))
    od = load_job_spec(tmp_path / "od.yaml").submission()
    other = load_job_spec(tmp_path / "any.yaml").submission()
    assert od.markets == ("on-demand",) and other.markets is None
    state = tmp_path / "state"
    stop, ready = threading.Event(), list[str]()
    result: dict[str, UpReport] = {}
    cfg = UpConfig(state, interval_s=2.0, max_instances=4, max_gpu_slots=4, release_on_stop=True)
    thread = threading.Thread(
        target=lambda: result.setdefault("down", run_up(cfg, stop, on_ready=ready.append))
    )
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not ready and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready, "the service did not come up"
        user = ApiClient(ready[0], load_tokens(state / "tokens.json").user, timeout_s=10)
        # The unlimited job first, alone: the sizing buys it the cheapest, spot; then the
        # limited one, which must get an on-demand instance beside it (not a slot on spot).
        user.submit_job(other)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(j.name == "any" and j.assignment for j in user.list_jobs()):
                break
            time.sleep(0.5)
        user.submit_job(od)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            statuses = {j.name: str(j.status) for j in user.list_jobs()}
            if all(s in ("completed", "failed", "refused") for s in statuses.values()):
                break
            time.sleep(1.0)
        assert statuses == {"od": "completed", "any": "completed"}, statuses
    finally:
        stop.set()
        thread.join(timeout=180)
    assert not thread.is_alive()
    assert result["down"].clean
    with Store.open(state / "store.db", FakeClock()) as store:
        market = {r.instance_key: r.market for r in store.list_instances()}
        spans = store.assignment_history()
    held = {j: {market[s.instance_key] for s in spans if s.job_name == j} for j in ("od", "any")}
    assert held["od"] == {"on-demand"}, held
    assert "spot" in held["any"], held  # alone, the other job was put on (cheaper) spot
