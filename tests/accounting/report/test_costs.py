"""The cost ledger: arithmetic to the cent, attribution, validation and the JSON round trip.

Expected amounts are computed by hand as exact fractions (price x seconds / 3600), then rounded
to the cent with the documented rule and compared with the ledger's float sums rounded the same
way.
"""

from __future__ import annotations

import itertools
import json
import math
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.accounting.costs import (
    TIME_TOLERANCE_S,
    CostLedger,
    CostRecord,
    cumulative_cost_by_offering,
    fleet_series,
    idle_cost_usd,
    instance_cost_usd,
    job_costs,
    offering_costs,
    record_from_json,
    record_to_json,
    summarize,
    total_cost_usd,
    usd_to_cents,
)
from autoscaler.errors import AutoscalerError, InvalidInputError

SPOT_KEY = "aws/g4dn.12xlarge/us-east-1a/spot"
OD_KEY = "aws/g4dn.12xlarge/us-east-1a/on-demand"


def launch(
    ledger: CostLedger,
    iid: str,
    t_s: float,
    usd_per_hour: float,
    *,
    gpus: int = 4,
    market: str = "spot",
    key: str | None = None,
    ondemand: float | None = None,
    min_billed_s: float = 60.0,
) -> None:
    ledger.launch(
        iid,
        offering_key=key or (SPOT_KEY if market == "spot" else OD_KEY),
        provider="aws",
        instance_type="g4dn.12xlarge",
        gpu_type="T4",
        gpus=gpus,
        zone="us-east-1a",
        market=market,
        t_s=t_s,
        usd_per_hour=usd_per_hour,
        min_billed_s=min_billed_s,
        ondemand_usd_per_hour=ondemand,
    )


def usd(cents_per_hour: int, seconds: float) -> Fraction:
    """Exact USD of a price (in cents per hour, so that it is exact) over ``seconds``."""
    return Fraction(cents_per_hour, 100) * Fraction(seconds) / 3600


def cents(amount: Fraction) -> Decimal:
    """An exact amount rounded to the cent, half up (the documented rule)."""
    exact = Decimal(amount.numerator) / Decimal(amount.denominator)
    return exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)


# ---- rounding -------------------------------------------------------------------------------


def test_rounding_is_half_up_after_dropping_float_noise() -> None:
    assert usd_to_cents(0.125) == Decimal("0.13")  # half up (half even would give 0.12)
    assert usd_to_cents(0.135) == Decimal("0.14")
    # 1.005 is 1.00499999999999989... as a float: the 1e-9 step rounds the noise away first.
    assert usd_to_cents(1.005) == Decimal("1.01")
    assert usd_to_cents(0.1 + 0.2) == Decimal("0.30")
    assert usd_to_cents(0.0049999) == Decimal("0.00")
    assert str(usd_to_cents(-0.001)) == "0.00"  # never "-0.00"
    with pytest.raises(InvalidInputError):
        usd_to_cents(math.nan)


# ---- billing --------------------------------------------------------------------------------


def test_minimum_billing_charges_the_launch_price_for_the_minimum() -> None:
    ledger = CostLedger()
    launch(ledger, "short", 100.0, 3.60)
    ledger.end("short", 110.0, "released")
    record = ledger.close(200.0)
    inst = record.instance("short")
    assert inst.life_s == 10.0 and inst.billed_s == 60.0 and inst.shortfall_s == 50.0
    assert usd_to_cents(instance_cost_usd(inst)) == cents(usd(360, 60)) == Decimal("0.06")
    # Nobody used it: it is all idle, and the shortfall is reported separately too.
    assert usd_to_cents(idle_cost_usd(record)) == Decimal("0.06")
    assert usd_to_cents(summarize(record).shortfall_usd) == cents(usd(360, 50))


