"""Overhead and restart time of coadapt's trainer library, measured with real torchrun/gloo.

    python benchmarks/trainer_overhead.py --out FILE [--pairs 7 --steps 150]

Same model (a ~1M-parameter MLP, AdamW, cross-entropy) and synthetic data throughout:

1. **Throughput** (2 processes, gloo, one torchrun launch): plain DDP (``DataLoader`` +
   ``DistributedSampler`` + ``DistributedDataParallel``) vs DDP + coadapt (elastic loader,
   gradient-noise measurement at its default interval of 16 steps, LR scaling, profiling,
   stop agreement, reporting), 64 samples per replica. Both variants live in the same
   processes and run interleaved, A B, B A, A B, ... (``--pairs`` pairs of ``--steps`` steps
   after one warm-up pair; the order alternates so that neither always runs first), because
   throughput drifts run to run here.
   Per pair ``overhead = 1 - coadapt / ddp`` (steps/s); reported: the median
   (``overhead_frac``) and the interquartile range (``overhead_spread``). Also, from CPU time
   (process CPU seconds per step, summed over the ranks), which other processes on a shared host
   disturb less: ``overhead_cpu_frac`` = median of ``coadapt / ddp - 1``, and its spread.
   With ``--calibrate``, a second throughput run pits plain DDP against plain DDP (A/A) and
   reports its "overhead" as ``calibration_overhead_frac``/``_spread``: the noise floor of the
   host, against which ``overhead_frac`` should be read.
2. **Restart**: ``coadapt-launch`` with 2 processes; SIGTERM to the launcher; when it has exited
   (stopped with a checkpoint), a new ``coadapt-launch`` with 1 process (then, from a fresh
   2-process run, 3); the time from the SIGTERM to the end of the first optimizer step after the
   restore, by the wall clock (the worker logs it).
3. **Checkpoint save/load**: timed inside the workers during those restarts (save: RNG gather,
   serialise, checksum, atomic write; load: read, verify, deserialise, load into model and
   optimizer), median over the restarts.

``--framework`` picks what "the same framework alone" is: ``ours`` (the default) is the above,
plain DDP against coadapt's own loop; ``hf`` is the Hugging Face Trainer (needs ``coadapt[hf]``):
the plain ``transformers.Trainer`` against ``CoadaptTrainer`` (:mod:`trainer.integrations.hf`) on
``examples/hf_classifier.py``'s model (a 2-layer BERT, hidden 32, sequences of 16 tokens), 2
processes, 32 samples per replica, AdamW, clipping at 1.0, coadapt's gradient-noise measurement at
its default interval. Each segment is one ``train()`` call of ``--steps`` steps (plus
``HF_WARMUP_STEPS`` not timed: the Trainer's setup, and coadapt's, are not per-step costs), timed
on rank 0 from the callbacks' ``on_step_end`` (and CPU seconds per step, summed over the ranks:
``overhead_cpu_frac``); the two variants alternate as above (A B, B A, ...), and ``--calibrate``
pits the plain Trainer against itself (A/A). Only the throughput part exists for ``hf`` (restart
times are the launcher's and the checkpoint's, measured above). Each framework's code is in its own
functions (``*_hf``), so that another framework adds its own beside them.

``--framework lightning`` measures the PyTorch Lightning integration instead
(:mod:`trainer.integrations.lightning`): the same model, data and batch as a ``LightningModule``
trained by ``lightning.Trainer`` on 2 processes (torchrun, gloo), Lightning alone (its own
``DDPStrategy`` and ``DistributedSampler``) vs Lightning under coadapt (``CoadaptLightning``:
elastic plan, step loop, gradient noise every 16 steps, reports). One ``fit`` per launch, so the
variants are interleaved by launch (A B, B A, ...; ``--pairs`` pairs after a warm-up pair, each
fit timed over ``--steps`` optimizer steps after 10 warm-up steps). With ``--calibrate``, Lightning
alone against Lightning alone (A/A). Reported under ``lightning_*`` keys with the same meaning as
above (throughput only: restarts are the job's, measured above).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
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

INPUT_DIM, HIDDEN, CLASSES = 256, (1024, 512, 256), 10
LOCAL_BATCH = 64


# ---------------------------------------------------------------------------- worker side


def _model(seed: int = 0) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    dims = (INPUT_DIM, *HIDDEN)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], CLASSES))
    return nn.Sequential(*layers)


def _dataset(num_samples: int, seed: int = 1) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, INPUT_DIM, generator=g)
    y = torch.randint(0, CLASSES, (num_samples,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def worker_throughput(args: argparse.Namespace) -> None:
    """Inside torchrun: interleaved plain-DDP / coadapt segments; rank 0 writes the timings."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    import trainer

    world = int(os.environ["WORLD_SIZE"])
    job = trainer.init(LOCAL_BATCH * world, checkpoint_every_s=0)
    dataset = _dataset(LOCAL_BATCH * world * 400)

    plain_model = DistributedDataParallel(_model())
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=1e-3)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    plain_loader = DataLoader(dataset, batch_size=LOCAL_BATCH, sampler=sampler)

    def plain_batches(sampler: Any = sampler, loader: Any = plain_loader) -> Any:
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from loader
            epoch += 1

    base = _model()
    model, opt = job.prepare(base, torch.optim.AdamW(base.parameters(), lr=1e-3))
    loader = job.data_loader(dataset)
    job.restore()

    def coadapt_batches() -> Any:
        for _ in job.epochs(10**9):
            yield from loader

    variants = {
        "ddp": (plain_model, plain_opt, plain_batches()),
        "coadapt": (model, opt, coadapt_batches()),
    }
    if os.environ.get("COADAPT_BENCH_AA"):  # calibration: plain DDP against itself
        twin = DistributedDataParallel(_model())
        sampler2 = DistributedSampler(dataset, shuffle=True, seed=1)
        loader2 = DataLoader(dataset, batch_size=LOCAL_BATCH, sampler=sampler2)
        variants["coadapt"] = (twin, torch.optim.AdamW(twin.parameters(), lr=1e-3),
                               plain_batches(sampler2, loader2))  # fmt: skip

    def segment(name: str, steps: int) -> tuple[float, float]:
        """Steps/s (rank 0's wall clock: DDP keeps the ranks in lockstep) and CPU seconds per
        step summed over the ranks (less sensitive to other processes on the host)."""
        net, optimizer, batches = variants[name]
        dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for _ in range(steps):
            x, y = next(batches)
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        wall = time.perf_counter() - start
        cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
        dist.all_reduce(cpu)
        return steps / wall, float(cpu) / steps

    results: dict[str, list[float]] = {"ddp": [], "coadapt": [], "ddp_cpu": [], "coadapt_cpu": []}
    for pair in range(args.pairs + 1):
        # A B, then B A: interleaved, and neither variant always runs first
        order = ("ddp", "coadapt") if pair % 2 == 0 else ("coadapt", "ddp")
        for name in order:
            rate, cpu = segment(name, args.steps)
            if pair > 0:  # the first pair warms both up
                results[name].append(rate)
                results[f"{name}_cpu"].append(cpu)
    stats = job.gradient_stats
    if job.rank == 0:
        Path(args.result).write_text(
            json.dumps({**results, "gns_measurements": stats.measurements if stats else 0})
        )
    job.close()


