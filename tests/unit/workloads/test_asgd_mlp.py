"""The async-SGD model: its size knob, and a gradient that is the loss's true gradient."""

from __future__ import annotations

import numpy as np
import pytest

from specon.workloads.asgd import mlp


def test_the_parameter_count_and_wire_size() -> None:
    s = mlp.Shape(inputs=4, hidden=3, layers=2, outputs=2)
    assert s.dims() == [(4, 3), (3, 3), (3, 2)]
    assert s.params == (4 * 3 + 3) + (3 * 3 + 3) + (3 * 2 + 2)
    assert s.nbytes == 4 * s.params
    with pytest.raises(ValueError, match="hidden must be a whole number >= 1"):
        mlp.Shape(hidden=0)


def test_the_gradient_matches_finite_differences() -> None:
    s = mlp.Shape(inputs=5, hidden=4, layers=2, outputs=3)
    flat = mlp.init(s, seed=1)
    flat += np.random.default_rng(2).normal(0, 0.1, flat.shape).astype(np.float32)  # biases off zero
    x, y = mlp.Data(s, seed=3).batch(6)
    grad = np.empty_like(flat)
    mlp.loss_and_grad(flat, s, x, y, grad)
    rng = np.random.default_rng(4)
    for i in rng.choice(s.params, 12, replace=False):
        eps = 3e-3
        up, down = flat.copy(), flat.copy()
        up[i] += eps
        down[i] -= eps
        g = np.empty_like(flat)
        numeric = (mlp.loss_and_grad(up, s, x, y, g) - mlp.loss_and_grad(down, s, x, y, g)) / (2 * eps)
        assert grad[i] == pytest.approx(numeric, rel=0.02, abs=1e-3), i


def test_sgd_on_the_synthetic_task_lowers_the_loss() -> None:
    s = mlp.Shape(inputs=16, hidden=32, layers=1, outputs=4)
    flat = mlp.init(s)
    data = mlp.Data(s, seed=0)
    grad = np.empty_like(flat)
    losses = []
    for _ in range(300):
        x, y = data.batch(32)
        losses.append(mlp.loss_and_grad(flat, s, x, y, grad))
        flat -= np.float32(0.05) * grad
    assert np.mean(losses[-20:]) < 0.6 * np.mean(losses[:20])
