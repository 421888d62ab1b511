"""The JCT-quality plane of a scenario: where each policy lands in average JCT and in
time-to-quality against DS, the default's knob sweep as a line, and which peers beat the
default on both axes at once (dominate it).

A point is a policy's mean change against DS over the seeds, in % (negative: sooner). A
peer *dominates* the default when it is strictly better on both axes; a peer better on one
axis only is a trade-off, which is what the plot shows (``specon.plots.plot_plane``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specon.config import Policy, default_policy, policy_from_dict, policy_to_dict
from specon.sim.experiment import ScenarioResult, run_scenario
from specon.sim.scenarios import Scenario
from specon.sim.trace import Trace

DEFAULT = "specon"
# Not on the plane: the baseline itself (its origin), and a lower bound no policy reaches
# (it has no time-to-quality).
OFF_PLANE = frozenset({"ds", "bound"})
# On the plane, but no peer: perfect convergence detection is not available online (it
# shows what better detection would be worth).
NOT_PEERS = frozenset({"specon-oracle"})
# The default rule's knob that trades average JCT for time-to-quality, and the values swept.
SWEEP_RULE, SWEEP_KNOB = "phased", "quality_weight"
SWEEP_VALUES = (0.0, 0.25, 0.5, 0.75, 1.0, 2.0)


@dataclass(frozen=True, slots=True)
class PlanePoint:
    label: str
    jct: float  # average JCT change against DS, %
    ttq: float  # time-to-quality change against DS, %


def point(label: str, mean: Mapping[str, float]) -> PlanePoint | None:
    """A policy's point from its summary's means (None where it has no time-to-quality)."""
    jct, ttq = mean.get("avg_jct_reduction", math.nan), mean.get("ttq_reduction", math.nan)
    if not (math.isfinite(jct) and math.isfinite(ttq)):
        return None
    return PlanePoint(label, 0.0 - 100 * jct, 0.0 - 100 * ttq)  # 0.0 - : no "-0.0 %"


def points(result: ScenarioResult) -> list[PlanePoint]:
    """Every policy of ``result``'s main setting but DS and the bound, the default first."""
    order = sorted(result.main.summaries, key=lambda name: (name != DEFAULT, name))
    out = [point(name, result.main.summaries[name].mean) for name in order if name not in OFF_PLANE]
    return [p for p in out if p is not None]


def dominating(default: PlanePoint, points: Sequence[PlanePoint]) -> list[PlanePoint]:
    """The peers among ``points`` strictly better than ``default`` on both axes."""
    peers = [p for p in points if p.label != default.label and p.label not in NOT_PEERS]
    return [p for p in peers if p.jct < default.jct and p.ttq < default.ttq]


def swept(value: float, base: Policy | None = None) -> Policy:
    """``base`` (default: the shipped policy) with the default rule's knob at ``value``."""
    doc = policy_to_dict(base or default_policy())
    doc["priority"][SWEEP_RULE][SWEEP_KNOB] = value
    return policy_from_dict(doc)


def sweep(
    scenario: Scenario,
    traces: Mapping[str, Sequence[Trace]],
    *,
    seeds: int,
    values: Sequence[float] = SWEEP_VALUES,
) -> list[PlanePoint]:
    """The default policy with its knob at each of ``values`` on ``scenario`` (its main
    setting, the same seeds as the policies'), one point each, labelled by the value."""
    out = []
    for value in values:
        result = run_scenario(
            scenario, traces, policies=(DEFAULT,), seeds=seeds, base=swept(value), sweep=False
        )
        p = point(f"{value:g}", result.main.summaries[DEFAULT].mean)
        if p is not None:
            out.append(p)
    return out
