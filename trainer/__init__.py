"""coadapt's in-job library: what a user's PyTorch training script imports.

Needs torch, never a cloud SDK. ``import trainer`` itself is cheap and torch-free: the torch-using
entry points (``trainer.init``, ``trainer.ElasticJob``, ``trainer.JobStopped``) load on first use,
and the modules shared with the controller (``trainer.report``, ``trainer.env``,
``trainer.errors``) never import torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ElasticJob", "JobOptions", "JobStopped", "init"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from trainer import api

        return getattr(api, name)
    raise AttributeError(f"module 'trainer' has no attribute {name!r}")
