"""Chaos soak: a real local cluster while a seeded schedule kills and restarts its parts.

    python benchmarks/chaos.py [--minutes 10] [--seed 0] [--max-events 40] [--schedule E,E..]
                               [--hidden N] [--sample-delay-s S] [--heartbeat-timeout-s S]
                               [--out FILE]

``coadapt up`` (local provider, its own process, loopback only) runs the three example jobs
(``examples/jobs/mlp-*.yaml``: ``examples/elastic_mlp.py`` under the launcher, their epochs
multiplied by ``--epochs-scale``, a checkpoint every ``--checkpoint-every-steps`` steps;
``--hidden`` and ``--sample-delay-s`` make them narrow, their per-sample work mostly a sleep, as
an accelerator's would be, so that the soak loads the control plane and not the host); a job
that completes is submitted again under a new name, so three run for the whole soak. Every
``--event-every-s`` (with jitter) one event from a seeded schedule:

* ``controller-sigkill``: SIGKILL ``coadapt up``, leave it down a few seconds, start it again;
* ``controller-sigterm``: SIGTERM it (it stops, keeping the fleet), start it again;
* ``controller-stall``: SIGSTOP it for three heartbeat timeouts (``--heartbeat-timeout-s``,
  which ``up`` is given), then SIGCONT (a GC pause, a live migration, a suspended laptop);
* ``agent-kill``: SIGKILL one instance's node agent (the instance starts it again; the new
  agent adopts the launchers still running);
* ``spot-notice``: the local provider's ``preempt`` on one instance (a 20 s notice).

Bounded: it stops after ``--minutes`` or ``--max-events`` events, whichever comes first, then
``coadapt down`` releases the fleet. Measured:

* ``progress_lost_steps``: for every launch that resumed a job, the steps it lost: the most
  steps any earlier launch of the job had trained minus the step it resumed from (from the
  jobs' own per-process step logs, ``--log-dir``); must be at most one checkpoint interval;
* ``relaunches_after_controller_restart``: launchers (job, instance) running just before the
  controller was killed (once the cluster was quiet) and replaced by another within three
  rounds after it came back, although the job's placement stayed what it was (a job the
  policy moved across the restart is listed in the event's ``moved``); likewise
  ``relaunches_after_controller_stall`` and ``relaunches_after_agent_kill``, and
  ``healthy_relaunches``, their sum;
* ``released_for_silence``: instances released because their agent "stopped heartbeating"
  (every agent of the soak is healthy or restarted within seconds: each one is a false
  judgement);
* ``false_events``: events the trainers' own step logs contradict: a ``resume`` that names a
  checkpoint at progress C while the job's next launch restored less (or nothing); an
  ``agent-restart`` that says it adopted a job's launcher while that job launched again
  around it (with no rescale, stop, start, resume or preemption of it in between), or that
  a job starts again from its checkpoint while no launch of it followed;
* ``duplicate_launchers``: times a job had launchers of two allocations (two rendezvous
  endpoints) running at once for more than ``DUPLICATE_GRACE_S`` (a hand-over between agents
  takes an agent's poll and a checkpoint);
* ``leaked_instances`` / ``leaked_processes``: instances listed, and processes of any instance
  alive, after ``coadapt down``.

Prints (and with ``--out`` writes) one JSON object with those, the events, kills, restarts and
jobs completed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoscaler.controller.api import ApiClient, ApiError, load_tokens
from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.jobspec import load_job_spec
from benchmarks.argtypes import nonnegative_float, positive_float, positive_int
from coadapt_common.atomic import write_json_atomic
from coadapt_common.procfs import PROC_ROOT, is_running, read_proc_strings, read_stat

ROOT: Final = Path(__file__).resolve().parent.parent
CLUSTER: Final = "coadapt-local"
DUPLICATE_GRACE_S: Final = 15.0
EVENTS: Final = (
    "controller-sigkill",
    "controller-sigterm",
    "controller-stall",
    "agent-kill",
    "spot-notice",
)
ROUND_S: Final = 2.0  # the soak's ``up --interval-s``
AGENT_INTERVAL_S: Final = 2.0  # its ``--agent-interval-s``


def _procs() -> Iterator[tuple[int, list[str], list[bytes]]]:
    for entry in PROC_ROOT.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            cmd = [
                c.decode(errors="replace") for c in read_proc_strings(pid, "cmdline", settle=False)
            ]
            if cmd and is_running(read_stat(pid)):
                yield pid, cmd, read_proc_strings(pid, "environ", settle=False)


def _env(environ: list[bytes], name: str) -> str | None:
    prefix = f"{name}=".encode()
    for item in environ:
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def _launchers(instance_ids: set[str]) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Live launchers on the instances ``instance_ids`` (this soak's: other clusters may run
    on the machine), by (job, agent id): their pids and rendezvous endpoints."""
    out: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for pid, cmd, environ in _procs():
        if _env(environ, "COADAPT_LOCAL_INSTANCE") not in instance_ids:
            continue
        if "-m" not in cmd or cmd[cmd.index("-m") + 1 :][:1] != ["trainer.launch"]:
            continue  # not a launcher (torchrun and the workers name the script too)
        if "--job-id" not in cmd:
            continue
        job = cmd[cmd.index("--job-id") + 1]
        rdzv = cmd[cmd.index("--rdzv-endpoint") + 1] if "--rdzv-endpoint" in cmd else ""
        agent = _env(environ, "COADAPT_AGENT_ID") or "?"
        out.setdefault((job, agent), []).append((pid, rdzv))
    return out


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = Path(tempfile.mkdtemp(prefix="coadapt-chaos-"))
        self.state = self.tmp / "state"
        # The jobs' step logs: jobs run as users of their own (coadapt up as root), so
        # their folder is open to them (sticky, as /tmp); the rest of tmp stays private.
        os.chmod(self.tmp, 0o711)
        (self.tmp / "steps").mkdir(mode=0o700)
        os.chmod(self.tmp / "steps", 0o1777)
        self.up: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.events: list[dict[str, Any]] = []
        self.kills: dict[str, int] = {e: 0 for e in EVENTS}
        self.relaunches = 0
        self.stall_relaunches = 0
        self.agent_relaunches = 0
        self.duplicates = 0
        self.duplicate_since: dict[str, float] = {}
        self.generation: dict[str, int] = {}
        self.completed: list[str] = []
        self.submitted: dict[str, str] = {}  # job name -> its example
        self.sampling = threading.Event()
        self.specs = {
            path.stem: self._spec(path)
            for path in sorted((ROOT / "examples/jobs").glob("mlp-*.yaml"))  # elastic_mlp.py's
        }

    # ---- the cluster -------------------------------------------------------------------------

    def _spec(self, path: Path) -> JobSubmission:
        spec = load_job_spec(path).submission()
        command = list(spec.command)
        i = command.index("--epochs")
        command[i + 1] = str(int(command[i + 1]) * self.args.epochs_scale)
        command += ["--checkpoint-every-steps", str(self.args.checkpoint_every_steps)]
        if self.args.hidden is not None:
            if "--hidden" in command:
                command[command.index("--hidden") + 1] = str(self.args.hidden)
            else:
                command += ["--hidden", str(self.args.hidden)]
        if self.args.sample_delay_s:
            command += ["--sample-delay-s", repr(self.args.sample_delay_s)]
        return replace(spec, command=tuple(command))

    def start_up(self) -> None:
        self.starts += 1
        log = open(self.tmp / f"up-{self.starts}.log", "wb")  # noqa: SIM115 - the child's
        self.up = subprocess.Popen(
            [sys.executable, "-m", "autoscaler.cli", "up", "--state-dir", str(self.state),
             "--interval-s", str(ROUND_S), "--max-instances", "3", "--max-gpu-slots", "4",
             "--agent-interval-s", str(AGENT_INTERVAL_S),
             "--heartbeat-timeout-s", str(self.args.heartbeat_timeout_s)],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 60
        while not self._up_ready():
            if self.up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "coadapt up did not start: "
                    + (self.tmp / f"up-{self.starts}.log").read_text()[-2000:]
                )
            time.sleep(0.1)

    def _up_ready(self) -> bool:
        up_file = self.state / "up.json"
        if self.up is None or not up_file.exists():
            return False
        try:
            return int(json.loads(up_file.read_text())["pid"]) == self.up.pid
        except (OSError, ValueError, KeyError):
            return False

    def client(self) -> ApiClient:
        url = json.loads((self.state / "up.json").read_text())["url"]
        return ApiClient(url, load_tokens(self.state / "tokens.json").user, timeout_s=10.0)

    def submit(self, example: str) -> None:
        n = self.generation.get(example, 0)
        self.generation[example] = n + 1
        name = f"{example}-{n}"
        spec = self.specs[example]
        command = [*spec.command, "--log-dir", str(self.tmp / "steps" / name)]
        self.client().submit_job(replace(spec, name=name, command=tuple(command)))
        self.submitted[name] = example

    def refill(self) -> None:
        """Submit again each example whose job completed (three jobs run at any time)."""
        try:
            jobs = {j.name: j for j in self.client().list_jobs()}
        except (ApiError, OSError, ValueError, KeyError):
            return
        for name, example in list(self.submitted.items()):
            job = jobs.get(name)
            if job is not None and str(job.status) in ("completed", "failed", "cancelled"):
                if str(job.status) == "completed":
                    self.completed.append(name)
                del self.submitted[name]
                self.submit(example)

    # ---- watching ----------------------------------------------------------------------------

    def sample(self) -> None:
        while not self.sampling.wait(1.0):
            now = time.monotonic()
            by_job: dict[str, set[str]] = {}
            for (job, _), procs in _launchers(self.instance_ids()).items():
                by_job.setdefault(job, set()).update(r for _, r in procs)
            for job, endpoints in by_job.items():
                if len(endpoints) > 1:
                    since = self.duplicate_since.setdefault(job, now)
                    if now - since > DUPLICATE_GRACE_S and since > 0:
                        self.duplicates += 1
                        self.duplicate_since[job] = -1.0  # counted once per episode
                else:
                    self.duplicate_since.pop(job, None)

    def instance_ids(self) -> set[str]:
        """Every instance this soak's cluster has had."""
        return {p.stem for p in (self.state / "local" / "instances").glob("*.json")}

    def instances(self) -> list[dict[str, Any]]:
        out = []
        for path in (self.state / "local" / "instances").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(path.read_text())
                if rec["state"] == "running":
                    out.append(rec)
        return out

    # ---- events ------------------------------------------------------------------------------

    def _placements(self) -> dict[str, dict[str, int]]:
        try:
            return {j.name: dict(j.assignment) for j in self.client().list_jobs()}
        except (ApiError, OSError, ValueError, KeyError):
            return {}

    def _snapshot(self) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], set[int]]]:
        launchers = _launchers(self.instance_ids())
        return self._placements(), {k: {p for p, _ in v} for k, v in launchers.items()}

    def _quiet(self) -> tuple[dict[str, dict[str, int]], dict[tuple[str, str], set[int]]]:
        """A snapshot once the cluster is quiet: placements and launchers as they were 3 s
        before, and every placed job's launchers running on exactly its instances (no
        hand-over still under way), or after 30 s."""
        before = self._snapshot()
        for _ in range(10):
            time.sleep(3.0)
            now = self._snapshot()
            placed, launchers = now
            wanted = {(job, key) for job, alloc in placed.items() for key in alloc}
            if now == before and set(launchers) == wanted:
                break
            before = now
        return before

    def _replaced(
        self, before: tuple[dict[str, dict[str, int]], dict[tuple[str, str], set[int]]]
    ) -> tuple[list[str], list[str]]:
        """``(replaced, moved)``: launchers running in ``before`` that another launcher
        replaced although their job's placement is what it was, and the jobs the policy
        moved meanwhile (not counted)."""
        placed, launchers = self._snapshot()
        moved = sorted(j for j, a in before[0].items() if placed.get(j) not in (a, {}, None))
        replaced = [f"{job}@{agent}" for (job, agent), pids in before[1].items()
                    if job not in moved and launchers.get((job, agent))
                    and not pids & launchers[(job, agent)]]  # fmt: skip
        return replaced, moved

    def controller_kill(self, sig: signal.Signals) -> dict[str, Any]:
        """Kill the controller once the cluster is quiet, restart it, and count the launchers
        replaced although their job's placement is what it was: relaunched because of the
        restart. (A job the policy moved across the restart is counted apart, in ``moved``.)"""
        assert self.up is not None
        before = self._quiet()
        self.up.send_signal(sig)
        code = self.up.wait(timeout=180)
        away_s = self.rng.uniform(2.0, 15.0)
        time.sleep(away_s)
        self.start_up()
        time.sleep(3 * ROUND_S + 2 * AGENT_INTERVAL_S)  # three rounds and two agent polls
        replaced, moved = self._replaced(before)
        self.relaunches += len(replaced)
        return {"exit": code, "away_s": round(away_s, 1), "relaunched": replaced,
                "moved": moved, "launchers_before": len(before[1])}  # fmt: skip

    def controller_stall(self) -> dict[str, Any]:
        """SIGSTOP the controller for three heartbeat timeouts once the cluster is quiet,
        SIGCONT it, and count the launchers replaced meanwhile (their placement unchanged)."""
        assert self.up is not None
        before = self._quiet()
        stall_s = 3 * self.args.heartbeat_timeout_s
        self.up.send_signal(signal.SIGSTOP)
        try:
            time.sleep(stall_s)
        finally:
            self.up.send_signal(signal.SIGCONT)
        time.sleep(3 * ROUND_S + 2 * AGENT_INTERVAL_S)
        replaced, moved = self._replaced(before)
        self.stall_relaunches += len(replaced)
        return {"stall_s": stall_s, "relaunched": replaced, "moved": moved,
                "launchers_before": len(before[1])}  # fmt: skip

    def agent_kill(self) -> dict[str, Any]:
        """SIGKILL one node agent (once the cluster is quiet); its instance starts it again
        and the new one must adopt the launchers that still run: count those replaced."""
        before = self._quiet()
        targets = []
        for pid, cmd, environ in _procs():
            mine = str(self.state) in " ".join(cmd)
            if "autoscaler.controller.service" in cmd and "agent" in cmd and mine:
                targets.append((pid, _env(environ, "COADAPT_LOCAL_INSTANCE")))
        if not targets:
            return {"skipped": "no agent"}
        pid, instance = self.rng.choice(sorted(targets, key=lambda t: t[0]))
        at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.0 + 3 * AGENT_INTERVAL_S + ROUND_S)  # restarted, registered, two polls
        replaced, moved = self._replaced(before)
        self.agent_relaunches += len(replaced)
        return {"instance": instance, "at": at, "relaunched": replaced, "moved": moved,
                "launchers_before": len(before[1])}  # fmt: skip

    def spot_notice(self) -> dict[str, Any]:
        from providers.local import LocalProvider

        live = sorted(rec["instance_id"] for rec in self.instances())
        if not live:
            return {"skipped": "no instance"}
        victim = self.rng.choice(live)
        LocalProvider(self.state / "local").preempt(victim, notice_s=20.0)
        return {"instance": victim}

    # ---- the soak ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        args = self.args
        os.umask(0o077)
        self.start_up()
        for example in sorted(self.specs):
            self.submit(example)
        sampler = threading.Thread(target=self.sample, daemon=True)
        sampler.start()
        start = time.monotonic()
        deadline = start + 60.0 * args.minutes
        next_event = start + args.first_event_s
        try:
            while time.monotonic() < deadline and len(self.events) < args.max_events:
                self.refill()
                if time.monotonic() < next_event:
                    time.sleep(1.0)
                    continue
                schedule = args.schedule.split(",") if args.schedule else None
                kind = (
                    schedule[len(self.events) % len(schedule)]
                    if schedule
                    else self.rng.choice(EVENTS)
                )
                t0 = time.monotonic() - start
                if kind == "controller-sigkill":
                    detail = self.controller_kill(signal.SIGKILL)
                elif kind == "controller-sigterm":
                    detail = self.controller_kill(signal.SIGTERM)
                elif kind == "controller-stall":
                    detail = self.controller_stall()
                elif kind == "agent-kill":
                    detail = self.agent_kill()
                else:
                    detail = self.spot_notice()
                if "skipped" not in detail:
                    self.kills[kind] += 1
                self.events.append({"at_s": round(t0, 1), "event": kind, **detail})
                next_event = time.monotonic() + args.event_every_s * self.rng.uniform(0.7, 1.3)
            self.refill()
        finally:
            self.sampling.set()
            sampler.join()
            ended = self.finish()
        return {**self.report(time.monotonic() - start), **ended}

    def finish(self) -> dict[str, Any]:
        """``coadapt down``, then what is left."""
        from providers.local import LocalProvider

        down_rc = None
        if self.up is not None and self.up.poll() is None:
            down = subprocess.run(
                [sys.executable, "-m", "autoscaler.cli", "down", "--state-dir", str(self.state)],
                cwd=ROOT, capture_output=True, text=True, timeout=400,
            )  # fmt: skip
            down_rc = down.returncode
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.up.wait(timeout=60)
        self.truth = self._judge_store()  # read before the folder goes
        ids = {p.stem for p in (self.state / "local" / "instances").glob("*.json")}
        listed = LocalProvider(self.state / "local").list_instances(CLUSTER)
        leaked_procs = [pid for pid, _, env in _procs()
                        if _env(env, "COADAPT_LOCAL_INSTANCE") in ids]  # fmt: skip
        return {
            "down_exit": down_rc,
            "leaked_instances": len(listed),
            "leaked_processes": len(leaked_procs),
            **self.truth,
        }

    def _judge_store(self) -> dict[str, Any]:
        """What the store says, judged against the trainers' own logs (see the module
        docstring): the instances released for silence, the events that are not true."""
        from autoscaler.controller.store import Store
        from coadapt_common.clock import SystemClock

        try:
            with Store.open(self.state / "store.db", SystemClock()) as store:
                silent = sorted(
                    r.instance_key
                    for r in store.list_instances()
                    if any(h.reason == SILENCE_REASON for h in store.history(r.instance_key))
                )
                events = [(e.at_s, e.kind, e.subject, e.message) for e in store.events_after(0)]
        except Exception as e:  # the soak reports; it never hides why it could not
            return {"store_error": f"{type(e).__name__}: {e}"}
        false = false_events(events, launches(self.tmp / "steps"))
        resumes = sum(1 for _, kind, _, _ in events if kind == "resume")
        restarts = sum(1 for _, kind, _, _ in events if kind == "agent-restart")
        return {
            "released_for_silence": len(silent),
            "released_for_silence_keys": silent,
            "resume_events": resumes,
            "agent_restart_events": restarts,
            "false_events": len(false),
            "false_event_lines": false[:20],
        }

    def report(self, elapsed_s: float) -> dict[str, Any]:
        lost = progress_lost(self.tmp / "steps")
        worst = max((s for steps in lost.values() for s in steps), default=0)
        return {
            "seed": self.args.seed,
            "minutes": round(elapsed_s / 60.0, 2),
            "events": self.events,
            "kills": self.kills,
            "controller_restarts": self.starts - 1,
            "jobs_completed": len(self.completed),
            "jobs_submitted": sum(self.generation.values()),
            "checkpoint_every_steps": self.args.checkpoint_every_steps,
            "progress_lost_steps": lost,
            "progress_lost_steps_max": worst,
            "relaunches_after_controller_restart": self.relaunches,
            "relaunches_after_controller_stall": self.stall_relaunches,
            "relaunches_after_agent_kill": self.agent_relaunches,
            "healthy_relaunches": self.relaunches + self.stall_relaunches + self.agent_relaunches,
            "heartbeat_timeout_s": self.args.heartbeat_timeout_s,
            "duplicate_launchers": self.duplicates,
            "cpus": os.cpu_count(),
            "load_end": os.getloadavg()[0],
        }

    def cleanup(self) -> None:
        if self.up is not None and self.up.poll() is None:
            self.up.kill()
            self.up.wait()
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