def test_minimum_billing_after_a_price_change_uses_the_last_price() -> None:
    ledger = CostLedger()
    launch(ledger, "i", 0.0, 3.60)
    ledger.price_change("i", 5.0, 7.20)
    ledger.end("i", 10.0, "preempted")
    inst = ledger.close(10.0).instance("i")
    # 5 s at 3.60, 5 s at 7.20, then the 50 s shortfall at 7.20 (the last price).
    expected = usd(360, 5) + usd(720, 5) + usd(720, 50)
    assert expected == Fraction(115, 1000)
    assert usd_to_cents(instance_cost_usd(inst)) == cents(expected) == Decimal("0.12")


def test_no_minimum_beyond_the_life() -> None:
    ledger = CostLedger()
    launch(ledger, "i", 0.0, 1.00, min_billed_s=60.0)
    ledger.end("i", 61.5, "released")
    inst = ledger.close(61.5).instance("i")
    assert inst.shortfall_s == 0.0
    assert math.isclose(instance_cost_usd(inst), 61.5 / 3600)


def test_price_change_mid_life_total_is_price_times_time_to_the_cent() -> None:
    ledger = CostLedger()
    launch(ledger, "a", 0.0, 2.47)
    ledger.price_change("a", 1234.0, 3.11)
    launch(ledger, "b", 300.0, 12.24, market="on-demand")
    ledger.price_change("a", 3000.0, 2.05)
    ledger.end("b", 4000.5, "released")
    record = ledger.close(4321.0)  # "a" ends with the run
    a = usd(247, 1234) + usd(311, 3000 - 1234) + usd(205, 4321 - 3000)
    b = usd(1224, 3700.5)
    assert usd_to_cents(instance_cost_usd(record.instance("a"))) == cents(a) == Decimal("3.12")
    assert usd_to_cents(instance_cost_usd(record.instance("b"))) == cents(b) == Decimal("12.58")
    assert usd_to_cents(total_cost_usd(record)) == cents(a + b) == Decimal("15.71")
    assert record.instance("a").end_reason == "end_of_run"
    assert [s.usd_per_hour for s in record.instance("a").segments] == [2.47, 3.11, 2.05]
    assert [(s.t0_s, s.t1_s) for s in record.instance("a").segments] == [
        (0.0, 1234.0),
        (1234.0, 3000.0),
        (3000.0, 4321.0),
    ]


def test_price_changes_at_one_time_keep_the_last_and_equal_prices_merge() -> None:
    ledger = CostLedger()
    launch(ledger, "i", 0.0, 1.0)
    ledger.price_change("i", 0.0, 2.0)  # at the launch: replaces the launch price
    ledger.price_change("i", 100.0, 3.0)
    ledger.price_change("i", 100.0, 4.0)  # same time: the last one holds
    ledger.price_change("i", 200.0, 4.0)  # no change
    ledger.price_change("i", 300.0, 5.0)
    ledger.end("i", 300.0, "released")  # a change at the end never applied
    inst = ledger.close(300.0).instance("i")
    assert [(s.t0_s, s.t1_s, s.usd_per_hour) for s in inst.segments] == [
        (0.0, 100.0, 2.0),
        (100.0, 300.0, 4.0),
    ]


