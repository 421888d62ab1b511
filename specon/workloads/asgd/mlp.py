"""The trained model: a ReLU multi-layer perceptron in numpy, its parameters one float32 vector.

Pure computation, no I/O. The data is synthetic and learnable: inputs from a normal
distribution, labels the argmax of a fixed random linear "teacher" (the same seed on every
worker), so the loss falls as the parameter server applies gradients.

The two knobs the throughput model cares about are independent: the parameter count (bytes
on the wire, both ways) comes from ``inputs``/``hidden``/``layers``/``outputs``, and the work
of one gradient grows with the mini-batch size (about ``6 * batch * params`` flops).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Shape:
    """The perceptron: ``inputs`` -> ``layers`` hidden layers of ``hidden`` units -> ``outputs``."""

    inputs: int = 256
    hidden: int = 512
    layers: int = 2
    outputs: int = 10

    def __post_init__(self) -> None:
        for name in ("inputs", "hidden", "layers", "outputs"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {v!r}")

    def dims(self) -> list[tuple[int, int]]:
        """(fan-in, fan-out) of each layer's weight matrix."""
        widths = [self.inputs, *([self.hidden] * self.layers), self.outputs]
        return list(itertools.pairwise(widths))

    @property
    def params(self) -> int:
        """Number of parameters (weights and biases)."""
        return sum(i * o + o for i, o in self.dims())

    @property
    def nbytes(self) -> int:
        """Bytes of the parameter vector (and of a gradient) on the wire."""
        return 4 * self.params


def layers_of(flat: F32, shape: Shape) -> list[tuple[F32, F32]]:
    """(weights, bias) views into ``flat``, one per layer (writing them writes ``flat``)."""
    if flat.shape != (shape.params,):
        raise ValueError(f"a vector of {shape.params} parameters expected, got shape {flat.shape}")
    out = []
    at = 0
    for i, o in shape.dims():
        w = flat[at : at + i * o].reshape(i, o)
        at += i * o
        b = flat[at : at + o]
        at += o
        out.append((w, b))
    return out


def init(shape: Shape, seed: int = 0) -> F32:
    """He-initialised parameters, zero biases."""
    rng = np.random.default_rng(seed)
    flat = np.zeros(shape.params, dtype=np.float32)
    for w, _ in layers_of(flat, shape):
        w[...] = rng.standard_normal(w.shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / w.shape[0]))
    return flat


class Data:
    """Mini-batches of the synthetic task; ``seed`` varies the samples, never the teacher."""

    def __init__(self, shape: Shape, seed: int) -> None:
        self.shape = shape
        self.teacher = np.random.default_rng(12345).standard_normal(
            (shape.inputs, shape.outputs), dtype=np.float32
        )
        self.rng = np.random.default_rng(seed)

    def batch(self, size: int) -> tuple[F32, npt.NDArray[np.intp]]:
        x = self.rng.standard_normal((size, self.shape.inputs), dtype=np.float32)
        return x, np.argmax(x @ self.teacher, axis=1)


def loss_and_grad(flat: F32, shape: Shape, x: F32, y: npt.NDArray[np.intp], grad: F32) -> float:
    """Mean cross-entropy of the batch; its gradient with respect to ``flat`` into ``grad``."""
    layers = layers_of(flat, shape)
    glayers = layers_of(grad, shape)
    acts = [x]
    h = x
    for k, (w, b) in enumerate(layers):
        h = h @ w + b
        if k < len(layers) - 1:
            np.maximum(h, 0, out=h)
        acts.append(h)
    logits = acts[-1]
    logits = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    n = x.shape[0]
    rows = np.arange(n)
    loss = float(-np.mean(np.log(p[rows, y] + 1e-12)))
    d = p
    d[rows, y] -= 1.0
    d /= np.float32(n)
    for k in range(len(layers) - 1, -1, -1):
        gw, gb = glayers[k]
        np.matmul(acts[k].T, d, out=gw)
        np.sum(d, axis=0, out=gb)
        if k:
            d = d @ layers[k][0].T
            d *= acts[k] > 0
    return loss