Launch = tuple[float, int, float | None, int]
"""One launch of a job, from its rank-0 step log: (start time, the step it restored (0: none),
the progress it restored (``None``: it restored nothing), the highest step it computed)."""


def launches(steps_dir: Path) -> dict[str, list[Launch]]:
    """Per job, its launches in start order, from the rank-0 step logs (``rank0-pid<N>.jsonl``:
    a ``start`` event with its time, a ``restored`` event with its step and progress, one
    line per micro-batch with its step)."""
    out: dict[str, list[Launch]] = {}
    for job_dir in sorted(p for p in steps_dir.glob("*") if p.is_dir()):
        found = []
        for path in job_dir.glob("rank0-pid*.jsonl"):
            started, step, progress, reached = None, 0, None, 0
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill
                if rec.get("event") == "start":
                    started = rec.get("t")
                elif rec.get("event") == "restored":
                    step, progress = int(rec.get("step", 0)), float(rec.get("progress", 0.0))
                elif "event" not in rec and "step" in rec:
                    reached = max(reached, int(rec["step"]))  # the step being computed
            if started is not None:
                found.append((float(started), step, progress, reached))
        out[job_dir.name] = sorted(found)
    return out


def progress_lost(steps_dir: Path) -> dict[str, list[int]]:
    """Per job, for each launch after its first: the most steps an earlier launch had
    trained minus the step it resumed from (0 when nothing was lost; see :func:`launches`)."""
    out: dict[str, list[int]] = {}
    for job, runs in launches(steps_dir).items():
        lost, best = [], 0
        for i, (_, restored, _, reached) in enumerate(runs):
            if i:
                lost.append(max(0, best - restored))
            best = max(best, reached)
        out[job] = lost
    return out


