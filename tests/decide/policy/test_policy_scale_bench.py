"""``benchmarks/policy_scale.py``: the documented JSON, at the smallest size, and the decisions
it times are good ones: every GPU holds a job, the solver within 1% of its bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.policy_scale import main


@pytest.mark.slow
def test_writes_the_documented_json(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    argv = ["--sizes", "64", "--policies", "coadapt,pollux", "--rounds", "2"]
    assert main([*argv, "--pollux-limit-s", "0.001", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    for variant in ("sizes", "sizes_t4"):
        row = doc[variant]["64"]
        coadapt = row["coadapt"]
        assert coadapt["jobs"] == 160 and coadapt["gpus"] == 64
        # Timed rounds take time; refits add to a round; the process holds numpy and scipy.
        assert 0 < coadapt["median_s"] <= coadapt["p95_s"]
        assert coadapt["round_with_refits_s"] > 0
        assert coadapt["peak_rss_mib"] > 20
        # The solver's value never exceeds its own upper bound.
        assert coadapt["gap"] >= 0
        # 160 jobs for 64 GPUs: the decision fills the cluster, close to the optimum
        assert coadapt["running_jobs"] == 64, coadapt
        assert coadapt["gap"] < 0.01, coadapt
        # A pollux round cannot fit in a millisecond: skipped, and the JSON says why.
        assert "over 0.001 s" in row["pollux"]["skipped"]