def test_preempted_instance_and_its_job() -> None:
    ledger = CostLedger()
    launch(ledger, "spot-1", 0.0, 1.20, ondemand=3.60)
    ledger.job_event("j", 0.0, "submitted")
    ledger.job_usage("j", "spot-1", 0.0, 900.0, 4)
    ledger.job_event("j", 900.0, "preemption")
    ledger.end("spot-1", 900.0, "preempted")
    launch(ledger, "od-1", 960.0, 3.60, market="on-demand", ondemand=3.60)
    ledger.job_event("j", 960.0, "restart")
    ledger.job_usage("j", "od-1", 960.0, 2760.0, 4)
    ledger.job_event("j", 2760.0, "finished")
    ledger.job_work("j", 12_000)
    record = ledger.close(3000.0)
    spot = usd(120, 900)
    od = usd(360, 3000 - 960)
    (job,) = job_costs(record)
    assert usd_to_cents(job.cost_usd) == cents(spot + usd(360, 1800)) == Decimal("2.10")
    assert job.gpu_hours == pytest.approx(4 * (900 + 1800) / 3600)
    assert (job.restarts, job.preemptions, job.jct_s) == (1, 1, 2760.0)
    assert job.samples_per_usd == pytest.approx(12_000 / 2.10)
    by_market = {o.market: o for o in offering_costs(record)}
    assert by_market["spot"].preempted == 1 and by_market["on-demand"].preempted == 0
    assert usd_to_cents(by_market["spot"].cost_usd) == cents(spot) == Decimal("0.30")
    assert usd_to_cents(by_market["on-demand"].cost_usd) == cents(od) == Decimal("2.04")
    # Spot saved the on-demand price minus what it cost; on-demand saved nothing.
    assert usd_to_cents(by_market["spot"].savings_usd or 0.0) == cents(usd(360 - 120, 900))
    assert usd_to_cents(by_market["on-demand"].savings_usd or 0.0) == Decimal("0.00")
    assert record.instance("spot-1").end_reason == "preempted"


def test_idle_cost_and_jobs_plus_idle_equal_total() -> None:
    ledger = CostLedger()
    launch(ledger, "i", 0.0, 4.00, gpus=4)
    ledger.job_usage("a", "i", 0.0, 1800.0, 2)  # 2 of 4 GPUs for half an hour
    ledger.job_usage("b", "i", 900.0, 3600.0, 1)
    ledger.price_change("i", 1800.0, 8.00)
    ledger.job_usage("a", "i", 1800.0, 2700.0, 3)  # at the new price
    record = ledger.close(3600.0)
    total = usd(400, 1800) + usd(800, 1800)
    a = usd(400, 1800) * Fraction(2, 4) + usd(800, 900) * Fraction(3, 4)
    b = usd(400, 900) * Fraction(1, 4) + usd(800, 1800) * Fraction(1, 4)
    jobs = {j.job_id: j for j in job_costs(record)}
    assert usd_to_cents(jobs["a"].cost_usd) == cents(a) == Decimal("2.50")
    assert usd_to_cents(jobs["b"].cost_usd) == cents(b) == Decimal("1.25")
    assert usd_to_cents(idle_cost_usd(record)) == cents(total - a - b) == Decimal("2.25")
    assert usd_to_cents(total_cost_usd(record)) == cents(total) == Decimal("6.00")
    s = summarize(record)
    assert s.attributed_usd + s.idle_usd == pytest.approx(s.total_usd, abs=1e-12)
    assert s.used_gpu_hours == pytest.approx((2 * 1800 + 2700 + 3 * 900) / 3600)
    assert s.utilization == pytest.approx(s.used_gpu_hours / 4.0)


def test_spot_savings_against_the_given_on_demand_price() -> None:
    ledger = CostLedger()
    launch(ledger, "s1", 0.0, 1.50, ondemand=5.00)
    launch(ledger, "s2", 0.0, 1.20, ondemand=3.60)
    ledger.end("s2", 30.0, "preempted")  # billed the 60 s minimum, on demand too
    launch(ledger, "s3", 0.0, 1.00, key="gcp/a2/us-central1-a/spot")  # no on-demand price
    record = ledger.close(7200.0)
    spot = {o.offering_key: o for o in offering_costs(record)}
    savings = usd(500 - 150, 7200) + (usd(360, 60) - usd(120, 60))
    assert usd_to_cents(spot[SPOT_KEY].savings_usd or 0.0) == cents(savings) == Decimal("7.04")
    assert usd_to_cents(spot[SPOT_KEY].ondemand_usd or 0.0) == cents(usd(500, 7200) + usd(360, 60))
    assert spot["gcp/a2/us-central1-a/spot"].savings_usd is None
    s = summarize(record)
    assert usd_to_cents(s.savings_usd or 0.0) == Decimal("7.04")
    assert s.spot_instances == 3 and s.preempted_instances == 1


