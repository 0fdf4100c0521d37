"""A batch change that comes as production's does, in the reply to a trainer report, lands
within one step of the reply, mid-epoch, with exact resumption afterwards (issue 42, item 3).

Our own loop (``examples/elastic_mlp.py``) under the real launcher, ``torchrun`` and gloo, two
processes, the default ``control_interval_s`` (0.5 s, about 10 steps between the ranks'
exchanges at this step time), reporting over HTTP to a local controller stand-in whose reply
carries the new configuration once training has passed a given step. Then SIGTERM to the
launcher (an agreed stop with a checkpoint) and a one-process relaunch that finishes the epoch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.trainer.harness import (
    EXAMPLE,
    Cluster,
    ReportServer,
    iter_micro_records,
    read_jsonl,
    serving,
    wait_until,
)
from trainer.data import epoch_order
from trainer.launch import ExitCode
from trainer.report import BatchConfig, ReportReply, TrainerReport

pytestmark = pytest.mark.slow

LAUNCH_TIMEOUT_S = 120
OLD, NEW = BatchConfig(20, 1), BatchConfig(40, 2)
REPLY_FROM_STEP = 12  # the first report built at or after this step is answered with NEW


class _Controller(ReportServer):
    """Answers reports as the controller does (its planned batch in every reply): nothing
    until a report from step ``REPLY_FROM_STEP`` on, then ``NEW``."""

    def __init__(self) -> None:
        self.batch_from_report: int | None = None  # index in ``reports`` of the first NEW reply
        super().__init__(self._answer)

    def _answer(self, report: TrainerReport, index: int) -> ReportReply:
        if self.batch_from_report is None and report.step >= REPLY_FROM_STEP:
            self.batch_from_report = index
        return ReportReply(batch=NEW if self.batch_from_report is not None else None)


@pytest.fixture
def controller() -> Iterator[_Controller]:
    with serving(_Controller()) as server:
        yield server


def test_batch_from_a_report_reply_lands_within_one_step_and_resumes_exactly(
    cluster: Cluster, tmp_path: Path, controller: _Controller
) -> None:
    n, seed = 2000, 5  # 100 steps of 20 per epoch: the change and the stop are mid-epoch 0
    # control_interval_s: the default (0.5 s)
    logs, ckpt = tmp_path / "logs", tmp_path / "ckpt"
    script = [
        str(EXAMPLE), "--epochs", "1", "--no-declare", "--num-samples", str(n), "--dim", "8",
        "--hidden", "16", "--initial-batch-size", str(OLD.global_batch_size),
        "--optimizer", "sgd", "--lr", "0.01", "--seed", str(seed), "--log-dir", str(logs),
        "--step-delay-s", "0.05", "--quiet",
    ]  # fmt: skip
    common = ["--job-id", "timing", "--checkpoint-uri", str(ckpt)]
    first = cluster.launch(
        "two",
        [*common, "--nproc-per-node", "2", "--controller-url", controller.url,
         "--report-interval-s", "0.4", *script],
    )  # fmt: skip

    def changes() -> list[dict]:
        return [r for r in read_jsonl(logs) if r.get("event") == "batch_change"]

    wait_until(lambda: len(changes()) == 2, LAUNCH_TIMEOUT_S, "the batch change", first)
    first_new = changes()[0]["first_step"]
    wait_until(
        lambda: max((r["step"] for r in iter_micro_records(logs)), default=-1) >= first_new + 4,
        LAUNCH_TIMEOUT_S, "4 steps at the new batch", first,
    )  # fmt: skip
    first.terminate()
    assert first.wait(60) == ExitCode.STOPPED, first.text()[-3000:]

    # (a) Rank 0 learned NEW from a reply at step r (the step in progress); both ranks ran the
    # same first step at NEW, a, mid-epoch; a <= r + 2: after the step in progress, at most one
    # more step starts at the old configuration (the ranks read rank 0's offer one exchange
    # after it is posted), whatever the exchange period.
    events = [r for r in read_jsonl(logs) if "event" in r]
    change_events = [e for e in events if e["event"] == "batch_change"]
    assert len(change_events) == 2, change_events  # one per rank, no other change
    assert {(e["batch"], e["accum"]) for e in change_events} == {(40, 2)}
    adopted = {e["first_step"] for e in change_events}
    assert len(adopted) == 1, change_events  # the ranks agree on the step
    a = adopted.pop()
    # rank 0 learned it from the reply; rank 1 did not (it learns it at the agreement)
    by_rank = {e["rank"]: e for e in change_events}
    assert sorted(by_rank) == [0, 1] and by_rank[1]["requested_at_step"] is None, change_events
    r = by_rank[0]["requested_at_step"]
    assert controller.batch_from_report is not None
    assert r >= controller.reports[controller.batch_from_report].step >= REPLY_FROM_STEP
    assert r < a <= r + 2, (r, a)
    assert {e["epoch"] for e in change_events} == {0}
    assert {e["position"] for e in change_events} == {a * OLD.global_batch_size}
    assert 0 < a * OLD.global_batch_size < n  # mid-epoch

    micro = list(iter_micro_records(logs))
    assert {r_["world_size"] for r_ in micro} == {2}
    for rec in micro:
        expected = OLD if rec["step"] < a else NEW
        assert (rec["batch"], rec["accum"]) == (expected.global_batch_size, expected.accum_steps)

    # (b) A one-process relaunch (no batch given: the checkpoint's NEW) resumes at the exact
    # sample, the position counted in samples, and finishes the epoch.
    stop_step = max(rec["step"] for rec in micro)
    assert stop_step >= a + 4
    position = a * OLD.global_batch_size + (stop_step + 1 - a) * NEW.global_batch_size
    second = cluster.launch("one", [*common, "--nproc-per-node", "1", *script])
    assert second.wait(LAUNCH_TIMEOUT_S) == ExitCode.DONE, second.text()[-3000:]
    restored = [e for e in read_jsonl(logs) if e.get("event") == "restored"]
    assert [(e["step"], e["epoch"], e["position"]) for e in restored] == [
        (stop_step + 1, 0, position)
    ]

    # Every sample of the epoch exactly once across the change and the restart; each step's
    # global batch is the next chunk of the epoch's order at that step's own size.
    by_step: dict[int, list[int]] = defaultdict(list)
    sizes: dict[int, set[int]] = defaultdict(set)
    world_sizes = set()
    for rec in iter_micro_records(logs):
        assert rec["epoch"] == 0
        by_step[rec["step"]].extend(rec["ids"])
        sizes[rec["step"]].add(rec["batch"])
        world_sizes.add(rec["world_size"])
    assert world_sizes == {1, 2}
    order = epoch_order(n, seed, 0)
    assert sorted(i for ids in by_step.values() for i in ids) == list(range(n))
    assert sorted(by_step) == list(range(len(by_step)))
    cursor = 0
    for step in sorted(by_step):
        (size,) = sizes[step]
        assert size == (OLD if step < a else NEW).global_batch_size
        assert sorted(by_step[step]) == sorted(order[cursor : cursor + size].tolist()), step
        cursor += len(by_step[step])
    assert cursor == n
