"""A small, hand-checkable run for the report tests: two spot offerings and one on-demand, a
preemption, a short instance billed the minimum, three finished jobs and one still running."""

from __future__ import annotations

import pytest

from autoscaler.accounting.costs import CostLedger, CostRecord

SPOT_A = "aws/g4dn.12xlarge/us-east-1a/spot"
SPOT_B = "aws/g4dn.12xlarge/us-east-1b/spot"
ON_DEMAND = "aws/g4dn.12xlarge/us-east-1a/on-demand"


def _launch(
    ledger: CostLedger, iid: str, key: str, t_s: float, usd_per_hour: float, ondemand: float
) -> None:
    market = key.rsplit("/", 1)[1]
    ledger.launch(
        iid,
        offering_key=key,
        provider="aws",
        instance_type="g4dn.12xlarge",
        gpu_type="T4",
        gpus=4,
        zone=key.split("/")[2],
        market=market,
        t_s=t_s,
        usd_per_hour=usd_per_hour,
        ondemand_usd_per_hour=ondemand,
    )


def build_record(scale: float = 1.0) -> CostRecord:
    """The run; ``scale`` multiplies every price (a second, different run for list inputs)."""
    ledger = CostLedger()
    _launch(ledger, "a1", SPOT_A, 0.0, 1.20 * scale, 3.60)
    _launch(ledger, "b1", SPOT_B, 0.0, 1.50 * scale, 3.60)
    for job in ("train-1", "train-2", "train-3", "train-4"):
        ledger.job_event(job, 0.0, "submitted")
    ledger.job_usage("train-1", "a1", 120.0, 1800.0, 4)
    ledger.job_usage("train-2", "b1", 120.0, 1500.0, 2)
    ledger.job_event("train-2", 1500.0, "preemption")
    ledger.end("b1", 1500.0, "preempted")
    ledger.price_change("a1", 1800.0, 1.32 * scale)
    _launch(ledger, "od1", ON_DEMAND, 1560.0, 3.60 * scale, 3.60)
    ledger.job_event("train-2", 1680.0, "restart")
    ledger.job_usage("train-2", "od1", 1680.0, 3000.0, 2)
    ledger.job_event("train-2", 3000.0, "finished")
    ledger.job_work("train-2", 40_000)
    ledger.job_usage("train-1", "a1", 1800.0, 2400.0, 4)
    ledger.job_event("train-1", 2400.0, "finished")
    ledger.job_work("train-1", 64_000)
    ledger.job_usage("train-3", "od1", 1680.0, 2200.0, 2)
    ledger.job_event("train-3", 2200.0, "finished")
    ledger.job_work("train-3", 9_000)
    ledger.job_usage("train-4", "a1", 2400.0, 3600.0, 1)
    _launch(ledger, "b2", SPOT_B, 2000.0, 1.50 * scale, 3.60)
    ledger.end("b2", 2020.0, "released")  # 20 s: billed the 60 s minimum
    return ledger.close(3600.0)


@pytest.fixture
def record() -> CostRecord:
    return build_record()
