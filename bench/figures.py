"""The one shape a benchmark reports in."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

# What a figure's number rests on, for the regression guard (``bench.baseline``): "cpu" (CPU
# time, or a rate derived from it: robust on a shared machine), "wall" (wall-clock time: a
# busy machine moves it), None (neither: simulated, counted, or not said).
Clock = Literal["cpu", "wall"] | None


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured number, with the target it is judged against (if any)."""

    name: str
    value: float
    unit: str
    # "min": value should be at least target; "max": at most target.
    target: float | None = None
    better: Literal["min", "max"] = "max"
    detail: str = ""
    # Where a benchmark reports both, the guard compares its "cpu" figures, not its "wall" ones.
    clock: Clock = None

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value >= self.target if self.better == "min" else self.value <= self.target

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["met"] = self.met
        return d

    def line(self) -> str:
        goal = ""
        if self.target is not None:
            op = ">=" if self.better == "min" else "<="
            goal = f"  (target {op} {self.target:g} {self.unit}: {'met' if self.met else 'MISSED'})"
        extra = f"  [{self.detail}]" if self.detail else ""
        return f"  {self.name:<58} {self.value:>14,.3f} {self.unit}{goal}{extra}"
