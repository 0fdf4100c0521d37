"""The global sample order and batch plan: exact, world-size independent (property tests)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.data import epoch_order, is_measure_step, plan_epoch, plan_step, split_even
from trainer.errors import TrainerConfigError
from trainer.report import BatchConfig


@given(st.integers(0, 500), st.integers(0, 2**31), st.integers(0, 50))
def test_epoch_order_is_a_deterministic_permutation(n: int, seed: int, epoch: int) -> None:
    order = epoch_order(n, seed, epoch)
    assert sorted(order.tolist()) == list(range(n))
    assert np.array_equal(order, epoch_order(n, seed, epoch))
    assert np.array_equal(epoch_order(n, seed, epoch, shuffle=False), np.arange(n))


def test_epochs_are_shuffled_differently() -> None:
    assert not np.array_equal(epoch_order(100, 0, 0), epoch_order(100, 0, 1))


@given(st.integers(0, 1000), st.integers(1, 64))
def test_split_even(total: int, parts: int) -> None:
    sizes = split_even(total, parts)
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes)[::-1]


segments = st.lists(
    st.tuples(st.integers(1, 5), st.integers(1, 4), st.integers(1, 40), st.integers(1, 12)),
    min_size=1,
    max_size=5,
)  # (world size, accumulation steps, global batch size, steps before the next restart)


@given(st.integers(1, 300), st.integers(0, 5), segments)
def test_restarts_at_any_world_size_see_each_sample_once_in_global_order(
    n: int, gns_every: int, plan: list[tuple[int, int, int, int]]
) -> None:
    """Simulate a run that restarts (new world size, accumulation, batch size) after some
    steps, resuming at the saved (epoch, position, step): every epoch is an exact cover, each
    step's global batch is the next chunk of the epoch order, and each real sample's gradient
    weight is exactly 1 / B_step after DDP's average over the replicas."""
    seed, epoch, position, step = 11, 0, 0, 0
    seen: dict[int, list[int]] = defaultdict(list)
    for world, accum, size, steps in plan:
        batch = BatchConfig(size, accum)
        for _ in range(steps):
            if position >= n:
                epoch, position = epoch + 1, 0
            order = epoch_order(n, seed, epoch)
            ids = order[position : position + size]
            per_rank = [
                plan_step(ids, epoch=epoch, step=step, batch=batch, world_size=world, rank=r,
                          gns_every_steps=gns_every)
                for r in range(world)
            ]  # fmt: skip
            got: list[int] = []
            for micro in per_rank:
                assert len({m.measure for m in micro}) == 1
                assert micro[-1].is_last and all(not m.is_last for m in micro[:-1])
                for m in micro:
                    assert m.step_samples == len(ids)
                    if m.padding:
                        assert m.weight == 0 and len(m.counted_ids) == 0
                        continue
                    # output-gradient weight / micro size / W == 1 / B_step for every sample
                    assert m.weight / len(m.sample_ids) / world == pytest.approx(1 / len(ids))
                    got.extend(m.counted_ids.tolist())
            assert len({micro[0].measure for micro in per_rank}) == 1
            if per_rank[0][0].measure:
                for micro in per_rank:
                    m = micro[0]
                    assert 0 < m.small_batch_samples < m.step_samples
                    if world == 1:
                        assert m.count >= 2
            assert sorted(got) == sorted(ids.tolist())
            seen[epoch].extend(got)
            position += len(ids)
            step += 1
    for e, ids in seen.items():
        assert len(ids) == len(set(ids))
        if e < epoch or position >= n:
            assert sorted(ids) == list(range(n))


def test_plan_epoch_resumes_mid_epoch_with_another_world_size() -> None:
    order = epoch_order(50, 1, 0)
    batch = BatchConfig(8, 2)
    full = [
        m.counted_ids.tolist()
        for r in range(2)
        for m in plan_epoch(order, epoch=0, position=0, first_step=0, batch=batch,
                            world_size=2, rank=r, gns_every_steps=0)
        if m.step < 3
    ]  # fmt: skip
    resumed = [
        m
        for r in range(3)
        for m in plan_epoch(order, epoch=0, position=24, first_step=3, batch=batch,
                            world_size=3, rank=r, gns_every_steps=0)
    ]  # fmt: skip
    assert resumed[0].step == 3
    done = sorted(i for ids in full for i in ids)
    rest = sorted(i for m in resumed for i in m.counted_ids.tolist())
    assert sorted(done + rest) == list(range(50)) and not set(done) & set(rest)


def test_tail_smaller_than_world_size_pads_with_zero_weight() -> None:
    ids = np.array([7, 9])
    micro = [
        plan_step(ids, epoch=0, step=5, batch=BatchConfig(16), world_size=4, rank=r,
                  gns_every_steps=1)[0]
        for r in range(4)
    ]  # fmt: skip
    assert [m.padding for m in micro] == [False, False, True, True]
    assert [m.weight for m in micro] == [2.0, 2.0, 0.0, 0.0]
    assert not any(m.measure for m in micro)  # not every replica has a sample


def test_one_replica_measurement_splits_the_batch_in_two() -> None:
    micro = plan_step(np.arange(10), epoch=0, step=4, batch=BatchConfig(10), world_size=1,
                      rank=0, gns_every_steps=4)  # fmt: skip
    assert [len(m.sample_ids) for m in micro] == [5, 5] and micro[0].measure
    assert [m.weight for m in micro] == [0.5, 0.5]
    assert not is_measure_step(5, 10, 1, 4) and is_measure_step(8, 10, 3, 4)


def test_invalid_plans_are_rejected() -> None:
    with pytest.raises(TrainerConfigError):
        list(plan_epoch(np.arange(5), epoch=0, position=6, first_step=0, batch=BatchConfig(2),
                        world_size=1, rank=0, gns_every_steps=0))  # fmt: skip
    with pytest.raises(TrainerConfigError):
        split_even(3, 0)
