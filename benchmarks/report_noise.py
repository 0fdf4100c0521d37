"""Measurement noise of a trainer report, calibrated on coadapt's own trainer (real torchrun/gloo).

    python benchmarks/report_noise.py --out FILE [--quick] [--models mlp,bert]
        [--measurements 512] [--gns-every 8] [--warmup-steps 200]

What a simulated trainer should report is not the trace's truth but what our trainer's
estimators would read: the gradient-noise estimator (:class:`trainer.gns.GradientNoiseEstimator`,
which yields :class:`trainer.report.GradientStats`: ``grad_sqr``, ``grad_var``, ``measurements``)
and the step profiler (:class:`trainer.metrics.StepProfiler`, which yields the report's
``ProfileEntry.step_s``: the mean over the ``steps`` recorded so far). This script measures how far
those readings scatter around their mean as a function of ``n``, the number of measurements they
rest on.

Per model, one ``torchrun`` launch (2 processes, gloo, CPU: what a 2-replica job runs) of our own
loop (``trainer.init``, ``job.prepare``, ``job.data_loader``, ``job.epochs``) on an example's model
and data, generated in the process (nothing is downloaded):

* ``mlp``: ``examples/elastic_mlp.py``'s model and data (MLP 32-64-64-1, synthetic regression,
  SGD lr 0.05 momentum 0.9, the example's defaults), ``M0`` = 64;
* ``bert``: ``examples/hf_classifier.py``'s model and data (a 2-layer BERT, hidden 32, from a
  config with random weights, synthetic 16-token sequences), AdamW lr 1e-3 (the example's default:
  Adam-type, so the statistics are preconditioned), ``M0`` = 64.

The job trains ``--warmup-steps`` steps at its learning rate (to leave the initialisation), then
the learning rate is set to 0: the parameters, hence the true statistics, stay where they are
while the job keeps measuring on fresh batches, so that what scatters is the estimators alone,
at one training point (the simulator's trace supplies how the truth moves).

Rank 0 reads after every step the estimator's device state (``job.read_gradient_state()``) and
the report the job would send (``job.build_report()``: its profile). Here, from those series:

* gradient statistics: each estimator update's own input (per-measurement ``|G|^2`` and
  ``sigma2 / M0``) is recovered exactly from consecutive states (the update is
  ``S_k = beta S_(k-1) + (1 - beta) x_k``; checked: replaying all of them through a fresh
  estimator gives the launch's final state, ``replay_max_rel_error``). The frozen part is cut
  into non-overlapping windows of ``n`` measurements; each window is fed to a fresh
  ``GradientNoiseEstimator`` (the trainer's class, same ``M0`` and smoothing), whose ``values()``
  are what a job reports after ``n`` measurements, and ``GradientStats.noise_scale`` gives the
  noise scale. This replay runs in this process but is the same code on the same inputs: the
  2-process part (each replica's local norm, the all-reduce, the unbiased per-step estimates) is
  what produced the inputs, under torchrun.
* step time: each recorded step's wall time, from the growth of the profile's ``steps x step_s``
  (the profiler's own clock points); windows of ``n`` consecutive steps, each window's mean being
  what a launch reports after ``n`` recorded steps.

Per quantity and ``n``: ``relative_sd`` = sample standard deviation / |mean| over the windows,
``sd_log`` (the standard deviation of the log, positive values only), ``windows`` and
``frac_nonpositive``. The ``calibration`` block, which ``autoscaler.sim.report_noise`` loads, takes
per ``n`` the larger relative spread of the models (the noisier example: a simulated world at
least as noisy as any trainer measured here). Caveats: CPU not GPU, tiny models, a shared host
(step-time jitter includes other processes' load); the smoothing (0.95) is the trainer's default;
measurements come every 8th step (``--gns-every``; the trainer's
default is 16, ``examples/elastic_mlp.py``'s 8), which matters to the step times only.

``--quick``: one model (mlp), 64 measurements every 2nd step, n up to 8: a run a test affords.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.argtypes import positive_int  # noqa: E402
from benchmarks.trainer_overhead import torchrun_env  # noqa: E402

MODELS = ("mlp", "bert")
QUANTITIES = ("grad_sqr", "grad_var", "noise_scale", "step_s")
INITIAL_BATCH = 64
FULL_NS = (1, 2, 4, 8, 16, 32, 64)
QUICK_NS = (1, 2, 4, 8)
SMOOTHING = 0.95  # JobOptions.gns_smoothing's default, set explicitly so the replay matches


# ---------------------------------------------------------------------------- worker side


def _build(model_name: str) -> tuple[Any, Any, Any, Any, bool]:
    """(model, base optimizer, dataset, loss of a batch, weight_model_outputs) of an example."""
    import torch

    if model_name == "mlp":
        from examples import elastic_mlp as ex

        dataset = ex.SyntheticRegression(8192, 32, noise_std=0.5, seed=1, dtype=torch.float32)
        model = ex.build_model(32, 64, 0, torch.float32)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def loss(net: Any, batch: Any, job: Any) -> Any:
            _, x, y = batch
            return ex.loss_fn(net(x), y)

        return model, opt, dataset, loss, True
    from examples import hf_classifier as hx

    dataset = hx.SyntheticText(8192, 16, seed=1)
    model = hx.build_model(0, torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss_bert(net: Any, batch: Any, job: Any) -> Any:
        return net(**batch).loss * job.micro_batch.weight

    return model, opt, dataset, loss_bert, False


def worker(args: argparse.Namespace) -> None:
    """Inside torchrun: train, freeze, keep measuring; rank 0 writes the per-step series."""
    import trainer

    model, base_opt, dataset, loss_of, weight_outputs = _build(args.worker)
    job = trainer.init(
        INITIAL_BATCH,
        gns_every_steps=args.gns_every,
        gns_smoothing=SMOOTHING,
        checkpoint_every_s=0,
        data_seed=args.seed,
        weight_model_outputs=weight_outputs,
    )
    net, opt = job.prepare(model, base_opt)
    loader = job.data_loader(dataset)
    total = args.warmup_steps + args.gns_every * (args.measurements + 3)
    states: list[list[float]] = []
    profile: list[list[float]] = []
    frozen_at = -1
    done = False
    while not done:
        for _ in job.epochs(10**9):
            for batch in loader:
                loss_of(net, batch, job).backward()
                opt.step()
                opt.zero_grad()
                if not job.at_step_boundary:
                    continue
                if job.step == args.warmup_steps:
                    for group in base_opt.param_groups:  # freeze: the truth stays put
                        group["lr"] = 0.0
                    frozen_at = len(states)
                if job.rank == 0:
                    states.append(job.read_gradient_state())
                    entries = job.build_report().profiles
                    profile.append(
                        [entries[0].steps, entries[0].steps * entries[0].step_s]
                        if entries
                        else [0, 0.0]
                    )
                if job.step >= total:
                    done = True
                    break
            if done:
                break
    if job.rank == 0:
        Path(args.result).write_text(
            json.dumps(
                {
                    "states": states,
                    "profile": profile,
                    "frozen_at": frozen_at,
                    "world_size": job.world_size,
                    "preconditioned": bool(
                        job.gradient_stats and job.gradient_stats.preconditioned
                    ),
                    "parameters": sum(p.numel() for p in model.parameters()),
                }
            )
        )
    job.close()


# ---------------------------------------------------------------------------- driver side


def _env(workdir: Path, tag: str) -> dict[str, str]:
    env = torchrun_env()
    env.update(
        COADAPT_REPORT_FILE=str(workdir / f"reports-{tag}.jsonl"),
        COADAPT_CHECKPOINT_URI=str(workdir / f"ckpt-{tag}"),
    )
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_model(args: argparse.Namespace, model_name: str, workdir: Path) -> dict[str, Any]:
    """One torchrun launch of ``model_name``; its raw series."""
    result = workdir / f"{model_name}.json"
    for attempt in range(3):  # torchrun's free port can be taken by another process first
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
            str(Path(__file__).resolve()), "--worker", model_name, "--result", str(result),
            "--measurements", str(args.measurements), "--gns-every", str(args.gns_every),
            "--warmup-steps", str(args.warmup_steps), "--seed", str(args.seed),
        ]  # fmt: skip
        done = subprocess.run(
            command, env=_env(workdir, model_name), timeout=1200, capture_output=True, text=True
        )
        if done.returncode == 0:
            return dict(json.loads(result.read_text()))
        print(f"{model_name} run failed (attempt {attempt + 1}):\n{done.stderr[-3000:]}",
              file=sys.stderr)  # fmt: skip
    raise RuntimeError(f"{model_name}: torchrun failed three times")


def measurement_inputs(states: list[list[float]], beta: float) -> list[tuple[int, float, float]]:
    """Each estimator update's input ``(index of the state it lands in, |G|^2, sigma2/M0)``,
    recovered from consecutive states ``S_k = beta S_(k-1) + (1 - beta) x_k`` (an update is
    where the state changes)."""
    out = []
    prev = [0.0, 0.0, 0.0]
    for i, s in enumerate(states):
        if s != prev:  # not the weight alone: it saturates at 1.0 after ~700 updates
            x = [(s[c] - beta * prev[c]) / (1.0 - beta) for c in range(3)]
            out.append((i, x[0], x[1]))
        prev = s
    return out


def replay(inputs: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """Feeds ``(|G|^2, sigma2/M0)`` pairs through a fresh trainer estimator: its reported
    ``(grad_sqr, grad_var)`` and raw state."""
    import torch

    from trainer.gns import GradientNoiseEstimator

    est = GradientNoiseEstimator(INITIAL_BATCH, smoothing=SMOOTHING)
    for sqr, var in inputs:
        est.update(
            torch.tensor(sqr, dtype=torch.float64),
            torch.tensor(var * INITIAL_BATCH, dtype=torch.float64),
        )
    est.publish()
    est.refresh()
    values = est.values()
    assert values is not None
    return values[0], values[1], [float(v) for v in est.state.tolist()]


def spread(values: list[float]) -> dict[str, Any]:
    """Relative sd (sd / |mean|), sd of log (positive values), and the window count."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return {
        "windows": len(values),
        "mean": mean,
        "relative_sd": sd / abs(mean) if mean else math.inf,
        "sd_log": statistics.stdev(math.log(v) for v in positive) if len(positive) > 1 else None,
        "frac_nonpositive": sum(1 for v in values if not v > 0) / len(values),
    }