_CLAIMED = re.compile(r"resumes from its checkpoint at progress (\d+)")
_ADOPTED = re.compile(r"adopted the running launcher of ([a-z0-9, -]+?)(?:;|$)")
_RELAUNCHED = re.compile(r"the launcher of ([a-z0-9, -]+?) was gone")
SILENCE_REASON: Final = "agent stopped heartbeating"
EVENT_SLACK_S: Final = 2.0  # a launch starts after the event that placed it, never long before


_PLACING: Final = frozenset({"move", "rescale", "stop", "start", "resume", "preemption"})
"""Event kinds by which the controller itself ends or moves a job's launch."""


def _placed_between(
    events: list[tuple[float, str, str, str]], job: str, from_s: float, to_s: float
) -> bool:
    """Whether an event of :data:`_PLACING` names ``job`` in ``[from_s, to_s]``."""
    return any(
        kind in _PLACING and subject == job and from_s <= at_s <= to_s
        for at_s, kind, subject, _ in events
    )


def false_events(
    events: list[tuple[float, str, str, str]], runs: dict[str, list[Launch]]
) -> list[str]:
    """The events the trainers' logs contradict (see the module docstring), one line each."""
    false = []
    for at_s, kind, subject, message in events:
        if kind == "resume" and (m := _CLAIMED.search(message)):
            claimed = float(m.group(1))
            after = [r for r in runs.get(subject, []) if r[0] >= at_s - EVENT_SLACK_S]
            if after and (after[0][2] is None or after[0][2] < claimed - 0.5):
                false.append(f"{subject}: '{message}' but it restored {after[0][2]}")
        if kind == "agent-restart":
            for m in _ADOPTED.finditer(message):
                for job in m.group(1).split(", "):
                    # A launch that began before the restart and another right after it;
                    # one launch alone is the adopted one (its "start" line may come late).
                    # A launch the controller's own word explains (the job was moved,
                    # stopped or started again after the restart) contradicts nothing.
                    had = [r for r in runs.get(job, []) if r[0] < at_s]
                    again = [
                        r
                        for r in runs.get(job, [])
                        if at_s <= r[0] < at_s + 15.0
                        and not _placed_between(events, job, at_s, r[0] + EVENT_SLACK_S)
                    ]
                    if had and again:
                        false.append(f"{subject}: adopted {job}, yet it launched again")
            for m in _RELAUNCHED.finditer(message):
                for job in m.group(1).split(", "):
                    if not [r for r in runs.get(job, []) if r[0] >= at_s - EVENT_SLACK_S]:
                        false.append(f"{subject}: {job} to start again, but it never did")
    return false


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-events", type=int, default=40)
    p.add_argument("--event-every-s", type=float, default=30.0)
    p.add_argument("--first-event-s", type=float, default=40.0)
    p.add_argument("--epochs-scale", type=int, default=8)
    p.add_argument("--checkpoint-every-steps", type=int, default=50)
    p.add_argument(
        "--heartbeat-timeout-s",
        type=positive_float,
        default=20.0,
        help="the controller's heartbeat timeout (up --heartbeat-timeout-s); a controller "
        "stall lasts three of them",
    )
    p.add_argument(
        "--hidden",
        type=positive_int,
        default=None,
        help="every job's MLP this wide (default: each example's own width)",
    )
    p.add_argument(
        "--sample-delay-s",
        type=nonnegative_float,
        default=0.0,
        help="every job also sleeps this long per sample, an accelerator's work that leaves "
        "the host's cores free (with a narrow --hidden: the soak then loads the control "
        "plane, not the CPU; the test's setting)",
    )
    p.add_argument(
        "--schedule",
        default="",
        help="events in this order (comma-separated, repeated), instead of a seeded draw",
    )
    p.add_argument("--keep", action="store_true", help="keep the soak's folder")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    unknown = set(filter(None, args.schedule.split(","))) - set(EVENTS)
    if unknown:
        p.error(f"unknown events {sorted(unknown)}: choose from {', '.join(EVENTS)}")
    soak = Soak(args)
    try:
        result = soak.run()
    finally:
        soak.cleanup()
    print(json.dumps(result, indent=1))
    if args.out:
        write_json_atomic(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
