"""One rule, one place (issue 36): restarts and preemptions are each decided once, and the
bill, the events, the policy's view and the simulator's results read that one decision.

Over a store produced by a real run -- the product's controller driven by the simulator's world
(a fake cloud whose spot instances are preempted with a notice), its event recorder observing
every round as ``coadapt up`` does -- every job's restarts are the same number in the store
(:meth:`Store.restart_counts`, the policy's ``num_restarts``), the bill (its ``restart``
events), the simulator's results and its own bill; the events (its ``rescale`` and
``resume``) tell each of them and the one change the store's definition does not count
(:func:`_shrinks`); and every instance's preemption is the one the round recorded
(``preempted_at``), in the bill and in the events alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoscaler.accounting.billing import cost_record_from_store
from autoscaler.controller.events import EventKind, EventRecorder
from autoscaler.controller.lifecycle import preempted_at
from autoscaler.controller.store import AssignmentSpan, Store, placement_instants
from autoscaler.decide.policy import make_policy
from autoscaler.decide.sizing import SizingConfig
from autoscaler.decide.strategies import GoodputSizing
from autoscaler.market.series import ConstantPrice
from autoscaler.market.terms import OfferingRef
from autoscaler.sim.cloud_config import CloudConfig, CloudOffering
from autoscaler.sim.config import SimConfig
from autoscaler.sim.engine import Simulator
from autoscaler.sim.workload import TraceJob
from coadapt_common.clock import FakeClock

SPOT = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "spot")
ON_DEMAND = OfferingRef("aws", "g4dn.12xlarge", "use1-az1", "on-demand")


@dataclass(frozen=True)
class OddOnesPreempted:
    """Every instance with an odd number is preempted ``after_s`` after its launch."""

    after_s: float

    def preemption_time_s(self, instance_id: str, launched_at_s: float) -> float | None:
        return launched_at_s + self.after_s if int(instance_id[-1]) % 2 == 1 else None

    def capacity_at(self, t_s: float) -> int | None:
        return None

    def capacity_changes(self, t0_s: float, t1_s: float) -> list[tuple[float, int]]:
        return []


def _shrinks(spans: Sequence[AssignmentSpan]) -> int:
    """The changes of a job's placement that opened no span: it left some instances and kept
    the others with the same GPUs. The agent restarts the job then (its set of nodes changed),
    and the events tell it as a ``rescale``, but the store's definition (a placement is an
    instant a span opened) does not count it: the one gap left between the events and the
    store (counting it moves pollux's decisions: see the report of issue 36's rules)."""
    count = 0
    for t in sorted({s.to_s for s in spans if s.to_s is not None}):
        opened = any(s.from_s == t for s in spans)
        kept = any(s.from_s < t and (s.to_s is None or s.to_s > t) for s in spans)
        count += not opened and kept
    return count


def test_the_bill_the_events_and_the_policy_agree_on_every_jobs_restarts_and_preemptions() -> None:
    offerings = (
        CloudOffering(
            SPOT,
            "T4",
            4,
            ConstantPrice(1.2),
            ondemand_usd_per_hour=3.912,
            preemption=OddOnesPreempted(900.0),
            hazard_per_hour=0.2,
        ),
        CloudOffering(ON_DEMAND, "T4", 4, ConstantPrice(3.912), ondemand_usd_per_hour=3.912),
    )
    jobs = (
        *(TraceJob(f"cifar10-{i}", "cifar10", 200.0 * i, 4, 512) for i in range(3)),
        TraceJob("ncf-0", "ncf", 100.0, 1, 256),
    )
    cloud = CloudConfig(offerings, GoodputSizing("coadapt", SizingConfig(max_instances=4)))
    sim = Simulator(jobs, make_policy("coadapt"), SimConfig(cloud=cloud))
    world = sim.world
    recorder = EventRecorder(world.store, world.clock)
    seen_by_policy: dict[str, int] = {}
    names = [job.name for job in jobs]
    end: dict[str, Any] = {}

    def each_round(now_s: float, done: int, total: int) -> None:
        recorder.observe()  # as coadapt up does after each round
        for view in world.controller.job_views(world.clock.now_s()):
            seen_by_policy[view.name] = view.num_restarts
        if done == total:  # the last round: what the store holds at the end of the run
            store = world.store
            end["restarts"] = store.restart_counts(names)
            end["instants"] = placement_instants(store.assignment_history())
            end["bill"] = cost_record_from_store(store, world.clock.now_s())
            end["events"] = store.events_after(0)
            end["shrinks"] = {name: _shrinks(store.assignment_history(name)) for name in names}
            end["preempted"] = {
                r.instance_key: at
                for r in store.list_instances()
                if (at := preempted_at(store.history(r.instance_key))) is not None
            }

    sim.on_round = each_round
    result = sim.run()
    assert result.cost is not None
    restarts, events = end["restarts"], end["events"]
    bill = {j.job_id: j for j in end["bill"].jobs}
    sim_bill = {j.job_id: j for j in result.cost.jobs}
    sim_results = {j.name: j.restarts for j in result.jobs}
    told = Counter(e.subject for e in events if e.kind in ("move", "rescale", "resume"))
    assert sum(restarts.values()) >= len(jobs), "the run rescaled its jobs"
    for name in names:
        want = restarts[name]
        assert len(end["instants"][name]) - 1 == want, name
        assert seen_by_policy[name] == want, name
        # The events tell every restart the store counts, and one change it does not.
        assert told[name] == want + end["shrinks"][name], name
        assert bill[name].restarts == want, name
        assert sim_results[name] == want, name
        assert sim_bill[name].restarts == want, name
        assert bill[name].preemptions == sim_bill[name].preemptions, name
    # Preemptions: the round's typed record, read alike by the bill and the events.
    preempted = end["preempted"]
    assert len(preempted) >= 2, "the run saw preemptions"
    ended = {i.instance_id for i in end["bill"].instances if i.end_reason == "preempted"}
    assert ended == set(preempted)
    assert {e.subject for e in events if e.kind == EventKind.PREEMPTION} == set(preempted)
    noticed = {e.subject: e.at_s for e in events if e.kind == EventKind.NOTICE}
    assert noticed == preempted  # each preempted with a notice, at the notice's time
    assert sum(j.preemptions for j in bill.values()) >= 1


def test_one_count_of_restarts_read_by_the_store_the_bill_and_the_events(tmp_path: Path) -> None:
    """The one definition, at the store: a job is placed again (a restart) when a change of
    its assignment opens a span, or when its agent relaunched it; the placement instants
    (what the bill's ``restart`` events are) count the same; the events tell each restart, a
    relaunch as a ``resume``. A change that leaves some instances and keeps the others with the
    same GPUs opens no span: the store counts no restart, the events tell a ``rescale``."""
    clock = FakeClock()
    store = Store.create(tmp_path / "store.db", "c1", clock)
    store.add_job("j", "{}")
    for key in ("a", "b", "c"):
        store.add_instance(
            instance_key=key,
            request_id=f"c1-{key}",
            offering_key="fake/z/t/spot",
            provider="fake",
            instance_type="t",
            zone="z",
            market="spot",
            gpu_type="T4",
            gpus=4,
            price_usd_per_hour=1.0,
        )
    recorder = EventRecorder(store, clock)
    steps: list[tuple[dict[str, int] | None, int, list[EventKind]]] = [
        ({"a": 4}, 0, [EventKind.START]),
        ({"a": 4, "b": 4}, 1, [EventKind.RESCALE]),  # grows onto b: a span opens
        ({"a": 4, "b": 4}, 1, []),  # unchanged
        ({"a": 2, "b": 4}, 2, [EventKind.RESCALE]),  # fewer GPUs on a: its span reopens
        (None, 3, [EventKind.RESUME]),  # its agent relaunched it on a
        ({"b": 4}, 3, [EventKind.RESCALE]),  # leaves a, keeps b: no span opens
        ({"c": 4}, 4, [EventKind.MOVE]),  # other instance, the same 4 GPUs
    ]
    for placement, restarts, kinds in steps:
        if placement is None:
            assert store.record_relaunch("j", "a")
        else:
            store.set_assignments("j", placement)
        clock.advance(60.0)
        told = recorder.observe()
        assert store.restart_counts(["j"]) == ({"j": restarts})
        assert len(placement_instants(store.assignment_history("j"))["j"]) - 1 == restarts
        assert [e.kind for e in told if e.subject == "j"] == kinds
        if placement is None:  # no report names a checkpoint: none is claimed
            (relaunch,) = (e for e in told if e.subject == "j")
            assert "it resumes (it has not reported yet" in relaunch.message, relaunch
    assert _shrinks(store.assignment_history("j")) == 1
    store.close()
