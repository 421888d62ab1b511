"""The JCT-quality plane (``specon.sim.plane``): points, who dominates the default, the knob
sweep on a small scenario file, and its PNG."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specon.config import default_policy
from specon.policy.loss_curve import CurveParams
from specon.sim import plane
from specon.sim.curves import synthetic_trace
from specon.sim.experiment import run_scenario
from specon.sim.plane import PlanePoint, dominating, point, points, sweep, swept
from specon.sim.scenario_file import parse_scenario
from specon.sim.trace import Trace

SCENARIO = textwrap.dedent("""\
    apiVersion: specon/v1alpha1
    kind: Scenario
    name: small
    workers: [{name: w-1}, {name: w-2}]
    jobs:
      - {submit: 0, model: vae, steps: 400}
      - {submit: 0, model: vae, steps: 150}
      - {submit: 5, model: vae, steps: 300}
      - {submit: 10, model: vae, steps: 100}
    """)


@pytest.fixture
def traces() -> dict[str, list[Trace]]:
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    return {
        "vae": [synthetic_trace(model="vae", steps=400, step_cost=0.05, params=params, noise=0.01, seed=0)]
    }


def test_a_point_is_the_change_against_ds_in_percent_and_needs_both_axes() -> None:
    assert point("x", {"avg_jct_reduction": 0.25, "ttq_reduction": -0.1}) == PlanePoint("x", -25.0, 10.0)
    assert point("bound", {"avg_jct_reduction": 0.5, "ttq_reduction": float("nan")}) is None
    assert point("y", {"avg_jct_reduction": 0.0, "ttq_reduction": 0.0}) == PlanePoint("y", 0.0, 0.0)


def test_only_a_peer_better_on_both_axes_dominates_and_never_the_oracle() -> None:
    default = PlanePoint("specon", -20.0, -5.0)
    others = [
        PlanePoint("fsp", -30.0, 10.0),  # a trade-off: sooner on JCT, later to quality
        PlanePoint("tiresias", -10.0, -12.0),  # the other trade-off
        PlanePoint("srpt", -20.0, -6.0),  # a tie on one axis is no domination
        PlanePoint("hermes", -21.0, -5.5),  # better on both
        PlanePoint("specon-oracle", -35.0, -20.0),  # not available online
    ]
    assert [p.label for p in dominating(default, [default, *others])] == ["hermes"]


def test_the_sweep_changes_only_the_default_rules_knob() -> None:
    base = default_policy()
    assert swept(0.25).priority.phased.quality_weight == 0.25  # type: ignore[attr-defined]
    assert swept(0.25).monitor == base.monitor and swept(0.25).priority.rule == base.priority.rule


def test_the_plane_of_a_scenario_and_its_sweep(traces: dict[str, list[Trace]], tmp_path: Path) -> None:
    sc = parse_scenario(SCENARIO, traces, base_dir=tmp_path)
    result = run_scenario(sc, traces, seeds=1)
    got = points(result)
    assert got[0].label == plane.DEFAULT
    assert {p.label for p in got}.isdisjoint(plane.OFF_PLANE)
    line = sweep(sc, traces, seeds=1, values=(0.75, 2.0))
    assert [p.label for p in line] == ["0.75", "2"]
    assert line[0] == PlanePoint("0.75", got[0].jct, got[0].ttq)  # the shipped value is the default's point
    plots = pytest.importorskip("specon.plots")
    out = tmp_path / "plane.png"
    plots.plot_plane(
        "small", [(p.label, p.jct, p.ttq) for p in got], [(p.label, p.jct, p.ttq) for p in line], out
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
