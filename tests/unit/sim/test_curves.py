"""Synthetic Optimus curves and the least-squares fit of β."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.policy.loss_curve import CurveParams, fit_optimus
from specon.sim.curves import (
    ModelCurve,
    fit_model,
    fit_models,
    recorded_steps,
    synthetic_set,
    synthetic_trace,
)
from specon.sim.trace import Trace

VAE_LIKE = CurveParams(beta0=1e-4, beta1=4e-3, beta2=240.0)


def _trace(params: CurveParams, *, noise: float = 0.0, seed: int = 0, model: str = "m") -> Trace:
    return synthetic_trace(model=model, steps=2000, step_cost=0.02, params=params, noise=noise, seed=seed)


def test_curve_is_optimus_formula() -> None:
    assert VAE_LIKE.loss(0) == pytest.approx(1 / 4e-3 + 240.0)
    assert VAE_LIKE.loss(40) == pytest.approx(1 / (4e-3 + 4e-3) + 240.0)
    assert VAE_LIKE.losses([0, 40]).tolist() == pytest.approx([490.0, 365.0])


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    amplitude=st.floats(1.0, 1000.0),  # 1/β1: the initial distance to the floor
    bend=st.floats(0.05, 1000.0),  # β0/β1 · 2000: how far the curve bends within the run
    beta2=st.floats(-5.0, 500.0),
)
def test_fit_recovers_beta_of_a_noiseless_curve(amplitude: float, bend: float, beta2: float) -> None:
    # (Drawn so that the curve visibly bends within the 2000 steps: otherwise β0 and β1
    # are not identifiable from the points.)
    k = np.arange(1, 401) * 5.0
    beta1 = 1 / amplitude
    beta0 = bend / k[-1] * beta1
    fit = fit_optimus(k, CurveParams(beta0, beta1, beta2).losses(k))
    assert fit.beta0 == pytest.approx(beta0, rel=1e-4)
    assert fit.beta1 == pytest.approx(beta1, rel=1e-4)
    assert fit.beta2 == pytest.approx(beta2, rel=1e-4, abs=1e-6 * amplitude)


def test_fit_of_noisy_curve_is_close() -> None:
    trace = _trace(VAE_LIKE, noise=0.01, seed=1)
    fit = fit_optimus(recorded_steps(trace), trace.losses)
    assert fit.beta2 == pytest.approx(240.0, rel=0.01)
    assert fit.beta0 / fit.beta1 == pytest.approx(VAE_LIKE.beta0 / VAE_LIKE.beta1, rel=0.15)


@pytest.mark.parametrize(
    ("steps", "losses", "message"),
    [
        ([1, 2], [3.0, 2.0], "at least 3"),
        ([1, 1, 1, 1], [3.0, 2.0, 1.0, 0.5], "at least 3"),
        ([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], "do not fall"),
        ([1, 2, 3], [1.0, 2.0], "differ in length"),
    ],
)
def test_fit_rejects_unusable_points(steps: list[float], losses: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_optimus(steps, losses)


def test_fit_ignores_nonfinite_points() -> None:
    k = np.arange(1, 101) * 5.0
    y = VAE_LIKE.losses(k)
    y[10] = math.nan
    y[20] = math.inf
    assert fit_optimus(k, y).beta2 == pytest.approx(240.0, rel=1e-6)


def test_params_must_describe_a_falling_curve() -> None:
    with pytest.raises(ValueError, match="> 0"):
        CurveParams(beta0=-1.0, beta1=1.0, beta2=0.0)
    with pytest.raises(ValueError, match="finite"):
        CurveParams(beta0=1.0, beta1=math.nan, beta2=0.0)


def test_synthetic_trace_shape_and_seed() -> None:
    a = _trace(VAE_LIKE, noise=0.05, seed=7)
    assert (a.steps, a.stride, len(a.losses), a.step_cost) == (2000, 5, 400, 0.02)
    assert a == _trace(VAE_LIKE, noise=0.05, seed=7)
    assert a.losses != _trace(VAE_LIKE, noise=0.05, seed=8).losses
    clean = _trace(VAE_LIKE)
    assert clean.losses == pytest.approx(VAE_LIKE.losses(recorded_steps(clean)).tolist())
    ratio = np.log(np.asarray(a.losses) / np.asarray(clean.losses))
    assert float(np.std(ratio)) == pytest.approx(0.05, rel=0.15)


def test_synthetic_trace_rejects_bad_noise_and_stride() -> None:
    with pytest.raises(ValueError, match="noise"):
        synthetic_trace(model="m", steps=10, step_cost=1.0, params=VAE_LIKE, noise=-1.0, seed=0)
    with pytest.raises(ValueError, match="stride"):
        synthetic_trace(model="m", steps=3, step_cost=1.0, params=VAE_LIKE, noise=0.0, seed=0, stride=5)


def test_fit_model_summarises_the_recordings() -> None:
    traces = [_trace(VAE_LIKE, noise=0.02, seed=s, model="vae") for s in range(3)]
    curve = fit_model(traces)
    assert (curve.model, curve.steps, curve.traces, curve.step_cost) == ("vae", 2000, 3, pytest.approx(0.02))
    assert curve.noise == pytest.approx(0.02, rel=0.1)
    assert curve.params.beta2 == pytest.approx(240.0, rel=0.01)
    with pytest.raises(ValueError, match="one model"):
        fit_model([*traces, _trace(VAE_LIKE, model="gru")])
    with pytest.raises(ValueError, match="no traces"):
        fit_model([])


def test_synthetic_jobs_resemble_their_model() -> None:
    curve = fit_model([_trace(VAE_LIKE, noise=0.02, seed=s, model="vae") for s in range(2)])
    job = curve.synthetic(seed=3)
    assert (job.model, job.steps, job.step_cost) == ("vae", curve.steps, curve.step_cost)
    assert fit_model([job]).params.beta2 == pytest.approx(curve.params.beta2, rel=0.01)


def test_synthetic_set_cycles_models_and_is_seeded() -> None:
    curves = fit_models(
        {
            "a": [_trace(VAE_LIKE, noise=0.01, model="a")],
            "b": [_trace(CurveParams(1e-3, 0.5, 0.3), noise=0.01, model="b")],
        }
    )
    assert sorted(curves) == ["a", "b"]
    jobs = synthetic_set(curves, 5, seed=11)
    assert [j.model for j in jobs] == ["a", "b", "a", "b", "a"]
    assert jobs == synthetic_set(curves, 5, seed=11)
    assert jobs != synthetic_set(curves, 5, seed=12)
    assert len({j.losses for j in jobs}) == 5  # jittered: no two jobs alike
    assert synthetic_set(curves, 0, seed=1) == []
    with pytest.raises(ValueError, match="no model curves"):
        synthetic_set({}, 1, seed=1)


def test_model_curve_is_frozen() -> None:
    curve = ModelCurve("m", VAE_LIKE, 0.0, 0.01, 100, 1, 0.0)
    with pytest.raises(AttributeError):
        curve.noise = 1.0  # type: ignore[misc]