def test_fleet_series_and_cumulative_cost() -> None:
    ledger = CostLedger()
    launch(ledger, "a", 60.0, 3.60, gpus=4)
    launch(ledger, "b", 120.0, 7.20, gpus=8, market="on-demand")
    ledger.end("b", 150.0, "released")  # 30 s of a 60 s minimum
    ledger.price_change("a", 600.0, 1.80)
    record = ledger.close(3600.0)
    series = fleet_series(record)
    assert [(p.t_s, p.instances, p.gpus) for p in series] == [
        (0.0, 0, 0),
        (60.0, 1, 4),
        (120.0, 2, 12),
        (150.0, 1, 4),
        (600.0, 1, 4),
        (3600.0, 0, 0),
    ]
    assert [p.usd_per_hour for p in series] == pytest.approx([0, 3.6, 10.8, 3.6, 1.8, 0])
    cumulative = cumulative_cost_by_offering(record)
    assert cumulative.offerings == (SPOT_KEY, OD_KEY)
    finals = {k: col[-1] for k, col in zip(cumulative.offerings, cumulative.usd, strict=True)}
    for o in offering_costs(record):
        assert finals[o.offering_key] == pytest.approx(o.cost_usd, abs=1e-12)
    # The on-demand minimum is booked at its end: 150 s appears twice (before, after the lump).
    n = cumulative.times_s.index(150.0)
    assert cumulative.times_s[n + 1] == 150.0
    od = cumulative.usd[1]
    assert od[n] == pytest.approx(7.2 * 30 / 3600)
    assert od[n + 1] == pytest.approx(7.2 * 60 / 3600)
    assert all(b >= a for col in cumulative.usd for a, b in itertools.pairwise(col))


def test_empty_ledger() -> None:
    record = CostLedger().close(100.0)
    assert total_cost_usd(record) == 0.0
    s = summarize(record)
    assert s.samples_per_usd is None and s.utilization is None and s.peak_gpus == 0
    assert fleet_series(record)[-1].t_s == 100.0


# ---- a property: jobs + idle == total, and the total is price x time ------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[CostLedger, Fraction, float]:
    """A random fleet of 1-4 instances with price changes and jobs sharing their GPUs;
    returns the ledger, the exact total and the close time."""
    ledger = CostLedger()
    exact = Fraction(0)
    close_s = 10_000.0
    for n in range(draw(st.integers(1, 4))):
        iid, gpus = f"i{n}", draw(st.sampled_from([1, 2, 4, 8]))
        t0 = float(draw(st.integers(0, 3000)))
        t_end = float(draw(st.integers(int(t0), 9000)))
        price_cents = draw(st.integers(1, 3000))
        launch(ledger, iid, t0, price_cents / 100, gpus=gpus, min_billed_s=60.0)
        changes = []
        if t_end > t0:
            changes = sorted(draw(st.lists(st.integers(int(t0) + 1, int(t_end)), max_size=3)))
        last_t, last_p = t0, price_cents
        for t in changes:
            p = draw(st.integers(1, 3000))
            ledger.price_change(iid, float(t), p / 100)
            if t == t_end:
                continue  # a change at the end never applies (not even to the minimum)
            if p != last_p:
                exact += usd(last_p, t - last_t)
                last_t, last_p = float(t), p
        # Jobs: each GPU slot gets back-to-back usage pieces.
        for slot in range(gpus):
            cuts = sorted(set(draw(st.lists(st.integers(int(t0), int(t_end)), max_size=4))))
            for k, (a, b) in enumerate(itertools.pairwise(cuts)):
                ledger.job_usage(f"job{(slot + k) % 3}", iid, float(a), float(b), 1)
        ledger.end(iid, t_end, draw(st.sampled_from(["released", "preempted"])))
        exact += usd(last_p, t_end - last_t)  # the last price to the end, then the minimum
        exact += usd(last_p, max(0.0, 60.0 - (t_end - t0)))
    return ledger, exact, close_s


