"""``benchmarks/paper_sim.py`` on a small folder: the documented JSON, written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.paper_sim import main

WORKLOAD = """name,time,application,num_replicas,batch_size
a,0,cifar10,1,128
b,30,ncf,2,256
c,60,cifar10,2,256
"""


@pytest.mark.slow
def test_writes_the_documented_json(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(WORKLOAD)
    (folder / "small-2.csv").write_text(WORKLOAD.replace("c,60", "c,120"))
    out = tmp_path / "out" / "bench.json"
    argv = ["--workloads", str(folder), "--policies", "tiresias,optimus", "--processes", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert not list(out.parent.glob("*.tmp"))
    assert doc["load"] is None and "reference_mean_jct_s" not in doc  # no published results
    assert set(doc["policies"]) == {"tiresias", "optimus"}
    keys = {"mean_jct_s", "per_workload_jct_s", "p99_jct_s", "makespan_s", "restarts_per_job",
            "mean_ftf_ratio", "max_ftf_ratio", "policy_ms_p50", "policy_ms_max", "fit_ms_p50",
            "fit_ms_max", "wall_s"}  # fmt: skip
    for summary in doc["policies"].values():
        assert keys <= set(summary)
        per = summary["per_workload_jct_s"]
        assert set(per) == {"small-1", "small-2"} and all(v > 0 for v in per.values())
        assert summary["mean_jct_s"] == pytest.approx(sum(per.values()) / 2)
    table = capsys.readouterr().out
    assert "small-1" in table and "mean" in table


def test_runs_on_a_cluster_file(tmp_path: Path) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(WORKLOAD)
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "bench.json"
    argv = ["--workloads", str(folder), "--policies", "tiresias", "--processes", "1"]
    argv += ["--cluster", str(repo / "examples/clusters/mixed-64.yaml"), "--out", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["cluster"].endswith("mixed-64.yaml")
    assert doc["policies"]["tiresias"]["mean_jct_s"] > 0


@pytest.mark.slow
def test_arrival_scale_compresses_submissions_and_reports_ratios(tmp_path: Path) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    late = WORKLOAD + "d,6000,ncf,1,256\n"  # a short job arriving after the others are done...
    (folder / "small-1.csv").write_text(late)
    base = ["--workloads", str(folder), "--policies", "pollux,tiresias", "--processes", "1"]
    docs = {}
    for scale in ("1", "60"):  # ... unless arrivals are 60x faster (d at 100 s)
        out = tmp_path / f"bench-{scale}.json"
        assert main([*base, "--arrival-scale", scale, "--out", str(out)]) == 0
        docs[scale] = json.loads(out.read_text())
    assert docs["60"]["arrival_scale"] == 60.0 and "reference_mean_jct_s" not in docs["60"]
    # d cannot finish before it is submitted: at 6000 s as written, well before when compressed.
    for policy in ("pollux", "tiresias"):
        slow, fast = (docs[s]["policies"][policy]["makespan_s"] for s in ("1", "60"))
        assert slow > 6000 > fast
    for doc in docs.values():
        ratio = doc["pollux_ratio"]["tiresias"]
        pollux, tiresias = (doc["policies"][p]["mean_jct_s"] for p in ("pollux", "tiresias"))
        assert ratio["mean"] == pytest.approx(pollux / tiresias)
        assert ratio["per_workload"]["small-1"] == pytest.approx(pollux / tiresias)
        # the figure the benchmark exists for: adapting GPUs and batch sizes (pollux)
        # finishes these jobs in about half the time of a fixed allocation (tiresias)
        assert ratio["mean"] < 0.8, ratio
        assert doc["policies"]["pollux"]["restarts_per_job"] > 0  # it did rescale
        vs = doc["vs_pollux"]["tiresias"]  # the other way round, with the tail metrics
        assert vs["mean"] == pytest.approx(tiresias / pollux)
        p99 = [doc["policies"][p]["p99_jct_s"] for p in ("tiresias", "pollux")]
        assert vs["p99"] == pytest.approx(p99[0] / p99[1])
        ftf = [doc["policies"][p]["max_ftf_ratio"] for p in ("tiresias", "pollux")]
        assert vs["max_ftf"] == pytest.approx(ftf[0] / ftf[1])
        assert vs["workloads_no_worse"] == int(tiresias <= pollux)


@pytest.mark.parametrize("bad", ["0", "-2", "fast", "nan"])
def test_bad_arrival_scale_is_one_line_exit_2(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--arrival-scale", bad])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--arrival-scale" in err[-1] and bad in err[-1]


def test_reference_files_give_ours_over_published(tmp_path: Path) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(WORKLOAD)
    (folder / "small-2.csv").write_text(WORKLOAD.replace("c,60", "c,120"))
    ref = tmp_path / "tiresias-summary.json"  # the Pollux artifact's summary.json shape
    ref.write_text(json.dumps({"jcts": {}, "avgs": {"small-1": 100.0, "small-2": 300.0}}))
    out = tmp_path / "bench.json"
    argv = ["--workloads", str(folder), "--policies", "tiresias", "--processes", "1"]
    assert main([*argv, "--reference", f"tiresias={ref}", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["reference_mean_jct_s"] == {"tiresias": 200.0}
    assert doc["reference_per_workload_jct_s"]["tiresias"]["small-2"] == 300.0
    ours = doc["policies"]["tiresias"]["mean_jct_s"]
    assert doc["ours_over_reference"]["tiresias"] == pytest.approx(ours / 200.0)


@pytest.mark.parametrize("bad", ["tiresias", "nosuch=x.json", "pollux=/no/such/file.json"])
def test_bad_reference_is_one_line_exit_2(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--reference", bad])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--reference" in err[-1]


def test_policy_options_reach_the_policy(tmp_path: Path) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(WORKLOAD)
    out = tmp_path / "bench.json"
    argv = ["--workloads", str(folder), "--policies", "tiresias", "--processes", "1"]
    # Tiresias demotes after threshold_gpu_s; any value reaches the constructor and the JSON.
    assert main([*argv, "--option", "tiresias.threshold_gpu_s=60.0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["options"] == {"tiresias": {"threshold_gpu_s": 60.0}}
    with pytest.raises(SystemExit) as info:  # refused by the policy, before any run
        main([*argv, "--option", "tiresias.threshold_gpu_s=-1.0"])
    assert info.value.code == 2


@pytest.mark.parametrize(
    "bad", ["coadapt", "nosuch.x=1", "coadapt.power=", "coadapt.power=fast", "coadapt.nosuch=1"]
)
def test_bad_option_is_one_line_exit_2(bad: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--option", bad])
    assert info.value.code == 2
    assert "--option" in capsys.readouterr().err.strip().splitlines()[-1]


_MEASURED = ("wall_s", "elapsed_s", "peak_rss_mib", "policy_ms_p50", "policy_ms_max",
             "fit_ms_p50", "fit_ms_max")  # fmt: skip


def _without_wall_times(doc: object) -> object:
    if isinstance(doc, dict):
        return {k: _without_wall_times(v) for k, v in doc.items() if k not in _MEASURED}
    if isinstance(doc, list):
        return [_without_wall_times(v) for v in doc]
    return doc


@pytest.mark.slow
def test_same_seed_same_json_byte_for_byte_but_wall_times(tmp_path: Path) -> None:
    """Through the controller (its store, its fleet, its rounds) a run is still one run per
    seed: the JSON of two runs is the same, byte for byte, once the measured wall times are
    taken out; and the results record what the policies were allowed to know."""
    folder = tmp_path / "workloads"
    folder.mkdir()
    (folder / "small-1.csv").write_text(WORKLOAD)
    texts = []
    for k in range(2):
        out = tmp_path / f"run-{k}.json"
        argv = ["--workloads", str(folder), "--policies", "pollux,coadapt", "--processes", "1"]
        assert main([*argv, "--out", str(out)]) == 0
        doc = json.loads(out.read_text())
        assert doc["lengths"] == "declared"
        texts.append(json.dumps(_without_wall_times(doc), sort_keys=True))
    assert texts[0] == texts[1]
