"""``benchmarks/chaos.py``, short: the local cluster with its three real jobs while the
controller is SIGKILLed and SIGTERMed and restarted, stalled (SIGSTOP for three heartbeat
timeouts, then SIGCONT), an agent is killed (kill -9) and a spot notice lands. Nothing leaks,
no launcher runs twice, no healthy job is relaunched because the controller restarted or
stalled or an agent restarted, no instance is released for a silence it did not have, every
event the trainers' logs can check is true, and no launch loses more than one checkpoint
interval.

The jobs are narrow MLPs whose per-sample work is mostly a sleep (``--hidden 64
--sample-delay-s 0.0005``), six times the examples' epochs, so that they train through every
event without a relaunch for each completion: the soak loads the control plane, not the host's
two cores (with the examples' own widths and twice their epochs it kept them busy for its
whole run). Every event found its target, and jobs ran through both controller restarts
(the soak ends at its fourth event, within three minutes). A bad value of either option is
refused when the soak starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.chaos import EVENTS, main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs Linux /proc"),
]


def test_a_short_soak_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    schedule = "controller-sigkill,agent-kill,controller-stall,controller-sigterm,spot-notice"
    assert set(schedule.split(",")) == set(EVENTS)
    code = main(
        ["--minutes", "5", "--schedule", schedule, "--max-events", "5", "--first-event-s", "25",
         "--event-every-s", "15", "--epochs-scale", "6", "--checkpoint-every-steps", "20",
         "--hidden", "64", "--sample-delay-s", "0.0005", "--heartbeat-timeout-s", "20",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["controller_restarts"] >= 1, doc["events"]
    assert doc["kills"] == {event: 1 for event in EVENTS}, doc["events"]  # none found nothing
    restarts = [e for e in doc["events"] if e["event"].startswith("controller-")]
    assert next(e for e in doc["events"] if e["event"] == "controller-stall")["stall_s"] == 60
    assert all(e["launchers_before"] >= 1 for e in restarts), restarts  # jobs ran through them
    assert doc["down_exit"] == 0
    assert doc["leaked_instances"] == 0 and doc["leaked_processes"] == 0
    assert doc["duplicate_launchers"] == 0
    assert doc["relaunches_after_controller_restart"] == 0, doc["events"]
    assert doc["healthy_relaunches"] == 0, doc["events"]
    assert doc["released_for_silence"] == 0, doc
    assert doc["agent_restart_events"] >= 1 and doc["false_events"] == 0, doc
    assert doc["progress_lost_steps_max"] <= doc["checkpoint_every_steps"], doc


@pytest.mark.parametrize(
    "argv",
    [["--hidden", "0"], ["--hidden", "wide"], ["--sample-delay-s", "-1"],
     ["--sample-delay-s", "nan"], ["--sample-delay-s", "inf"], ["--heartbeat-timeout-s", "0"]],
)  # fmt: skip
def test_bad_job_options_are_refused_before_anything_starts(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert f"argument {argv[0]}: " in capsys.readouterr().err


def test_events_are_judged_against_the_trainers_step_logs(tmp_path: Path) -> None:
    """The soak's truth check on made-up step logs: a resume that claims a newer checkpoint
    than the next launch restored, and an adoption while the job launched again (nothing but
    the restart to explain it), are false; the true ones are not (an adoption followed by a
    move of the job and its new launch among them; a launch placed before the restart whose
    rank 0 says "start" only after it)."""
    from benchmarks.chaos import false_events, launches, progress_lost

    job = tmp_path / "steps" / "j"
    job.mkdir(parents=True)
    (job / "rank0-pid1.jsonl").write_text('{"event": "start", "t": 10}\n{"step": 30}\n')
    (job / "rank0-pid2.jsonl").write_text(
        '{"event": "start", "t": 100}\n{"event": "restored", "step": 20, "progress": 20.0}\n'
        '{"step": 40}\n{"step": '  # a line cut by a kill
    )
    runs = launches(tmp_path / "steps")
    assert runs == {"j": [(10.0, 0, None, 30), (100.0, 20, 20.0, 40)]}
    assert progress_lost(tmp_path / "steps") == {"j": [10]}
    resumed = "resumes from its checkpoint at progress {} of 100 on 1 GPU"
    gone = "its agent restarted; the launcher of j was gone: it starts again from its checkpoint"
    true = [(90.0, "resume", "j", resumed.format(20)), (50.0, "agent-restart", "i-1", gone),
            (300.0, "agent-restart", "i-1", "its agent restarted; it adopted the running "
             "launcher of j"),
            (5.0, "agent-restart", "i-1", "it adopted the running launcher of j"),
            # adopted, then moved by the policy: the launch at 100 is the move's
            (95.0, "agent-restart", "i-2", "it adopted the running launcher of j"),
            (97.0, "rescale", "j", "from 1 to 2 GPUs")]  # fmt: skip
    assert false_events(true, runs) == []
    # placed at 90 (the resume), adopted at 99 before its rank 0 said "start" (at 100, after
    # trainer.init): the launch at 100 is the adopted one
    pending = [(90.0, "resume", "j", resumed.format(20)),
               (99.0, "agent-restart", "i-1", "it adopted the running launcher of j")]  # fmt: skip
    assert false_events(pending, runs) == []
    false = [(90.0, "resume", "j", resumed.format(25)),
             (200.0, "agent-restart", "i-1", gone)]  # fmt: skip
    assert len(false_events(false, runs)) == 2
    # nothing placed it: the launch at 100 is a second one beside the adopted launcher
    adopted = [(99.0, "agent-restart", "i-1", "it adopted the running launcher of j")]
    (said,) = false_events(adopted, runs)
    assert "adopted j at 99.0, yet it launched again (its launches started at 10.0, 100.0)" in said
    # placed at 90 and started at 91, adopted at 99: the launch at 100 is another one
    runs_started = {"j": [(10.0, 0, None, 30), (91.0, 20, 20.0, 35), (100.0, 20, 20.0, 40)]}
    assert len(false_events(pending, runs_started)) == 1