@settings(max_examples=60)
@given(scenarios())
def test_property_total_to_the_cent_and_jobs_plus_idle(
    scenario: tuple[CostLedger, Fraction, float],
) -> None:
    ledger, exact, close_s = scenario
    record = ledger.close(close_s)
    total = total_cost_usd(record)
    assert usd_to_cents(total) == cents(exact)
    attributed = math.fsum(j.cost_usd for j in job_costs(record))
    assert attributed + idle_cost_usd(record) == pytest.approx(total, abs=1e-9)
    assert idle_cost_usd(record) >= -1e-9
    assert record_from_json(json.loads(json.dumps(record_to_json(record)))) == record


# ---- validation -----------------------------------------------------------------------------


def _ledger_with_instance() -> CostLedger:
    ledger = CostLedger()
    launch(ledger, "i", 100.0, 2.0, gpus=4)
    return ledger


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda lg: launch(lg, "i", 0.0, 1.0), "instance_id", "already launched"),
        (lambda lg: launch(lg, "j", -1.0, 1.0), "t_s", ">= 0"),
        (lambda lg: launch(lg, "j", 0.0, math.nan), "usd_per_hour", "finite"),
        (lambda lg: launch(lg, "j", 0.0, 1.0, market="reserved"), "market", "spot"),
        (lambda lg: launch(lg, "j", 0.0, 1.0, gpus=0), "gpus", "integer >= 1"),
        (lambda lg: launch(lg, "j", 0.0, 1.0, ondemand=-2.0), "ondemand_usd_per_hour", ">= 0"),
        (lambda lg: lg.price_change("nope", 200.0, 1.0), "instance_id", "unknown instance"),
        (lambda lg: lg.price_change("i", 50.0, 1.0), "t_s", "before its last event"),
        (lambda lg: lg.end("i", 99.0, "released"), "t_s", "before its last event"),
        (lambda lg: lg.end("i", 200.0, "terminated"), "reason", "end_of_run"),
        (lambda lg: lg.job_usage("j", "nope", 100.0, 200.0, 1), "instance_id", "unknown"),
        (lambda lg: lg.job_usage("j", "i", 50.0, 200.0, 1), "t0_s", "before its launch"),
        (lambda lg: lg.job_usage("j", "i", 300.0, 200.0, 1), "t1_s", "before it starts"),
        (lambda lg: lg.job_usage("j", "i", 100.0, 200.0, 5), "gpus", "which has 4"),
        (lambda lg: lg.job_usage("j", "i", 100.0, 200.0, True), "gpus", "integer"),
        (lambda lg: lg.job_event("j", 10.0, "started"), "kind", "submitted"),
        (lambda lg: lg.job_work("j", -1.0), "useful_samples", ">= 0"),
        (lambda lg: lg.job_usage("", "i", 100.0, 200.0, 1), "job_id", "non-empty"),
        (lambda lg: lg.close(50.0), "t_s", "before the latest time"),
    ],
)
def test_rejected_calls_name_the_field(call, field: str, words: str) -> None:
    ledger = _ledger_with_instance()
    with pytest.raises(InvalidInputError) as info:
        call(ledger)
    assert info.value.field == field
    assert words in str(info.value)
    assert isinstance(info.value, AutoscalerError)


def test_nothing_but_usage_inside_the_life_after_an_end() -> None:
    ledger = _ledger_with_instance()
    ledger.end("i", 500.0, "released")
    with pytest.raises(InvalidInputError, match=r"ended at 500\.0 s"):
        ledger.price_change("i", 600.0, 3.0)
    with pytest.raises(InvalidInputError, match=r"ended at 500\.0 s"):
        ledger.end("i", 600.0, "released")
    with pytest.raises(InvalidInputError, match="after the instance ended") as info:
        ledger.job_usage("j", "i", 400.0, 600.0, 1)
    assert info.value.field == "t1_s"
    ledger.job_usage("j", "i", 400.0, 500.0, 1)  # recorded late but inside the life: fine


