"""``coadapt-launch`` on what a new user hit: bad input fails before launching (one line, exit
2); a failure that repeats identically is fatal; a SIGTERM after the last step leaves the job
DONE; a resume says so. Real launcher and torchrun processes (gloo, CPU)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from coadapt_common.procfs import PROC_ROOT, read_proc_strings
from tests.trainer.harness import EXAMPLE, Cluster, base_env, max_step, read_jsonl, wait_until
from trainer.control import ExitKind, ExitMarker, RunDir
from trainer.launch import Verdict, classify


def launch_fast(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launch", *args],
        cwd=tmp_path,
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - start < 20, "rejected before launching anything"
    return proc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "coadapt-launch: failed: script: missing.py: no such file"),
        (["--checkpoint-uri", "afile", str(EXAMPLE)], "afile exists and is not a folder"),
        (["--checkpoint-uri", "afile/sub", str(EXAMPLE)], "afile exists and is not a folder"),
        (["--batch-size", "0", str(EXAMPLE)], "batch_size: must be >= 1, got 0"),
        (["--batch-size", "-1", str(EXAMPLE)], "batch_size: must be >= 1, got -1"),
        (["--nnodes", "3:1", str(EXAMPLE)], "nnodes: MIN > MAX in '3:1'"),
        (["--rdzv-endpoint", "nohost", str(EXAMPLE)], "expected HOST:PORT, got 'nohost'"),
        (["--rdzv-endpoint", "nohost.invalid:29400", str(EXAMPLE)], "cannot resolve host"),
    ],
)
def test_bad_input_is_one_line_before_launching(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "afile").write_text("not a folder\n")
    proc = launch_fast(tmp_path, *args)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "coadapt-reports").exists()


def test_help_shows_a_default_for_every_option(tmp_path: Path) -> None:
    proc = launch_fast(tmp_path, "--help")
    assert proc.returncode == 0
    entries: dict[str, str] = {}
    name = None
    for line in proc.stdout.split("options:", 1)[1].splitlines():
        if line.startswith("  --"):
            name = line.split()[0]
            entries[name] = line
        elif name is not None:
            entries[name] += " " + line.strip()
    assert "--shutdown-timeout-s" in entries and len(entries) >= 20
    missing = [n for n, text in entries.items() if "default" not in text]
    assert missing == [], missing


def test_classify_done_beats_a_late_signal() -> None:
    done = [ExitMarker(r, ExitKind.DONE, None, False, 10, "ckpt-10") for r in range(2)]
    assert classify(done, returncode=0, signalled=True) is Verdict.DONE
    assert classify(done, returncode=-15, signalled=True) is Verdict.DONE
    stopped = [ExitMarker(0, ExitKind.STOPPED, "signal", False, 5, "ckpt-5")]
    assert classify(stopped, returncode=0, signalled=True) is Verdict.STOPPED


@pytest.mark.slow
def test_identical_failure_is_fatal_after_two_attempts(cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text('raise RuntimeError("no data folder")\n')
    launch = cluster.launch("broken", ["--max-restarts", "3", str(script)])
    assert launch.wait(180) == 1
    text = launch.text()
    assert text.count("verdict: failure") == 2, text[-3000:]
    fatal = [line for line in text.splitlines() if "fatal:" in line]
    assert len(fatal) == 1 and "the same failure twice in a row" in fatal[0]
    assert "exit status 1" in fatal[0]


@pytest.mark.slow
def test_sigterm_after_the_workers_finished_is_done(cluster: Cluster, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    launch = cluster.launch(
        "late",
        ["--checkpoint-uri", str(ckpt), str(EXAMPLE), "--epochs", "1", "--num-samples", "256"],
    )
    run_dir = RunDir(launch.run_dir)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launch.proc.poll() is None:
        launch.remember_workers()
        if any(m.kind is ExitKind.DONE for m in run_dir.markers()):
            launch.terminate()  # the job is over; torchrun may still be tearing down
            break
        time.sleep(0.01)
    rc = launch.wait(60)
    text = launch.text()
    assert rc == 0, text[-3000:]
    assert "verdict: done" in text and "verdict: stopped" not in text
    assert "ChildFailedError" not in text and "Traceback" not in text


@pytest.mark.slow
def test_resume_says_from_which_step(cluster: Cluster, tmp_path: Path) -> None:
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    args = ["--checkpoint-uri", str(ckpt), str(EXAMPLE), "--epochs", "4", "--step-delay-s", "0.05"]
    first = cluster.launch("first", [*args, "--log-dir", str(logs)])
    wait_until(lambda: max_step(logs) >= 5, 120, "5 steps", first)
    first.terminate()
    assert first.wait(120) == 75, first.text()[-3000:]
    assert "resumed from step" not in first.text()
    second = cluster.launch("second", args)
    assert second.wait(240) == 0, second.text()[-3000:]
    lines = [line for line in second.text().splitlines() if "resumed from step" in line]
    assert len(lines) == 1, second.text()[-3000:]
    assert lines[0].startswith("coadapt: resumed from step ") and int(lines[0].split()[-1]) > 0


@pytest.mark.slow
def test_preload_server_forks_single_threaded(cluster: Cluster, tmp_path: Path) -> None:
    """With 2 threads per worker the preload server used to warn "forking with 2 native
    threads" (its own BLAS pool, forked into every worker): it now runs single-threaded and each
    worker still gets its own thread count."""
    launch = cluster.launch(
        "threads",
        ["--omp-num-threads", "2", str(EXAMPLE), "--epochs", "1", "--num-samples", "64"],
        OMP_NUM_THREADS="2",
        OPENBLAS_NUM_THREADS="2",
    )
    rc = launch.wait(120)
    text = launch.text()
    assert rc == 0, text[-3000:]
    assert "native threads" not in text, text[-3000:]


def _spawned_workers(run_dir: Path) -> list[int]:
    """Worker processes torchrun has spawned for the launch in ``run_dir`` (preload clients
    and, without preload, the scripts themselves: each carries the run folder in its
    environment, and names the example script)."""
    marker = f"COADAPT_RUN_DIR={run_dir}".encode()
    found = []
    for entry in PROC_ROOT.iterdir():
        if not entry.name.isdigit():
            continue
        cmdline = read_proc_strings(int(entry.name), "cmdline", settle=False)
        ours = str(EXAMPLE).encode() in cmdline and b"torch.distributed.run" not in cmdline
        if ours and marker in read_proc_strings(int(entry.name), "environ", settle=False):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_stop_while_the_workers_start_is_one_line_not_a_traceback(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 28, item 2: a rescale or a cancel that lands while the workers are still
    importing (torchrun has spawned them, none has registered) is forwarded to torchrun, which
    raises torch's SignalException: its 30-line traceback and its "death signal" warnings
    become one line in the job's log, and the job is STOPPED (exit 75), not failed."""
    launch = cluster.launch(
        "early", ["--checkpoint-uri", str(tmp_path / "ckpt"), str(EXAMPLE), "--epochs", "4"]
    )
    deadline = time.monotonic() + 120
    spawned = False
    while time.monotonic() < deadline and launch.proc.poll() is None:
        if _spawned_workers(launch.run_dir) and not RunDir(launch.run_dir).pids():
            spawned = True  # torchrun's handlers are set (it spawns after setting them)
            launch.terminate()
            break
        time.sleep(0.01)
    assert spawned, launch.text()[-3000:]
    rc = launch.wait(120)
    text = launch.text()
    assert rc == 75, text[-3000:]
    assert "verdict: stopped" in text
    assert "Traceback" not in text and "SignalException" not in text, text[-4000:]
    assert "death signal" not in text
    stops = [line for line in text.splitlines() if "torchrun stopped by signal" in line]
    killed = "exited with -15" in text  # the signal beat torchrun's handler: nothing to hide
    assert len(stops) == 1 or killed, text[-3000:]