def analyse(raw: dict[str, Any], ns: tuple[int, ...], min_windows: int) -> dict[str, Any]:
    """Per quantity and ``n``: the spread over non-overlapping windows (see module docstring)."""
    from trainer.report import GradientStats

    states, frozen_at = raw["states"], raw["frozen_at"]
    inputs = measurement_inputs(states, SMOOTHING)
    _, _, state = replay([(a, b) for _, a, b in inputs])
    replay_error = max(
        abs(state[c] - states[-1][c]) / max(abs(states[-1][c]), 1e-300) for c in range(3)
    )
    # measurements taken at the frozen parameters: landed 2+ states after the freeze
    frozen = [(a, b) for i, a, b in inputs if i >= frozen_at + 2]
    steps = []
    prof = raw["profile"]
    for k in range(max(frozen_at + 2, 1), len(prof)):
        if prof[k][0] == prof[k - 1][0] + 1:
            steps.append(prof[k][1] - prof[k - 1][1])
    out: dict[str, Any] = {q: [] for q in QUANTITIES}
    for n in ns:
        windows = [frozen[i : i + n] for i in range(0, len(frozen) - n + 1, n)]
        if len(windows) >= min_windows:
            reads = [replay(w)[:2] for w in windows]
            stats = [GradientStats(INITIAL_BATCH, s, v, n, raw["preconditioned"]) for s, v in reads]
            for q, vals in (
                ("grad_sqr", [s.grad_sqr for s in stats]),
                ("grad_var", [s.grad_var for s in stats]),
                ("noise_scale", [s.noise_scale for s in stats]),
            ):
                finite = [v for v in vals if math.isfinite(v)]
                entry = {"n": n, **spread(finite)}
                if q == "noise_scale":
                    entry["frac_infinite"] = 1 - len(finite) / len(vals)
                out[q].append(entry)
        step_windows = [steps[i : i + n] for i in range(0, len(steps) - n + 1, n)]
        if len(step_windows) >= min_windows:
            out["step_s"].append({"n": n, **spread([statistics.fmean(w) for w in step_windows])})
    return {
        "world_size": raw["world_size"],
        "parameters": raw["parameters"],
        "preconditioned": raw["preconditioned"],
        "initial_batch_size": INITIAL_BATCH,
        "frozen_measurements": len(frozen),
        "frozen_steps_timed": len(steps),
        "truth_grad_sqr": statistics.fmean(a for a, _ in frozen),
        "truth_grad_var": statistics.fmean(b for _, b in frozen),
        "mean_step_s": statistics.fmean(steps),
        "replay_max_rel_error": replay_error,
        "spread": out,
    }


