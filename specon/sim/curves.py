"""Synthetic loss curves for scale: Optimus' model ``1/(β0·k + β1) + β2`` with noise.

Optimus (Peng et al., EuroSys'18) models a training loss after ``k`` steps as
``l(k) = 1/(β0·k + β1) + β2``. This module

* evaluates that curve (``CurveParams``) and turns it into a seeded, noisy
  :class:`specon.sim.trace.Trace` (``synthetic_trace``), so the simulator can run
  10,000 jobs without 10,000 recordings;
* fits β to recorded traces (``specon.policy.loss_curve.fit_optimus``), and
  summarises each recorded model as a ``ModelCurve`` (β, noise, step cost, steps), so
  synthetic jobs resemble the real ones (``fit_models``, ``ModelCurve.synthetic``).

Noise is multiplicative and log-normal: ``loss = l(k) · exp(sigma·z)``, z ~ N(0, 1) i.i.d.
per recorded step, so the curve is the median and a loss never changes sign. sigma of a
recorded model is the standard deviation of ``log(loss / fit)``.

The fit works on the better-conditioned form ``l(k) = A/(1 + a·k) + β2`` (A = 1/β1,
a = β0/β1). For a fixed rate ``a`` the curve is linear in (A, β2), so those come from
ordinary least squares, and only ``a`` is searched: on a log grid, then by golden
section around the best grid point (variable projection). A noiseless Optimus curve is
recovered to within rounding.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specon.policy.loss_curve import CurveParams, fit_optimus
from specon.sim.trace import Trace

Array = npt.NDArray[np.float64]

# Steps between two recorded losses, for recorded (specon.sim.record) and synthetic traces
# alike: fine enough to keep the mini-batch noise, coarse enough to keep traces small.
DEFAULT_STRIDE = 5


@dataclass(frozen=True, slots=True)
class ModelCurve:
    """What a synthetic job of one recorded model looks like."""

    model: str
    params: CurveParams
    noise: float  # sigma of the log-normal multiplicative noise
    step_cost: float  # CPU-seconds per step on one full core (mean of the recordings)
    steps: int
    traces: int  # recordings the fit used
    rmse: float  # of the fit, in loss units

    def synthetic(self, *, seed: int, steps: int | None = None, stride: int = DEFAULT_STRIDE) -> Trace:
        """A noisy trace of this model's fitted curve (seeded)."""
        return synthetic_trace(
            model=self.model,
            steps=self.steps if steps is None else steps,
            step_cost=self.step_cost,
            params=self.params,
            noise=self.noise,
            seed=seed,
            stride=stride,
            source=f"synthetic: Optimus fit of {self.traces} recorded {self.model} trace(s)",
        )


def recorded_steps(trace: Trace) -> Array:
    """The step each of ``trace.losses`` was recorded after: stride, 2·stride, ..."""
    return np.arange(1, len(trace.losses) + 1, dtype=np.float64) * trace.stride


def synthetic_trace(
    *,
    model: str,
    steps: int,
    step_cost: float,
    params: CurveParams,
    noise: float,
    seed: int,
    stride: int = DEFAULT_STRIDE,
    source: str = "",
) -> Trace:
    """A trace following ``params`` with log-normal noise of sigma ``noise``, seeded by ``seed``.

    ``ValueError`` for ``noise < 0`` or ``steps < stride``; the trace itself checks the rest.
    """
    if not (math.isfinite(noise) and noise >= 0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise}")
    if stride < 1 or steps < stride:
        raise ValueError(f"need stride >= 1 and steps >= stride, got stride {stride}, steps {steps}")
    k = np.arange(1, steps // stride + 1, dtype=np.float64) * stride
    curve = params.losses(k)
    if noise > 0:
        curve = curve * np.exp(noise * np.random.default_rng(seed).standard_normal(len(k)))
    label = (
        source or f"synthetic Optimus curve β=({params.beta0:.4g}, {params.beta1:.4g}, {params.beta2:.4g})"
    )
    return Trace(
        model=model,
        steps=steps,
        step_cost=step_cost,
        losses=tuple(float(x) for x in curve),
        source=f"{label}, noise sigma {noise:g}, seed {seed}",
        stride=stride,
    )


def fit_model(traces: Sequence[Trace]) -> ModelCurve:
    """One ``ModelCurve`` from the recordings of one model: β fitted to all their points
    together, sigma the spread of ``log(loss / fit)``, the mean step cost and the most common
    step count. ``ValueError`` for no traces, traces of different models, or a failed fit.
    """
    if not traces:
        raise ValueError("no traces to fit")
    models = {t.model for t in traces}
    if len(models) != 1:
        raise ValueError(f"traces of one model expected, got {sorted(models)}")
    k = np.concatenate([recorded_steps(t) for t in traces])
    y = np.concatenate([np.asarray(t.losses, dtype=np.float64) for t in traces])
    params = fit_optimus(k, y)
    fitted = params.losses(k)
    positive = (y > 0) & (fitted > 0)
    noise = float(np.std(np.log(y[positive] / fitted[positive]))) if positive.any() else 0.0
    counts = [t.steps for t in traces]
    return ModelCurve(
        model=traces[0].model,
        params=params,
        noise=noise,
        step_cost=float(np.mean([t.step_cost for t in traces])),
        steps=max(set(counts), key=counts.count),
        traces=len(traces),
        rmse=float(np.sqrt(np.mean((y - fitted) ** 2))),
    )


def fit_models(traces: Mapping[str, Sequence[Trace]]) -> dict[str, ModelCurve]:
    """``fit_model`` for every model of ``traces`` (as ``load_traces`` returns them)."""
    return {model: fit_model(ts) for model, ts in sorted(traces.items())}


def synthetic_set(
    curves: Mapping[str, ModelCurve],
    n: int,
    *,
    seed: int,
    jitter: float = 0.2,
    stride: int = DEFAULT_STRIDE,
) -> list[Trace]:
    """``n`` synthetic traces cycling through ``curves`` (in name order), seeded.

    Each job's convergence rate (β0) and floor distance vary by a log-normal factor of
    sigma ``jitter`` so that jobs of one model are alike but not identical.
    """
    if n < 0 or not (math.isfinite(jitter) and jitter >= 0):
        raise ValueError(f"need n >= 0 and jitter >= 0, got {n} and {jitter}")
    if n and not curves:
        raise ValueError("no model curves to draw from")
    names = sorted(curves)
    rng = np.random.default_rng(seed)
    out: list[Trace] = []
    for i in range(n):
        curve = curves[names[i % len(names)]]
        speed, scale = np.exp(jitter * rng.standard_normal(2))
        p = curve.params
        # Scaling β1 by 1/scale scales the initial distance to the floor, 1/β1, by scale.
        params = CurveParams(beta0=p.beta0 * speed / scale, beta1=p.beta1 / scale, beta2=p.beta2)
        out.append(
            synthetic_trace(
                model=curve.model,
                steps=curve.steps,
                step_cost=curve.step_cost,
                params=params,
                noise=curve.noise,
                seed=int(rng.integers(2**31)),
                stride=stride,
                source=f"synthetic {curve.model} #{i} (jitter {jitter:g})",
            )
        )
    return out
