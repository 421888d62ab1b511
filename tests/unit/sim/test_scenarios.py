"""Arrivals, the paper's scenarios, seeds, and the summary statistics."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specon.policy.loss_curve import CurveParams
from specon.sim.curves import synthetic_trace
from specon.sim.experiment import mean_ci, run_scenario, t95
from specon.sim.policies import POLICIES
from specon.sim.scenarios import (
    PAPER_MODELS,
    SCENARIOS,
    TABLE_III,
    ArrivalError,
    FixedInterval,
    Poisson,
    UniformWindow,
    read_arrivals,
    scenario,
)
from specon.sim.trace import Trace


def _traces() -> dict[str, list[Trace]]:
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    return {
        m: [
            synthetic_trace(model=m, steps=1000, step_cost=0.02, params=params, noise=0.01, seed=s)
            for s in (0, 1)
        ]
        for m in PAPER_MODELS
    }


def test_fixed_interval_arrivals() -> None:
    assert FixedInterval(50.0).times(3, random.Random(0)) == [0.0, 50.0, 100.0]


def test_uniform_arrivals_are_sorted_in_the_window_and_start_with_the_first_job() -> None:
    times = UniformWindow(0.0, 300.0).times(20, random.Random(1))
    assert times == sorted(times)
    assert times[0] == 0.0
    assert all(0.0 <= t <= 300.0 for t in times)


def test_poisson_arrivals_are_seeded() -> None:
    a = Poisson(0.5).times(50, random.Random(7))
    assert a == Poisson(0.5).times(50, random.Random(7))
    assert a != Poisson(0.5).times(50, random.Random(8))
    assert a == sorted(a)


def test_arrivals_from_csv_and_json(tmp_path: Path) -> None:
    csv_file = tmp_path / "a.csv"
    csv_file.write_text("submit,model\n20,gru\n5,vae\n")
    assert read_arrivals(csv_file).entries == ((5.0, "vae"), (20.0, "gru"))
    js = tmp_path / "a.json"
    js.write_text(json.dumps([{"submit": 3, "model": "rnn"}, 1.5]))
    assert read_arrivals(js).entries == ((1.5, None), (3.0, "rnn"))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "time\n1\n", "'submit' column"),
        ("a.csv", "submit\nsoon\n", "not a number"),
        ("a.csv", "submit\n-4\n", ">= 0"),
        ("a.json", "{}", "JSON list"),
        ("a.json", "[", "a.json"),
        ("a.csv", "submit\n", "no arrivals"),
    ],
)
def test_bad_arrival_files_say_what_is_wrong(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ArrivalError, match=message):
        read_arrivals(path)


def test_a_scenario_workload_depends_only_on_the_seed() -> None:
    traces = _traces()
    a3 = SCENARIOS["A3"]
    w0 = a3.workload(0, traces)
    assert w0 == a3.workload(0, traces)
    assert w0 != a3.workload(1, traces)
    assert len(w0.jobs) == 20 and len(w0.workers) == 4
    assert {j.model for j in w0.jobs} <= set(PAPER_MODELS)
    a1 = SCENARIOS["A1"].workload(3, traces)
    assert [j.submit for j in a1.jobs] == [50.0 * i for i in range(20)]
    assert {j.model for j in a1.jobs} == {"vae"}


def test_arrivals_from_a_file_bring_their_models(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("submit,model\n0,gru\n10,\n")
    sc = scenario("a4").with_arrivals(read_arrivals(path))
    wl = sc.workload(0, _traces())
    assert len(wl.jobs) == 2
    assert wl.jobs[0].model == "gru"


def test_a_scenario_without_traces_for_its_models_says_so() -> None:
    with pytest.raises(ValueError, match="no traces for vae"):
        SCENARIOS["A1"].workload(0, {"gru": _traces()["gru"]})
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario("A9")


def test_t_quantiles_and_confidence_intervals() -> None:
    assert t95(1) == 12.706
    assert t95(9) == 2.262
    assert t95(1000) == 1.960
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.303 * 1.0 / 3**0.5)
    assert mean_ci([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        t95(0)


@pytest.mark.slow
def test_run_scenario_compares_every_policy_with_ds_on_the_same_seeds() -> None:
    result = run_scenario(SCENARIOS["A1"], _traces(), seeds=2)
    s = result.main.summaries
    assert set(s) == set(POLICIES)
    assert s["ds"].mean["avg_jct_reduction"] == 0.0
    assert s["bound"].mean["avg_jct"] <= min(s[p].mean["avg_jct"] for p in s if p != "bound")
    assert all(len(runs) == 2 for runs in result.main.runs.values())
    assert result.sweep == ()


@pytest.mark.slow
def test_a2_sweeps_table_iii_unless_alpha_or_interval_is_given() -> None:
    traces = _traces()
    swept = run_scenario(SCENARIOS["A2"], traces, seeds=1, policies=("specon",))
    assert [(p.alpha, p.interval) for p in swept.sweep] == list(TABLE_III)
    assert (swept.main.alpha, swept.main.interval) == (0.01, 30.0)
    one = run_scenario(SCENARIOS["A2"], traces, seeds=1, policies=("specon",), alpha=0.05, interval=20.0)
    assert one.sweep == ()
    assert one.main.paper == TABLE_III[(0.05, 20.0)]