def calibration(models: dict[str, dict[str, Any]], ns: tuple[int, ...]) -> dict[str, Any]:
    """Per quantity, the ``n`` every model measured and, at each, the largest relative sd."""
    table: dict[str, Any] = {}
    for q in QUANTITIES:
        by_n: dict[int, list[float]] = {}
        for m in models.values():
            for e in m["spread"][q]:
                by_n.setdefault(e["n"], []).append(e["relative_sd"])
        common = [n for n in ns if len(by_n.get(n, ())) == len(models)]
        table[q] = {"n": common, "relative_sd": [max(by_n[n]) for n in common]}
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true", help="a small run a test affords (mlp only)")
    p.add_argument("--models", default=None, help="comma-separated, of: " + ",".join(MODELS))
    p.add_argument("--measurements", type=positive_int, default=None)
    p.add_argument("--gns-every", type=positive_int, default=None)
    p.add_argument("--warmup-steps", type=positive_int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", choices=MODELS, default=None)
    p.add_argument("--result", default=None)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if not args.out:
        p.error("--out is required")
    quick = args.quick
    models = tuple((args.models or ("mlp" if quick else ",".join(MODELS))).split(","))
    if any(m not in MODELS for m in models):
        p.error(f"--models: choose from {', '.join(MODELS)}")
    args.measurements = args.measurements or (64 if quick else 512)
    args.gns_every = args.gns_every or (2 if quick else 8)
    args.warmup_steps = args.warmup_steps or (20 if quick else 200)
    ns = QUICK_NS if quick else FULL_NS
    min_windows = 4
    ns = tuple(n for n in ns if args.measurements // n >= min_windows)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="coadapt-noise-") as tmp:
        for name in models:
            results[name] = analyse(run_model(args, name, Path(tmp)), ns, min_windows)
    argv_used = sys.argv[1:] if argv is None else argv
    out = {
        "benchmark": "report_noise",
        "command": shlex.join(["python", "benchmarks/report_noise.py", *argv_used]),
        "settings": {
            "models": list(models),
            "measurements": args.measurements,
            "gns_every_steps": args.gns_every,
            "gns_smoothing": SMOOTHING,
            "warmup_steps": args.warmup_steps,
            "seed": args.seed,
            "ns": list(ns),
            "min_windows": min_windows,
            "processes": 2,
            "backend": "gloo",
            "device": "cpu",
            "quick": quick,
        },
        "models": results,
        "calibration": {
            "rule": "per n, the largest relative_sd of the models",
            **calibration(results, ns),
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    from coadapt_common.atomic import write_json_atomic

    write_json_atomic(args.out, out, indent=2)
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