def worker_train(args: argparse.Namespace) -> None:
    """Inside coadapt-launch: trains until stopped; logs the first step and checkpoint times."""
    t_start = time.time()
    import torch
    import torch.nn.functional as F

    import trainer

    t_imported = time.time()
    job = trainer.init(LOCAL_BATCH * 2, checkpoint_every_s=0)
    log = Path(args.log_dir) / f"rank{job.rank}-{os.getpid()}.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)

    def emit(**record: Any) -> None:
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")

    emit(event="timeline", start=t_start, imported=t_imported, initialised=time.time())

    base = _model()
    model, opt = job.prepare(base, torch.optim.AdamW(base.parameters(), lr=1e-3))
    loader = job.data_loader(_dataset(LOCAL_BATCH * 2 * 400))
    t_prepared = time.time()
    restored = job.restore()
    if restored is not None:
        emit(event="restored", load_s=job.timings.load_s, step=job.step, prepared=t_prepared)
    first = True
    try:
        for _ in job.epochs(10**9):
            for x, y in loader:
                F.cross_entropy(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                if first:
                    first = False
                    emit(event="first_step", t=time.time(), world_size=job.world_size)
                if args.step_delay_s:
                    time.sleep(args.step_delay_s)
    except trainer.JobStopped:
        emit(event="stopped", save_s=job.timings.save_s, t=time.time())
        raise


# ---------------------------------------------------------------------------- HF Trainer

HF_WARMUP_STEPS = 5  # steps of each segment before the timed ones (train() setup, first step)
HF_LOCAL_BATCH = 32


def _hf_example() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "hf_classifier_example", ROOT / "examples" / "hf_classifier.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker_throughput_hf(args: argparse.Namespace) -> None:
    """Inside torchrun: interleaved ``train()`` segments of the plain ``transformers.Trainer``
    and of ``CoadaptTrainer`` (or of a second plain Trainer, A/A); rank 0 writes the rates."""
    import torch
    import transformers

    from trainer.integrations.hf import CoadaptTrainer

    ex = _hf_example()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    steps = args.steps + HF_WARMUP_STEPS
    dataset = ex.SyntheticText(HF_LOCAL_BATCH * world * steps, 16, seed=1)
    workdir = Path(args.result).parent

    class StepClock(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[float] = []

        def on_step_end(self, *a: Any, **kw: Any) -> None:
            self.times.append(time.perf_counter())
            self.cpu.append(time.process_time())

    def training_args(name: str) -> Any:
        return transformers.TrainingArguments(
            output_dir=str(workdir / f"hf-out-{name}"),
            max_steps=steps,
            per_device_train_batch_size=HF_LOCAL_BATCH,
            learning_rate=1e-3,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=0,
            # The model has no unused parameter: the Trainer's default (True) would add a
            # graph traversal per step to the plain Trainer that coadapt's DDP does not do.
            ddp_find_unused_parameters=False,
        )

    aa = bool(os.environ.get("COADAPT_BENCH_AA"))
    segments = 0

    def segment(name: str) -> tuple[float, float]:
        """Steps/s over the timed steps of one ``train()`` call (rank 0's wall clock) and CPU
        seconds per timed step summed over the ranks (this process's threads included: the
        reporter's and the notice watcher's too)."""
        nonlocal segments
        segments += 1
        clock = StepClock()
        model = ex.build_model(0, torch.float32)
        if name == "hf" or aa:
            hf: Any = transformers.Trainer(
                model=model, args=training_args(name), train_dataset=dataset, callbacks=[clock]
            )
        else:
            # A fresh checkpoint folder per segment: a segment must not resume the last one.
            os.environ["COADAPT_CHECKPOINT_URI"] = str(workdir / f"hf-ckpt-{segments}")
            hf = CoadaptTrainer(
                model=model,
                args=training_args(name),
                train_dataset=dataset,
                callbacks=[clock],
                initial_batch_size=HF_LOCAL_BATCH * world,
                job_options={"checkpoint_every_s": 0},
            )
        hf.train()
        timed = clock.times[HF_WARMUP_STEPS - 1 :]
        cpu = torch.tensor(
            [(clock.cpu[-1] - clock.cpu[HF_WARMUP_STEPS - 1]) / (len(timed) - 1)],
            dtype=torch.float64,
        )
        torch.distributed.all_reduce(cpu)
        return (len(timed) - 1) / (timed[-1] - timed[0]), float(cpu)

    results: dict[str, list[float]] = {"hf": [], "coadapt": [], "hf_cpu": [], "coadapt_cpu": []}
    for pair in range(args.pairs + 1):
        order = ("hf", "coadapt") if pair % 2 == 0 else ("coadapt", "hf")
        for name in order:
            rate, cpu_s = segment(name)
            if pair > 0:  # the first pair warms both up
                results[name].append(rate)
                results[f"{name}_cpu"].append(cpu_s)
    if rank == 0:
        Path(args.result).write_text(json.dumps(results))


def paired_overhead(
    base: list[float], ours: list[float], base_cpu: list[float], ours_cpu: list[float]
) -> dict[str, Any]:
    """The overhead figures of interleaved pairs, the same for every framework: per pair
    ``1 - ours / base`` (steps/s) and ``ours_cpu / base_cpu - 1`` (CPU seconds per step);
    ``overhead_frac`` / ``overhead_cpu_frac`` their medians, ``*_spread`` their interquartile
    ranges, ``overhead_pairs`` the per-pair values in run order."""
    overheads = sorted(1.0 - c / d for d, c in zip(base, ours, strict=True))
    quartiles = statistics.quantiles(overheads, n=4) if len(overheads) >= 2 else [0, 0, 0]
    cpu = sorted(c / d - 1.0 for d, c in zip(base_cpu, ours_cpu, strict=True))
    cpu_quartiles = statistics.quantiles(cpu, n=4) if len(cpu) >= 2 else [0, 0, 0]
    return {
        "overhead_frac": statistics.median(overheads),
        "overhead_spread": quartiles[2] - quartiles[0],
        "overhead_pairs": [1.0 - c / d for d, c in zip(base, ours, strict=True)],
        "overhead_cpu_frac": statistics.median(cpu),
        "overhead_cpu_spread": cpu_quartiles[2] - cpu_quartiles[0],
    }


def measure_throughput_hf(
    args: argparse.Namespace, workdir: Path, *, calibrate: bool = False
) -> dict[str, Any]:
    """Interleaved plain-Trainer / CoadaptTrainer segments (with ``calibrate``: plain against
    plain, A/A); the same figures as :func:`measure_throughput` from wall-clock rates."""
    result = workdir / ("calibration-hf.json" if calibrate else "throughput-hf.json")
    env = torchrun_env()
    if calibrate:
        env["COADAPT_BENCH_AA"] = "1"
    env["COADAPT_REPORT_FILE"] = str(workdir / "reports-hf.jsonl")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        str(Path(__file__).resolve()), "--worker", "throughput-hf", "--result", str(result),
        "--pairs", str(args.pairs), "--steps", str(args.steps),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, timeout=3600)
    data = json.loads(result.read_text())
    plain, ours = data["hf"], data["coadapt"]
    return {
        "framework": "hf",
        **paired_overhead(plain, ours, data["hf_cpu"], data["coadapt_cpu"]),
        "framework_cpu_s_per_step": statistics.median(data["hf_cpu"]),
        "trainer_cpu_s_per_step": statistics.median(data["coadapt_cpu"]),
        "framework_steps_per_s": statistics.median(plain),
        "trainer_steps_per_s": statistics.median(ours),
        "framework_steps_per_s_pairs": plain,
        "trainer_steps_per_s_pairs": ours,
        "pairs": len(plain),
        "steps_per_segment": args.steps,
    }


# ---------------------------------------------------------------------------- driver side


def torchrun_env() -> dict[str, str]:
    """This environment for a local torchrun job: one thread per process, gloo on loopback,
    the checkout importable."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
        PYTHONPATH=str(ROOT),
    )
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def measure_throughput(
    args: argparse.Namespace, workdir: Path, *, calibrate: bool = False
) -> dict[str, Any]:
    """Interleaved DDP / coadapt segments; with ``calibrate``, DDP against a second plain DDP
    (an A/A run: how far from 0 this host's noise alone puts the figures)."""
    result = workdir / ("calibration.json" if calibrate else "throughput.json")
    env = torchrun_env()
    if calibrate:
        env["COADAPT_BENCH_AA"] = "1"
    env["COADAPT_REPORT_FILE"] = str(workdir / "reports.jsonl")
    env["COADAPT_CHECKPOINT_URI"] = str(workdir / "ckpt-throughput")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        str(Path(__file__).resolve()), "--worker", "throughput", "--result", str(result),
        "--pairs", str(args.pairs), "--steps", str(args.steps),
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, timeout=1800)
    data = json.loads(result.read_text())
    ddp, ours = data["ddp"], data["coadapt"]
    return {
        **paired_overhead(ddp, ours, data["ddp_cpu"], data["coadapt_cpu"]),
        "ddp_cpu_s_per_step": statistics.median(data["ddp_cpu"]),
        "trainer_cpu_s_per_step": statistics.median(data["coadapt_cpu"]),
        "ddp_steps_per_s": statistics.median(ddp),
        "trainer_steps_per_s": statistics.median(ours),
        "ddp_steps_per_s_pairs": ddp,
        "trainer_steps_per_s_pairs": ours,
        "pairs": len(ddp),
        "steps_per_segment": args.steps,
        "gns_measurements": data["gns_measurements"],
    }


# ---------------------------------------------------------------------------- Lightning

LIGHTNING_WARMUP_STEPS = 10


def worker_lightning(args: argparse.Namespace) -> None:
    """Inside torchrun: one Lightning ``fit`` of the benchmark model, alone or under coadapt;
    rank 0 writes steps/s over ``--steps`` steps after the warm-up, and CPU s per step."""
    import lightning.pytorch as pl
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    world = int(os.environ["WORLD_SIZE"])
    total = LIGHTNING_WARMUP_STEPS + args.steps

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _model()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Timer(pl.Callback):
        def __init__(self) -> None:
            self.marks: dict[int, tuple[float, float]] = {}

        def on_train_batch_end(self, trainer: Any, *rest: Any) -> None:
            step = trainer.global_step
            if step in (LIGHTNING_WARMUP_STEPS, total) and step not in self.marks:
                self.marks[step] = (time.perf_counter(), time.process_time())

    timer = Timer()
    dataset = _dataset(LOCAL_BATCH * world * 400)
    common: dict[str, Any] = dict(
        max_steps=total,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if args.variant == "coadapt":
        from trainer.integrations.lightning import CoadaptLightning

        job = CoadaptLightning(LOCAL_BATCH * world, checkpoint_every_s=0)
        trainer = pl.Trainer(callbacks=[job, timer], **common, **job.trainer_kwargs())
        job.fit(trainer, Module(), dataset)
        rank = job.job.rank
    else:
        trainer = pl.Trainer(
            accelerator="cpu", devices=world, strategy="ddp", callbacks=[timer], **common
        )
        loader = torch.utils.data.DataLoader(dataset, batch_size=LOCAL_BATCH, shuffle=True)
        trainer.fit(Module(), loader)
        rank = dist.get_rank()
    (w0, c0), (w1, c1) = timer.marks[LIGHTNING_WARMUP_STEPS], timer.marks[total]
    cpu = torch.tensor([c1 - c0], dtype=torch.float64)
    dist.all_reduce(cpu)
    if rank == 0:
        result = {"steps_per_s": args.steps / (w1 - w0), "cpu_s_per_step": float(cpu) / args.steps}
        Path(args.result).write_text(json.dumps(result))


def _lightning_fit(args: argparse.Namespace, workdir: Path, variant: str, tag: str) -> dict:
    result = workdir / f"lightning-{tag}.json"
    env = torchrun_env()
    env["COADAPT_REPORT_FILE"] = str(workdir / f"reports-{tag}.jsonl")
    env["COADAPT_CHECKPOINT_URI"] = str(workdir / f"ckpt-{tag}")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{_free_port()}",
        str(Path(__file__).resolve()), "--worker", "lightning", "--variant", variant,
        "--result", str(result), "--steps", str(args.steps),
    ]  # fmt: skip
    for attempt in range(3):  # torchrun's free port can be taken by another process first
        done = subprocess.run(command, env=env, timeout=900, stdout=subprocess.DEVNULL)
        if done.returncode == 0:
            return dict(json.loads(result.read_text()))
        print(f"lightning fit {tag} failed (attempt {attempt + 1}); retrying", file=sys.stderr)
        command[5] = f"--rdzv-endpoint=127.0.0.1:{_free_port()}"
    raise RuntimeError(f"lightning fit {tag} failed three times")


def measure_lightning_throughput(
    args: argparse.Namespace, workdir: Path, *, calibrate: bool = False
) -> dict[str, Any]:
    """Lightning alone vs Lightning under coadapt (with ``calibrate``: alone vs alone),
    interleaved by launch; the same statistics as :func:`measure_throughput`."""
    second = "alone" if calibrate else "coadapt"
    runs: dict[str, list[dict]] = {"alone": [], "other": []}
    for pair in range(args.pairs + 1):
        order = (("alone", "alone"), ("other", second))
        for key, variant in order if pair % 2 == 0 else order[::-1]:
            run = _lightning_fit(args, workdir, variant, f"{key}-{pair}-{calibrate}")
            if pair > 0:  # the first pair warms the host's caches up
                runs[key].append(run)
    alone = [r["steps_per_s"] for r in runs["alone"]]
    ours = [r["steps_per_s"] for r in runs["other"]]
    stats = paired_overhead(
        alone,
        ours,
        [r["cpu_s_per_step"] for r in runs["alone"]],
        [r["cpu_s_per_step"] for r in runs["other"]],
    )
    return {
        "lightning_steps_per_s": statistics.median(alone),
        "lightning_coadapt_steps_per_s": statistics.median(ours),
        **{f"lightning_{key}": value for key, value in stats.items()},
        "lightning_pairs": len(alone),
        "lightning_steps_per_fit": args.steps,
    }


def run_lightning(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """``--framework lightning``: the throughput figures (and the A/A floor with
    ``--calibrate``)."""
    results = measure_lightning_throughput(args, workdir)
    if args.calibrate:
        aa = measure_lightning_throughput(args, workdir, calibrate=True)
        results["lightning_calibration_overhead_frac"] = aa["lightning_overhead_frac"]
        results["lightning_calibration_overhead_spread"] = aa["lightning_overhead_spread"]
        results["lightning_calibration_overhead_pairs"] = aa["lightning_overhead_pairs"]
    import lightning

    results["lightning_version"] = lightning.__version__
    return results


class _Job:
    """One ``coadapt-launch`` of the training worker."""

    def __init__(self, workdir: Path, ckpt: Path, logs: Path, nproc: int, delay_s: float) -> None:
        self.logs = logs
        self.run_dir = workdir / f"run-{time.monotonic_ns()}"
        command = [
            sys.executable, "-m", "trainer.launch", "--job-id", "bench", "--nproc-per-node",
            str(nproc), "--checkpoint-uri", str(ckpt), "--report-file",
            str(workdir / "reports.jsonl"), "--run-dir", str(self.run_dir),
            str(Path(__file__).resolve()), "--worker", "train", "--log-dir", str(logs),
            "--step-delay-s", str(delay_s),
        ]  # fmt: skip
        self.out = open(workdir / f"launch-{nproc}-{time.monotonic_ns()}.out", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            command,
            env=torchrun_env(),
            stdout=self.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def events(self, name: str) -> list[dict[str, Any]]:
        out = []
        for path in self.logs.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                record = json.loads(line)
                if record.get("event") == name:
                    out.append(record)
        return out

    def close(self) -> None:
        from trainer.control import RunDir
        from trainer.launch import end_processes

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        end_processes(RunDir(self.run_dir).pids(), grace_s=1.0)
        self.out.close()


def _wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError(what)


def measure_restart(workdir: Path, new_size: int, delay_s: float) -> dict[str, float]:
    """2 processes → SIGTERM → ``new_size`` processes; seconds to the first step after it."""
    # Fresh folders per measurement: a repeat must neither resume nor read the last one's logs.
    tag = f"2to{new_size}-{time.monotonic_ns()}"
    ckpt = workdir / f"ckpt-{tag}"
    old_logs, new_logs = workdir / f"logs-{tag}-a", workdir / f"logs-{tag}-b"
    old = _Job(workdir, ckpt, old_logs, 2, delay_s)
    new = None
    try:
        _wait_for(lambda: old.events("first_step"), 120, "first step of the 2-process run")
        time.sleep(2.0)  # steady state
        sigterm_t = time.time()
        old.proc.send_signal(signal.SIGTERM)
        rc = old.proc.wait(timeout=120)
        if rc != 75:
            raise RuntimeError(f"2-process launcher exited {rc}, expected 75 (stopped)")
        new = _Job(workdir, ckpt, new_logs, new_size, delay_s)
        _wait_for(lambda: new.events("first_step"), 120, "first step after the restart")
        first_t = min(e["t"] for e in new.events("first_step"))
        saves = [e["save_s"] for e in old.events("stopped") if e.get("save_s") is not None]
        loads = [e["load_s"] for e in new.events("restored")]
        return {
            "restart_s": first_t - sigterm_t,
            "save_s": max(saves),
            "load_s": max(loads),
            "checkpoint_bytes": float(
                max(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
            ),
        }
    finally:
        old.close()
        if new is not None:
            new.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                new.proc.wait(timeout=60)
            new.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="where to write the JSON results")
    p.add_argument("--pairs", type=int, default=20, help="interleaved DDP/coadapt pairs (>= 5)")
    p.add_argument("--steps", type=int, default=60, help="steps per segment")
    p.add_argument("--restart-repeats", type=int, default=1)
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-restart", action="store_true")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="also run plain DDP against plain DDP (A/A) and report its 'overhead' as the "
        "noise floor of this host",
    )
    p.add_argument(
        "--framework",
        choices=["ours", "hf", "lightning"],
        default="ours",
        help="what coadapt is measured against: plain DDP beside our own loop (ours, and "
        "restarts), the plain transformers.Trainer beside CoadaptTrainer (hf), or Lightning "
        "alone beside Lightning under coadapt (lightning); hf and lightning: throughput only",
    )
    # worker modes (the driver starts these under torchrun / coadapt-launch)
    p.add_argument("--worker", choices=["throughput", "throughput-hf", "train", "lightning"])
    p.add_argument("--variant", choices=["alone", "coadapt"], default="coadapt")
    p.add_argument("--result", default=None)
    p.add_argument("--log-dir", default=None)
    p.add_argument("--step-delay-s", type=float, default=0.0)
    args = p.parse_args(argv)

    if args.worker == "throughput":
        worker_throughput(args)
        return 0
    if args.worker == "throughput-hf":
        worker_throughput_hf(args)
        return 0
    if args.worker == "train":
        worker_train(args)
        return 0
    if args.worker == "lightning":
        worker_lightning(args)
        return 0
    if not args.out:
        p.error("--out is required")
    if args.framework == "hf":
        return _main_framework(args)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="coadapt-bench-") as tmp:
        workdir = Path(tmp)
        if args.framework == "lightning":
            results.update(run_lightning(args, workdir))
            args.skip_throughput = args.skip_restart = True
            args.calibrate = False
        if not args.skip_throughput:
            results.update(measure_throughput(args, workdir))
        if args.calibrate:
            aa = measure_throughput(args, workdir, calibrate=True)
            results["calibration_overhead_frac"] = aa["overhead_frac"]
            results["calibration_overhead_spread"] = aa["overhead_spread"]
        if not args.skip_restart:
            runs: dict[int, list[dict[str, float]]] = {1: [], 3: []}
            for _ in range(args.restart_repeats):
                for size in (1, 3):
                    runs[size].append(measure_restart(workdir, size, 0.0))
            r1 = statistics.median(r["restart_s"] for r in runs[1])
            r3 = statistics.median(r["restart_s"] for r in runs[3])
            all_runs = runs[1] + runs[3]
            results.update(
                {
                    "restart_s": max(r1, r3),
                    "restart_2to1_s": r1,
                    "restart_2to3_s": r3,
                    "save_s": statistics.median(r["save_s"] for r in all_runs),
                    "load_s": statistics.median(r["load_s"] for r in all_runs),
                    "checkpoint_bytes": statistics.median(r["checkpoint_bytes"] for r in all_runs),
                    "restart_runs": {str(k): v for k, v in runs.items()},
                }
            )
    results["host_cpus"] = os.cpu_count()
    with contextlib.suppress(OSError):
        results["host_load_avg_1m"] = os.getloadavg()[0]
    from coadapt_common.atomic import write_json_atomic

    write_json_atomic(args.out, results, indent=2)
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


FRAMEWORK_THROUGHPUT = {"hf": measure_throughput_hf}
"""Throughput measurement per ``--framework`` (other than ``ours``)."""


def _main_framework(args: argparse.Namespace) -> int:
    """``--framework`` other than ``ours``: the throughput figures (and with ``--calibrate``
    the A/A ones) of that framework alone against it under coadapt."""
    measure = FRAMEWORK_THROUGHPUT[args.framework]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="coadapt-bench-") as tmp:
        workdir = Path(tmp)
        results.update(measure(args, workdir))
        if args.calibrate:
            aa = measure(args, workdir, calibrate=True)
            results["calibration_overhead_frac"] = aa["overhead_frac"]
            results["calibration_overhead_spread"] = aa["overhead_spread"]
            results["calibration_overhead_pairs"] = aa["overhead_pairs"]
            results["calibration_overhead_cpu_frac"] = aa["overhead_cpu_frac"]
            results["calibration_overhead_cpu_spread"] = aa["overhead_cpu_spread"]
    results["host_cpus"] = os.cpu_count()
    with contextlib.suppress(OSError):
        results["host_load_avg_1m"] = os.getloadavg()[0]
    from coadapt_common.atomic import write_json_atomic

    write_json_atomic(args.out, results, indent=2)
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
