"""The per-job fleet strategies (``cheapest-spot``, ``uniform-progress``) hold their decisions:
after a capacity error the target settles in the next round and stays, also when the mark
expires; instances held of an offering marked unavailable stay usable (the rule
:func:`~autoscaler.decide.sizing.size_fleet` sizes by, :meth:`FleetOption.may_hold`); a job
keeps the offering its GPUs are on when the strategy has no memory of it (a restarted
controller).

The rounds are driven as the controller's round drives them
(:meth:`autoscaler.controller.loop.Controller.run_round`): one :class:`FleetView` a round with
``held`` counting the instances held per offering key (launched, ready or not) and an
offering ``available`` unless a capacity error marked it within ``unavailable_ttl_s`` (180 s,
three 60 s rounds); the cloud gives an offering's instances up to its capacity and answers
the launch above it with a capacity error."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pytest

from autoscaler.controller.jobbook import JobSubmission
from autoscaler.controller.lifecycle import InstanceStatus
from autoscaler.controller.loop import Controller, ControllerConfig
from autoscaler.controller.reconcile import ReconcileConfig
from autoscaler.controller.store import Store
from autoscaler.decide.fleet import FleetStrategy, FleetView
from autoscaler.decide.sizing import FleetOption
from autoscaler.decide.strategies import PerJobCheapest, UniformProgress
from autoscaler.decide.views import Allocation, ClusterView, JobView, NodeView, OfferingRef
from coadapt_common.clock import FakeClock
from providers.base import Market
from providers.fake import FakeProvider, default_offerings
from tests.decide.policy.conftest import view

SMALL_REF = OfferingRef("aws", "g4dn.xlarge", "use1-az1", "spot")
LARGE_REF = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
# 4 GPUs cost 4 x 0.1578 = 0.63 $/h on the small instances, 1.1736 $/h on one large one.
SMALL = FleetOption(SMALL_REF.key, "T4", 1, "spot", 0.1578, 0.05, ref=SMALL_REF)
LARGE = FleetOption(LARGE_REF.key, "T4", 4, "spot", 1.1736, 0.05, ref=LARGE_REF)
ROUND_S = 60.0
UNAVAILABLE_TTL_S = 180.0  # ControllerConfig.unavailable_ttl_s


def _jobs(count: int, gpus: int = 4) -> tuple[JobView, ...]:
    return tuple(view(f"job-{i}", submit=float(i), requested=gpus, nodes=0) for i in range(count))


def _rounds(
    strategy: FleetStrategy,
    jobs: tuple[JobView, ...],
    capacity: Mapping[str, int],
    rounds: int,
) -> list[dict[str, int]]:
    """The strategy's target each round on a cloud of ``capacity`` instances per offering."""
    held: dict[str, int] = {}
    marked_at: dict[str, float] = {}
    targets = []
    for r in range(rounds):
        now = r * ROUND_S
        options = tuple(
            FleetOption(
                o.key,
                o.gpu_type,
                o.gpus,
                o.market,
                o.usd_per_hour,
                o.hazard_per_hour,
                available=now - marked_at.get(o.key, -1e9) >= UNAVAILABLE_TTL_S,
                ref=o.ref,
            )
            for o in (SMALL, LARGE)
        )
        fleet = FleetView(now, jobs, ClusterView((), now, r), dict(held), options)
        target = {k: n for k, n in strategy.propose(fleet).items() if n}
        targets.append(target)
        for o in options:  # reconcile: release the surplus, launch the rest
            want = target.get(o.key, 0)
            have = held.get(o.key, 0)
            if want > have and o.available:
                got = min(want, capacity.get(o.key, want))
                if got < want:
                    marked_at[o.key] = now  # the capacity error's mark
                have = got
            held[o.key] = min(have, want)
    return targets


@pytest.mark.parametrize(
    "strategy", [PerJobCheapest("cheapest-spot"), UniformProgress("uniform-progress")]
)
def test_after_a_capacity_error_the_target_settles_within_two_rounds_and_stays(
    strategy: FleetStrategy,
) -> None:
    # Three 4-GPU jobs; the small instances' pool gives 6 of the 12 they are asked for.
    targets = _rounds(strategy, _jobs(3), {SMALL.key: 6}, rounds=12)
    assert targets[0] == {SMALL.key: 12}
    # The oldest job keeps 4 of the 6 small instances it got; the others go large, and
    # stay there when the mark expires (round 4 on): no 12 <-> 3 flip.
    settled = {SMALL.key: 4, LARGE.key: 2}
    assert targets[1:] == [settled] * 11, targets


