"""Report noise: the checked-in calibration, the script that regenerates it (really run), and the
seeded perturbation the simulated trainers report with."""

from __future__ import annotations

import json
import math
import random
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoscaler.errors import InvalidInputError
from autoscaler.sim.report_noise import (
    QUANTITIES,
    REPORT_NOISE_JSON,
    NoiseCurve,
    ReportNoise,
    load_report_noise,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "autoscaler" / "data" / "noise"


def _checked_in() -> dict:
    return json.loads((DATA / REPORT_NOISE_JSON).read_text(encoding="utf-8"))


# ------------------------------------------------------------------ the checked-in calibration


def test_the_checked_in_calibration_loads_and_shrinks_with_the_measurements() -> None:
    noise = load_report_noise()
    assert not noise.exact
    for q in QUANTITIES:
        curve = noise.curves[q]
        assert curve.n[0] == 1 and curve.n[-1] >= 32, q
        assert all(r > 0 for r in curve.relative_sd), q
    # gradient statistics: an average of more measurements scatters less (until the EMA's
    # memory, about 40 measurements at smoothing 0.95, caps it)
    for q in ("grad_sqr", "grad_var"):
        r = noise.curves[q].relative_sd
        assert r[-1] < 0.6 * r[0], (q, r)
        assert noise.relative_sd(q, 16) < noise.relative_sd(q, 1), q


def test_the_checked_in_file_says_how_it_was_made_and_is_a_full_run() -> None:
    doc = _checked_in()
    argv = shlex.split(doc["command"])
    assert argv[:2] == ["python", "benchmarks/report_noise.py"] and "--quick" not in argv
    settings = doc["settings"]
    assert settings["processes"] == 2 and settings["backend"] == "gloo"
    assert not settings["quick"] and len(settings["models"]) >= 2
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert doc["command"] in readme  # the README gives the exact command
    for name, model in doc["models"].items():
        # the replay through a fresh estimator reproduced the trainer's own state exactly
        assert model["replay_max_rel_error"] < 1e-9, name
        assert model["world_size"] == 2, name
    # the distributions the loader draws from rest on these facts of the data (module docstring)
    for model in doc["models"].values():
        for q in ("grad_var", "step_s"):
            assert all(e["frac_nonpositive"] == 0 for e in model["spread"][q]), q
    assert any(m["spread"]["grad_sqr"][0]["frac_nonpositive"] > 0 for m in doc["models"].values())
    # the MLP's grad_var readings are log-normal-like: sd of log ~ sqrt(ln(1 + r^2))
    for e in doc["models"]["mlp"]["spread"]["grad_var"][:4]:
        assert e["sd_log"] == pytest.approx(math.sqrt(math.log1p(e["relative_sd"] ** 2)), rel=0.25)
    # the table is, at each n, the larger spread of the models
    for q in QUANTITIES:
        for i, n in enumerate(doc["calibration"][q]["n"]):
            per_model = [
                next(e["relative_sd"] for e in m["spread"][q] if e["n"] == n)
                for m in doc["models"].values()
            ]
            assert doc["calibration"][q]["relative_sd"][i] == max(per_model)


# ------------------------------------------------------------------ the script, really run


@pytest.mark.slow
def test_the_quick_script_really_runs_and_the_loader_accepts_its_output(tmp_path: Path) -> None:
    out = tmp_path / "noise.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "report_noise.py"), "--quick", "--out",
         str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text(encoding="utf-8")
    doc = json.loads(text)
    assert doc["settings"]["quick"] and "--quick" in doc["command"]
    model = doc["models"]["mlp"]
    assert model["world_size"] == 2 and model["replay_max_rel_error"] < 1e-9
    assert model["frozen_measurements"] >= 64 and model["frozen_steps_timed"] >= 64
    noise = load_report_noise(text)
    for q in QUANTITIES:
        assert noise.curves[q].n == (1, 2, 4, 8), q
        assert noise.relative_sd(q, 1) > 0, q
    # one measurement's grad_var reading scatters by more than eight measurements' do
    assert noise.relative_sd("grad_var", 8) < noise.relative_sd("grad_var", 1)


# ------------------------------------------------------------------ the perturbation

TABLE = ReportNoise(
    {
        "grad_sqr": NoiseCurve((1, 4, 64), (1.2, 0.6, 0.3)),
        "grad_var": NoiseCurve((1, 4, 64), (0.5, 0.25, 0.1)),
        "noise_scale": NoiseCurve((1, 64), (2.0, 0.4)),
        "step_s": NoiseCurve((1, 64), (0.3, 0.05)),
    }
)


def test_relative_sd_interpolates_in_log_n_and_clamps_at_the_ends() -> None:
    assert TABLE.relative_sd("grad_var", 1) == 0.5
    assert TABLE.relative_sd("grad_var", 2) == pytest.approx(0.375)  # halfway in log n
    assert TABLE.relative_sd("grad_var", 16) == pytest.approx(0.175)
    assert TABLE.relative_sd("grad_var", 10**9) == 0.1
    assert TABLE.relative_sd("step_s", 8) == pytest.approx(0.175)


@pytest.mark.parametrize("rng_of", [np.random.default_rng, random.Random])
def test_the_same_seed_gives_the_same_readings(rng_of) -> None:
    def draws(seed: int) -> list[float]:
        rng = rng_of(seed)
        return [TABLE.noisy(rng, 2.0, q, n) for q in QUANTITIES for n in (1, 3, 100)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    assert all(math.isfinite(v) for v in draws(7))


@pytest.mark.parametrize(
    ("quantity", "measurements"),
    [("grad_sqr", 1), ("grad_sqr", 8), ("grad_var", 2), ("grad_var", 500), ("noise_scale", 1),
     ("step_s", 8)],
)  # fmt: skip
def test_the_spread_of_many_readings_is_relative_sd(quantity: str, measurements: int) -> None:
    rng = np.random.default_rng(3)
    value = 0.37
    draws = np.array([TABLE.noisy(rng, value, quantity, measurements) for _ in range(40_000)])
    r = TABLE.relative_sd(quantity, measurements)
    assert draws.mean() == pytest.approx(value, rel=0.03 * max(1.0, r))  # unbiased, as the trainer
    assert draws.std() / value == pytest.approx(r, rel=0.06 if r < 1 else 0.15)
    if quantity == "grad_sqr":
        # a normal reading: below zero as often as the trainer's unclamped estimate would be
        expected = 0.5 * math.erfc(1 / (r * math.sqrt(2)))
        assert (draws <= 0).mean() == pytest.approx(expected, abs=0.01)
    else:
        assert (draws > 0).all()


def test_the_exact_world_reports_the_truth_and_draws_nothing() -> None:
    exact = ReportNoise.none()
    assert exact.exact and exact.source == "exact"
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    for q in QUANTITIES:
        assert exact.relative_sd(q, 1) == 0
        assert exact.noisy(rng, 0.123, q, 1) == 0.123
    assert rng.bit_generator.state == before
    assert ReportNoise.none().noisy(rng, -0.5, "grad_sqr", 3) == -0.5


@pytest.mark.parametrize(
    ("value", "quantity", "measurements", "field"),
    [(1.0, "loss", 1, "quantity"), (1.0, "grad_var", 0, "measurements"),
     (1.0, "grad_var", True, "measurements"), (1.0, "grad_var", 1.5, "measurements"),
     (1.0, "step_s", 10**13, "measurements"), (-1.0, "grad_var", 1, "grad_var"),
     (0.0, "step_s", 1, "step_s"), (math.nan, "grad_sqr", 1, "grad_sqr"),
     (math.inf, "noise_scale", 1, "noise_scale"), ("1", "grad_sqr", 1, "grad_sqr")],
)  # fmt: skip
def test_bad_inputs_are_refused(value, quantity, measurements, field) -> None:
    with pytest.raises(InvalidInputError) as e:
        TABLE.noisy(np.random.default_rng(0), value, quantity, measurements)
    assert e.value.field == field


def test_a_bad_generator_is_refused() -> None:
    with pytest.raises(InvalidInputError):
        TABLE.noisy(np.random.RandomState(0), 1.0, "grad_var", 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d["calibration"].pop("step_s"),
        lambda d: d["calibration"]["grad_var"].update(n=[1, 1, 2]),
        lambda d: d["calibration"]["grad_var"].update(n=[0]),
        lambda d: d["calibration"]["grad_sqr"]["relative_sd"].__setitem__(0, -0.1),
        lambda d: d["calibration"]["grad_sqr"]["relative_sd"].__setitem__(0, float("inf")),
        lambda d: d["calibration"]["grad_sqr"]["relative_sd"].pop(),
        lambda d: d.pop("calibration"),
    ],
)
def test_a_corrupt_file_is_refused(edit) -> None:
    doc = _checked_in()
    edit(doc)
    with pytest.raises(InvalidInputError):
        load_report_noise(json.dumps(doc))


def test_a_file_that_is_not_a_json_object_is_refused() -> None:
    for text in ("not json", "[1, 2]"):
        with pytest.raises(InvalidInputError):
            load_report_noise(text)