def test_end_before_recorded_usage_is_rejected() -> None:
    ledger = _ledger_with_instance()
    ledger.job_usage("j", "i", 100.0, 700.0, 2)
    with pytest.raises(InvalidInputError, match="before the end of a usage"):
        ledger.end("i", 600.0, "preempted")


def test_concurrent_usage_beyond_the_instance_gpus_is_rejected() -> None:
    ledger = _ledger_with_instance()
    ledger.job_usage("a", "i", 100.0, 400.0, 3)
    ledger.job_usage("b", "i", 400.0, 700.0, 4)  # abutting: fine
    ledger.job_usage("c", "i", 200.0, 300.0, 1)  # 3 + 1 = 4: fine
    with pytest.raises(InvalidInputError, match="4 of its 4 are already in use") as info:
        ledger.job_usage("d", "i", 250.0, 450.0, 1)
    assert info.value.field == "gpus"
    # The rejected usage left nothing behind: d is unknown, and 2 GPUs fit after 450 s.
    ledger.job_usage("e", "i", 700.0, 800.0, 4)
    record = ledger.close(800.0)
    assert [j.job_id for j in record.jobs] == ["a", "b", "c", "e"]


def test_float_noise_within_the_tolerance_is_accepted_and_clipped() -> None:
    ledger = CostLedger()
    launch(ledger, "i", 60.0, 3.6, gpus=1)
    preempt_s = 100.3
    t1 = 60.0 + (preempt_s - 60.0)  # may differ from 100.3 in the last bit
    ledger.job_usage("a", "i", 60.0, t1 + TIME_TOLERANCE_S / 2, 1)
    ledger.job_usage("b", "i", preempt_s - TIME_TOLERANCE_S / 2, 200.0, 1)  # overlaps by noise
    ledger.end("i", 200.0, "released")
    ledger.job_usage("b", "i", 200.0, 200.0 + TIME_TOLERANCE_S / 2, 1)
    record = ledger.close(200.0)
    assert sum(j.cost_usd for j in job_costs(record)) == pytest.approx(3.6 * 140 / 3600)


def test_job_events_in_order_submitted_first_finished_last() -> None:
    ledger = _ledger_with_instance()
    ledger.job_event("j", 100.0, "submitted")
    with pytest.raises(InvalidInputError, match="first event"):
        ledger.job_event("j", 150.0, "submitted")
    with pytest.raises(InvalidInputError, match="before its last event"):
        ledger.job_event("j", 50.0, "restart")
    ledger.job_usage("j", "i", 100.0, 200.0, 1)
    ledger.job_event("k", 300.0, "submitted")
    with pytest.raises(InvalidInputError, match="before its submission"):
        ledger.job_usage("k", "i", 250.0, 400.0, 1)
    ledger.job_event("j", 400.0, "finished")
    with pytest.raises(InvalidInputError, match="after it finished"):
        ledger.job_event("j", 500.0, "restart")
    with pytest.raises(InvalidInputError, match="after it finished"):
        ledger.job_usage("j", "i", 300.0, 450.0, 1)
    ledger.job_usage("m", "i", 100.0, 600.0, 1)
    with pytest.raises(InvalidInputError, match="before the end of its GPU usage"):
        ledger.job_event("m", 500.0, "finished")
    ledger.job_work("j", 10.0)  # work may be reported after the finish
    ledger.job_work("j", 5.0)  # and adds up
    record = ledger.close(600.0)
    (j,) = [job for job in record.jobs if job.job_id == "j"]
    assert j.useful_samples == 15.0 and j.jct_s == 300.0