def test_instances_held_of_an_offering_marked_unavailable_stay_usable() -> None:
    unavailable = FleetOption(SMALL.key, "T4", 1, "spot", 0.1578, available=False, ref=SMALL_REF)
    fleet = FleetView(0.0, _jobs(2), ClusterView((), 0.0, 1), {SMALL.key: 5}, (unavailable, LARGE))
    # The first job takes 4 of the 5 held; the second's 4 would be new: on the other offering.
    assert PerJobCheapest("c").propose(fleet) == {SMALL.key: 4, LARGE.key: 1}
    assert unavailable.may_hold(5, {SMALL.key: 5})
    assert not unavailable.may_hold(6, {SMALL.key: 5})
    assert LARGE.may_hold(6, {}) and not FleetOption(
        LARGE.key, "T4", 4, "spot", 1.1736, capacity=2, ref=LARGE_REF
    ).may_hold(3, {})


def test_a_running_job_keeps_its_offering_without_memory_of_it() -> None:
    # A job already running on a large instance (a restarted controller's strategy has no
    # memory): it stays there although the small ones are cheaper; a new job goes small.
    node = NodeView("i-large", "T4", 4, LARGE_REF)
    cluster = ClusterView((node,), 0.0, 1)
    running, new = _jobs(2)
    running = dataclasses.replace(running, allocation=Allocation({"i-large": 4}))
    fleet = FleetView(0.0, (running, new), cluster, {LARGE.key: 1}, (SMALL, LARGE))
    assert PerJobCheapest("c").propose(fleet) == {LARGE.key: 1, SMALL.key: 4}


class _Recorder:
    """The strategy the controller runs, with the target it proposed each round."""

    def __init__(self, inner: FleetStrategy) -> None:
        self.inner = inner
        self.targets: list[dict[str, int]] = []

    @property
    def name(self) -> str:
        return self.inner.name

    def propose(self, view: FleetView) -> Mapping[str, int]:
        out = self.inner.propose(view)
        self.targets.append({k: n for k, n in out.items() if n})
        return out


def test_the_controllers_round_settles_after_a_capacity_error(tmp_path: Path) -> None:
    """The same through the controller's own round (store, reconcile, the fake cloud and the
    unavailable-offerings memory they share), as the simulator and a live cluster run it."""
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "flip1", clock)
    for i in range(3):
        spec = JobSubmission(
            f"job-{i}",
            128,
            1024,
            128,
            32,
            application="cifar10",
            requested_gpus=4,
            command=("train.py",),
        )
        store.add_job(spec.name, spec.to_json())
        clock.advance(1.0)
    cfg = ControllerConfig(
        "flip1", policy="tiresias", reconcile=ReconcileConfig(heartbeat_timeout_s=None)
    )
    unavailable = cfg.unavailable_offerings(clock)
    offerings = [
        o
        for o in default_offerings()
        if o.instance_type in ("g4dn.xlarge", "g4dn.12xlarge")
        and o.market is Market.SPOT
        and o.zone == default_offerings()[0].zone
    ]
    small = next(o.key for o in offerings if o.instance_type == "g4dn.xlarge")
    cloud = FakeProvider(offerings, {small: 6}, clock=clock, unavailable=unavailable)
    strategy = _Recorder(PerJobCheapest("cheapest-spot"))
    ctl = Controller(store, cloud, clock, cfg, strategy=strategy, unavailable=unavailable)
    for _ in range(12):  # 12 min: the capacity error's 3 min mark expires
        ctl.run_round()
        clock.advance(cfg.interval_s)
    # The 12 launches go out over two rounds (the reconcile's launch rate); the second round's
    # hit the capacity error. From the next round on the target holds, also after the mark
    # expires (round 6 on).
    failed = [r for r in store.list_instances() if r.status is InstanceStatus.ALLOCATION_FAILED]
    assert failed and {r.offering_key for r in failed} == {small}
    large = next(o.key for o in offerings if o.instance_type == "g4dn.12xlarge")
    assert strategy.targets[:2] == [{small: 12}] * 2
    assert strategy.targets[2:] == [{small: 4, large: 2}] * 10, strategy.targets
