"""The MB-ASGD cluster simulation and its Table III workload."""

from __future__ import annotations

import math
import random

import pytest

from specon.sim.asgd.allocation import Settings, SpeedCurve
from specon.sim.asgd.cluster import SimConfig, confidence, simulate
from specon.sim.asgd.dnn import ALEXNET, LARGE, NIN, TABLE_III, VGG19, workload
from specon.sim.asgd.report import stable_up_to, sweep, table


def test_table_iii_service_times() -> None:
    t = VGG19.service_times()
    assert t.worker == pytest.approx(120e3 / 1229)  # 120 TFLOPs at 1229 GFLOPS
    assert t.uplink == t.downlink == pytest.approx(575e6 * 8 / 1e9)  # 575 MB over 1 Gbps
    assert 0 < t.server < 0.01 * t.uplink  # the network, not the update, bounds it
    assert ALEXNET.mean_steps == pytest.approx(90 * 1.2e6 / 1024)
    assert [m.name for m in TABLE_III] == ["NiN", "GoogLeNet", "AlexNet", "VGG19"]
    assert workload("large") == LARGE
    with pytest.raises(ValueError, match="models"):
        workload("tiny")


def test_job_sizes_follow_the_epochs() -> None:
    rng = random.Random(1)
    sizes = [NIN.draw_steps(rng) for _ in range(4000)]
    epochs = [s / NIN.steps_per_epoch for s in sizes]
    assert sum(epochs) / len(epochs) == pytest.approx(200, abs=0.1)
    var = sum((e - 200) ** 2 for e in epochs) / len(epochs)
    assert var == pytest.approx(2.0, rel=0.15)


@pytest.mark.slow
def test_simulation_is_seeded_and_measures_every_job() -> None:
    cfg = SimConfig(Settings("hell"), load=0.3, jobs=120)
    a, b = simulate(cfg), simulate(cfg)
    assert a.responses == b.responses
    assert a.stable and len(a.responses) == 120 - 12
    assert all(0 < m < r for m, r in zip(a.to_mark, a.responses, strict=True))
    assert 0 < a.utilisation <= 1
    assert simulate(SimConfig(Settings("hell"), load=0.3, jobs=120, seed=1)).responses != a.responses


def test_a_lone_job_runs_at_its_fastest() -> None:
    # At a tiny load jobs never meet: HELL with filling gives each every node that helps.
    r = simulate(SimConfig(Settings("hell"), load=0.001, jobs=40, models=(NIN,)))
    c = SpeedCurve.from_times(NIN.service_times(), 100)
    fastest = NIN.mean_steps * float(c.step_time[c.best(100)]) / 3600
    assert sum(r.responses) / len(r.responses) == pytest.approx(fastest, rel=0.05)


@pytest.mark.slow
def test_srpt_is_unstable_where_hell_is_not() -> None:
    hell = simulate(SimConfig(Settings("hell"), load=0.5, jobs=400))
    srpt = simulate(SimConfig(Settings("srpt"), load=0.5, jobs=400))
    assert hell.stable and not srpt.stable
    assert srpt.reason


def test_overload_is_unstable() -> None:
    r = simulate(SimConfig(Settings("hell"), load=3.0, jobs=200, cap=60))
    assert not r.stable and "cap" in r.reason


def test_moldable_runs() -> None:
    r = simulate(SimConfig(Settings("knee", "moldable"), load=0.3, jobs=100))
    assert r.stable and r.responses


def test_sweep_skips_past_instability_and_tabulates() -> None:
    pts = sweep(SimConfig(Settings("hell"), jobs=100, cap=40), [3.0, 0.2, 5.0], 1)
    assert [p.load for p in pts] == [0.2, 3.0, 5.0]
    assert pts[0].stable and not pts[1].stable and pts[2].skipped
    assert stable_up_to(pts) == 0.2
    text = table("t", {"HELL": pts})
    assert "unstable (skipped)" in text and "UNSTABLE" in text


def test_confidence() -> None:
    assert math.isnan(confidence([1.0]))
    assert confidence([1.0, 1.0, 1.0]) == 0.0
    assert confidence([1.0, 3.0]) == pytest.approx(12.71)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"load": 0.0}, "load"),
        ({"jobs": 5}, "jobs"),
        ({"nodes": 1}, "nodes"),
        ({"models": ()}, "models"),
        ({"method": "x"}, "method"),
        ({"warmup": 0.95}, "warmup"),
    ],
)
def test_bad_config_is_a_value_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SimConfig(**kwargs)  # type: ignore[arg-type]
