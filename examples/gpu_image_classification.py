"""Elastic ResNet-18 on CIFAR-10 with coadapt, for GPU nodes (NCCL). Documented, not run in CI.

Needs ``torchvision`` (not a coadapt dependency) and the CIFAR-10 data: pass ``--download`` once
on a machine with internet access, or point ``--data`` at an existing copy. Launch one
``coadapt-launch`` per node (the controller's agent does this for you)::

    coadapt-launch --job-id cifar --nproc-per-node 8 --nnodes 1:4 \\
        --rdzv-endpoint HEAD:29400 --checkpoint-uri s3://BUCKET/cifar \\
        --preload-module torchvision \\
        examples/gpu_image_classification.py --data /data/cifar10 --epochs 90

What it shows beyond ``elastic_mlp.py``:

* NCCL is picked automatically when CUDA is available; the model lives on ``job.device``.
* bf16 autocast (no ``GradScaler`` needed; with fp16 and a ``GradScaler``, call
  ``scaler.step(optimizer)`` only when ``job.at_step_boundary`` is true, since the scaler would
  otherwise unscale accumulated gradients at every micro-batch).
* The learning-rate schedule follows ``job.progress`` (initial-batch-size iterations), so it
  stays right when coadapt changes the batch size: AdaScale stretches it by the gain.
* Evaluation uses ``model.module`` (no DDP collectives) and an ordinary ``DataLoader``.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

import trainer


def build_data(root: str, download: bool):
    try:
        import torchvision
        import torchvision.transforms as T
    except ImportError as e:  # pragma: no cover - optional dependency
        raise SystemExit("this example needs torchvision: pip install torchvision") from e
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    train = torchvision.datasets.CIFAR10(
        root,
        train=True,
        download=download,
        transform=T.Compose(
            [
                T.RandomCrop(32, padding=4),
                T.RandomHorizontalFlip(),
                T.ToTensor(),
                T.Normalize(mean, std),
            ]
        ),
    )
    test = torchvision.datasets.CIFAR10(
        root,
        train=False,
        download=download,
        transform=T.Compose([T.ToTensor(), T.Normalize(mean, std)]),
    )
    return train, test


def build_model() -> torch.nn.Module:
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    # CIFAR-sized inputs: a 3x3 stem and no max-pool.
    model.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = torch.nn.Identity()
    return model.to(memory_format=torch.channels_last)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data, device: torch.device) -> float:
    model.eval()
    loader = torch.utils.data.DataLoader(data, batch_size=1024, num_workers=4, pin_memory=True)
    correct = total = 0
    for x, y in loader:
        x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            correct += (model(x).argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return correct / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="./data/cifar10")
    p.add_argument("--download", action="store_true")
    p.add_argument("--epochs", type=int, default=90)
    p.add_argument("--initial-batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--workers", type=int, default=4)
    args = p.parse_args()

    job = trainer.init(
        args.initial_batch_size,
        max_batch_size=4096,
        min_local_batch_size=32,
        max_local_batch_size=512,
    )
    train_set, test_set = build_data(args.data, args.download)
    model = build_model()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4, nesterov=True
    )
    # Cosine schedule over the run's length in initial-batch-size iterations.
    total_progress = args.epochs * len(train_set) / args.initial_batch_size
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _: 0.5 * (1 + math.cos(math.pi * min(1.0, job.progress / total_progress)))
    )
    ddp, optimizer = job.prepare(model, optimizer, lr_scheduler=scheduler)
    loader = job.data_loader(train_set, num_workers=args.workers, pin_memory=True)
    job.restore()

    device = job.device
    for epoch in job.epochs(args.epochs):
        start = time.monotonic()
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        if job.rank == 0:
            stats = job.gradient_stats
            print(
                f"epoch {epoch}: {time.monotonic() - start:.1f} s, batch {job.batch}, "
                f"progress {job.progress:.0f}, noise scale "
                f"{stats.noise_scale if stats else float('nan'):.0f}, "
                f"test accuracy {evaluate(model, test_set, device):.4f}",
                flush=True,
            )
    job.finish()
    job.close()


if __name__ == "__main__":
    main()