@pytest.mark.slow
def test_a_second_stop_right_after_the_first_still_leaves_a_checkpoint(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue 37, item 2: the node agent and its instance both send SIGTERM, 33 ms apart. The
    second one used to kill torchrun before the workers saved; it now waits out the grace
    (``--shutdown-timeout-s``): the job stops with a checkpoint and resumes from it."""
    ckpt, logs = tmp_path / "ckpt", tmp_path / "logs"
    args = ["--checkpoint-uri", str(ckpt), str(EXAMPLE), "--epochs", "4", "--step-delay-s", "0.05"]
    first = cluster.launch("first", ["--shutdown-timeout-s", "30", *args, "--log-dir", str(logs)])
    wait_until(lambda: max_step(logs) >= 5, 120, "5 steps", first)
    first.terminate()
    time.sleep(0.033)
    first.terminate()
    assert first.wait(120) == 75, first.text()[-3000:]
    text = first.text()
    assert "again: already stopping" in text and "verdict: stopped" in text, text[-3000:]
    assert "killing" not in text, text[-3000:]
    # Its last report vouches for the stop checkpoint (what the controller's events say).
    last = read_jsonl(tmp_path / "coadapt-reports")[-1]
    assert last["checkpoint_progress"] == last["progress"] > 0, last
    reached = max_step(logs)
    second = cluster.launch("second", args)
    assert second.wait(240) == 0, second.text()[-3000:]
    lines = [line for line in second.text().splitlines() if "resumed from step" in line]
    assert len(lines) == 1, second.text()[-3000:]
    assert int(lines[0].split()[-1]) >= min(5, reached)


@pytest.mark.slow
def test_the_checkpoint_grace_is_bounded(cluster: Cluster, tmp_path: Path) -> None:
    """Workers that cannot reach a safe point within ``--shutdown-timeout-s`` (a step of 8 s
    here) are killed when it runs out, not waited for forever."""
    logs = tmp_path / "logs"
    launch = cluster.launch(
        "slow",
        ["--shutdown-timeout-s", "1", "--checkpoint-uri", str(tmp_path / "ckpt"), str(EXAMPLE),
         "--epochs", "4", "--step-delay-s", "8", "--log-dir", str(logs)],
    )  # fmt: skip
    wait_until(lambda: max_step(logs) >= 1, 120, "1 step", launch)
    launch.terminate()
    stopped_at = time.monotonic()
    rc = launch.wait(60)
    assert time.monotonic() - stopped_at < 30, launch.text()[-3000:]
    assert rc != 0, launch.text()[-3000:]
    assert "did not checkpoint and stop within 1 s: killing them" in launch.text()


@pytest.mark.slow
def test_a_repeated_stop_with_no_worker_to_save_does_not_wait_out_the_grace(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The other half of the checkpoint grace: a launch whose torchrun starts, or waits in a
    rendezvous that no peer will join (its job moved on), has no worker, so nothing to
    checkpoint; a repeated stop ends it at once instead of after ``--shutdown-timeout-s``."""
    from trainer.launch import free_port

    launch = cluster.launch(
        "alone",
        ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--shutdown-timeout-s",
         "120", "--checkpoint-uri", str(tmp_path / "ckpt"), str(EXAMPLE), "--epochs", "1"],
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while "torch.distributed.run" not in " ".join(
        b.decode(errors="replace") for b in _children_cmdlines(launch.proc.pid)
    ):
        assert time.monotonic() < deadline and launch.proc.poll() is None, launch.text()[-2000:]
        time.sleep(0.2)
    time.sleep(3.0)  # starting, or in the rendezvous waiting for a second node
    launch.terminate()
    time.sleep(0.033)
    launch.terminate()
    stopped_at = time.monotonic()
    rc = launch.wait(60)
    assert time.monotonic() - stopped_at < 30, launch.text()[-3000:]
    assert rc == 75, launch.text()[-3000:]


def _children_cmdlines(pid: int) -> list[bytes]:
    """The command lines of ``pid``'s children."""
    out = []
    for entry in PROC_ROOT.iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid == pid:
                out.extend(read_proc_strings(int(entry.name), "cmdline", settle=False))
    return out