def test_a_closed_ledger_accepts_nothing() -> None:
    ledger = _ledger_with_instance()
    ledger.close(200.0)
    assert ledger.closed and ledger.running() == ()
    for call in (
        lambda: launch(ledger, "x", 300.0, 1.0),
        lambda: ledger.job_work("j", 1.0),
        lambda: ledger.close(300.0),
    ):
        with pytest.raises(InvalidInputError, match="closed"):
            call()


def test_market_accepts_a_str_enum() -> None:
    from providers.base import Market

    ledger = CostLedger()
    launch(ledger, "i", 0.0, 1.0, market=Market.ON_DEMAND)
    assert ledger.close(10.0).instance("i").market == "on-demand"


# ---- JSON -----------------------------------------------------------------------------------


def _record() -> CostRecord:
    ledger = CostLedger()
    launch(ledger, "a", 0.0, 2.47, ondemand=7.0)
    ledger.job_event("j", 0.0, "submitted")
    ledger.job_usage("j", "a", 0.0, 1000.0, 4)
    ledger.price_change("a", 1000.0, 3.11)
    ledger.job_event("j", 1000.0, "preemption")
    ledger.end("a", 1000.0, "preempted")
    launch(ledger, "b", 1200.0, 9.1, gpus=8, market="on-demand")
    ledger.job_event("j", 1200.0, "restart")
    ledger.job_usage("j", "b", 1200.0, 2000.5, 8)
    ledger.price_change("b", 1500.0, 9.5)
    ledger.job_event("j", 2000.5, "finished")
    ledger.job_work("j", 123.25)
    ledger.job_usage("idle-job", "b", 2000.5, 2100.0, 1)
    return ledger.close(3000.0)


def test_json_round_trip_is_exact() -> None:
    record = _record()
    data = record_to_json(record)
    assert data["version"] == 1
    text = json.dumps(data, allow_nan=False)
    back = record_from_json(json.loads(text))
    assert back == record
    assert record_to_json(back) == data


def _break(data: dict, path: list, value: object) -> dict:
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["version"], 2, "version"),
        (["closed_s"], "soon", "closed_s"),
        (["instances", 0, "gpus"], 2.5, "instances[0].gpus"),
        (["instances", 1, "market"], "reserved", "instances[1].market"),
        (["instances", 0, "end_reason"], "gone", "instances[0].end_reason"),
        (["instances", 0, "provider"], KeyError, "instances[0].provider"),
        (
            ["instances", 0, "segments", 0, "usd_per_hour"],
            -1,
            "instances[0].segments[0].usd_per_hour",
        ),
        (["instances", 1, "segments", 0, "t1_s"], 999.0, "instances[1].segments[1].t0_s"),
        (["instances", 0, "ended_s"], 900.0, "instances[0].segments[0].t1_s"),
        (["instances", 1, "instance_id"], "a", "instances[1].instance_id"),
        (["jobs", 0, "usages", 0, "t1_s"], 1500.0, "jobs[0].usages[0].t1_s"),
        (["jobs", 0, "usages", 1, "gpus"], 9, "jobs[0].usages[1].gpus"),
        (["jobs", 0, "events", 1, "kind"], "exploded", "jobs[0].events[1].kind"),
        (["jobs", 0, "events"], {}, "jobs[0].events"),
        (["jobs", 1, "job_id"], "j", "jobs[1].job_id"),
        (["jobs", 0, "useful_samples"], None, "jobs[0].useful_samples"),
        (["closed_s"], 10.0, "closed_s"),
        (["instances"], KeyError, "instances"),
    ],
)
def test_bad_json_names_the_field(path: list, value: object, field: str) -> None:
    data = _break(record_to_json(_record()), path, value)
    with pytest.raises(InvalidInputError) as info:
        record_from_json(data)
    assert info.value.field == field
    assert field in str(info.value)


def test_json_that_is_not_an_object() -> None:
    with pytest.raises(InvalidInputError, match="expected an object"):
        record_from_json([1, 2])
