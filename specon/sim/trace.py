"""Loss-curve traces: what a simulated job logs as it trains.

A :class:`Trace` is one recorded (or synthetic) training run of a model: its loss after
every ``stride`` steps and the CPU cost of one step. ``losses[i]`` is the loss after step
``(i + 1) * stride``; steps between two records are interpolated linearly, steps before
the first record read the first value and steps after the last read the last value.

Traces are stored one per JSON file (or a JSON list of them) under
``specon/data/traces/``; :func:`load_traces` reads them all, keyed by model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TRACE_DIR = Path(__file__).resolve().parent.parent / "data" / "traces"


class TraceError(ValueError):
    """A trace (or trace file) that cannot be used, with the reason."""


@dataclass(frozen=True, slots=True)
class Trace:
    model: str
    steps: int
    # CPU-seconds per step when the job has one full core to itself.
    step_cost: float
    losses: tuple[float, ...]
    source: str
    stride: int = 1

    def __post_init__(self) -> None:
        problems = []
        if not self.model:
            problems.append("model is empty")
        if self.steps < 1:
            problems.append(f"steps must be >= 1, got {self.steps}")
        if not (math.isfinite(self.step_cost) and self.step_cost > 0):
            problems.append(f"step_cost must be a positive finite number, got {self.step_cost}")
        if self.stride < 1:
            problems.append(f"stride must be >= 1, got {self.stride}")
        if not self.losses:
            problems.append("losses is empty")
        elif not all(math.isfinite(x) for x in self.losses):
            problems.append("losses contain a non-finite value")
        if problems:
            raise TraceError(f"trace {self.model or '?'}: " + "; ".join(problems))

    def loss_at(self, step: float) -> float:
        """The loss after ``step`` steps (fractional steps allowed), interpolated."""
        pos = step / self.stride - 1.0  # index into losses, fractional
        last = len(self.losses) - 1
        if pos <= 0.0:
            return self.losses[0]
        if pos >= last:
            return self.losses[last]
        lo = int(pos)
        frac = pos - lo
        return self.losses[lo] + (self.losses[lo + 1] - self.losses[lo]) * frac

    @property
    def duration(self) -> float:
        """CPU-seconds for the whole run on one full core."""
        return self.steps * self.step_cost

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "steps": self.steps,
            "step_cost": self.step_cost,
            "stride": self.stride,
            "source": self.source,
            "losses": list(self.losses),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Trace:
        """Build a trace from :meth:`to_json`'s shape; raises :class:`TraceError` if malformed."""
        if not isinstance(data, Mapping):
            raise TraceError(f"a trace must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("model", "steps", "step_cost", "losses") if k not in data]
        if missing:
            raise TraceError(f"trace is missing {', '.join(missing)}")
        try:
            return cls(
                model=str(data["model"]),
                steps=_as_int(data["steps"], "steps"),
                step_cost=float(data["step_cost"]),
                losses=tuple(float(x) for x in data["losses"]),
                source=str(data.get("source", "")),
                stride=_as_int(data.get("stride", 1), "stride"),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, TraceError):
                raise
            raise TraceError(f"trace {data.get('model', '?')}: {exc}") from exc


def _as_int(x: Any, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int | float) or x != int(x):
        raise TraceError(f"{name} must be an integer, got {x!r}")
    return int(x)


def read_trace_file(path: Path) -> list[Trace]:
    """The traces in one JSON file (an object or a list of objects)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise TraceError(f"{path}: {exc}") from exc
    items = data if isinstance(data, list) else [data]
    try:
        return [Trace.from_json(item) for item in items]
    except TraceError as exc:
        raise TraceError(f"{path}: {exc}") from exc


def write_trace_file(path: Path, traces: Trace | list[Trace]) -> None:
    """Write one trace (an object) or several (a list) as JSON."""
    payload = traces.to_json() if isinstance(traces, Trace) else [t.to_json() for t in traces]
    path.write_text(json.dumps(payload, separators=(",", ":")) + "\n", encoding="utf-8")


def load_traces(directory: Path | str | None = None) -> dict[str, list[Trace]]:
    """All traces under ``directory`` (default: the packaged ``specon/data/traces``), by model.

    A missing directory yields ``{}``; a malformed file raises :class:`TraceError` naming it.
    Files are read in name order, so the result is deterministic.
    """
    root = DEFAULT_TRACE_DIR if directory is None else Path(directory)
    out: dict[str, list[Trace]] = {}
    if not root.is_dir():
        return out
    for path in sorted(root.glob("*.json")):
        for trace in read_trace_file(path):
            out.setdefault(trace.model, []).append(trace)
    return out
