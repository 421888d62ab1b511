"""Synthetic data sets, generated deterministically from a seed (nothing is downloaded).

* ``digits`` - MNIST-like 10-class images of seven-segment digits: random size, position,
  slant and stroke width, segments occasionally missing or extra (so some images are
  ambiguous and the loss keeps a floor, as on real data), pixel noise, values in [0, 1].
* ``waves`` - sums of two sinusoids with random frequency, phase and amplitude plus noise;
  the regression task predicts each next value (the noise sets the MSE floor).
* ``shapes`` - variable-length 1-D sequences of three kinds (noisy ramp, noisy sinusoid,
  random walk); short ones are hard to tell apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# Segments a..g of a seven-segment glyph as (x0, y0, x1, y1) in a unit box, y pointing down.
_SEGMENTS = torch.tensor(
    [
        [0.0, 0.0, 1.0, 0.0],  # a: top
        [1.0, 0.0, 1.0, 0.5],  # b: top right
        [1.0, 0.5, 1.0, 1.0],  # c: bottom right
        [0.0, 1.0, 1.0, 1.0],  # d: bottom
        [0.0, 0.5, 0.0, 1.0],  # e: bottom left
        [0.0, 0.0, 0.0, 0.5],  # f: top left
        [0.0, 0.5, 1.0, 0.5],  # g: middle
    ]
)
# Which segments each digit lights (the usual seven-segment encoding).
_DIGIT_SEGMENTS = torch.tensor(
    [
        [1, 1, 1, 1, 1, 1, 0],
        [0, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 1, 0, 1],
        [1, 1, 1, 1, 0, 0, 1],
        [0, 1, 1, 0, 0, 1, 1],
        [1, 0, 1, 1, 0, 1, 1],
        [1, 0, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0, 1, 1],
    ],
    dtype=torch.bool,
)


@dataclass(frozen=True, slots=True)
class Labelled:
    """Inputs and integer class labels."""

    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True, slots=True)
class Sequences:
    """Padded variable-length sequences ``x`` (N, T, F), their ``lengths`` and labels ``y``."""

    x: torch.Tensor
    lengths: torch.Tensor
    y: torch.Tensor


def digits(n: int, *, size: int = 28, seed: int, flip: float = 0.04, noise: float = 0.08) -> Labelled:
    """``n`` images (n, size, size) in [0, 1] and their digit labels."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=gen)
    lit = _DIGIT_SEGMENTS[y] ^ (torch.rand(n, 7, generator=gen) < flip)
    # Glyph box: height 45-70 % of the image, width 45-70 % of the height, random offset, slant.
    height = 0.45 + 0.25 * torch.rand(n, generator=gen)
    width = height * (0.45 + 0.25 * torch.rand(n, generator=gen))
    left = 0.1 + (0.9 - width - 0.1) * torch.rand(n, generator=gen)
    top = 0.1 + (0.9 - height - 0.1) * torch.rand(n, generator=gen)
    slant = 0.25 * (torch.rand(n, generator=gen) - 0.3)
    stroke = (0.035 + 0.03 * torch.rand(n, generator=gen)).view(n, 1)

    seg = _SEGMENTS.view(1, 7, 4)
    ys = top.view(n, 1, 1) + height.view(n, 1, 1) * seg[..., 1::2]  # (n, 7, 2): segment ends
    xs = (
        left.view(n, 1, 1) + width.view(n, 1, 1) * seg[..., 0::2] + slant.view(n, 1, 1) * (1 - seg[..., 1::2])
    )
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    py, px = (c.reshape(1, -1) for c in torch.meshgrid(coords, coords, indexing="ij"))
    # Ink = Gaussian of the distance to the nearest lit segment; one segment at a time and in
    # place, which keeps generation a fraction of a second (it is paid again on every restore).
    images = torch.zeros(n, size * size)
    falloff = -1 / (2 * stroke**2)
    for s in range(7):
        ax, ay = xs[:, s, :1], ys[:, s, :1]
        bx, by = xs[:, s, 1:] - ax, ys[:, s, 1:] - ay
        inv_len2 = 1 / (bx * bx + by * by).clamp_min(1e-9)
        dx, dy = px - ax, py - ay
        t = ((dx * bx + dy * by) * inv_len2).clamp_(0, 1)
        dist2 = dx.sub_(t * bx).square_().add_(dy.sub_(t * by).square_())
        torch.maximum(images, dist2.mul_(falloff).exp_().mul_(lit[:, s : s + 1]), out=images)
    images += noise * torch.randn(images.shape, generator=gen)
    return Labelled(images.clamp(0, 1).view(n, size, size), y)


def waves(n: int, *, length: int, seed: int, noise: float = 0.1) -> torch.Tensor:
    """``n`` series of ``length + 1`` values (n, length + 1): two sinusoids plus noise."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(length + 1, dtype=torch.float32).view(1, -1)
    total = torch.zeros(n, length + 1)
    for _ in range(2):
        freq = (0.04 + 0.2 * torch.rand(n, 1, generator=gen)) * 2 * math.pi
        phase = 2 * math.pi * torch.rand(n, 1, generator=gen)
        amp = 0.3 + 0.5 * torch.rand(n, 1, generator=gen)
        total += amp * torch.sin(freq * t + phase)
    return total + noise * torch.randn(total.shape, generator=gen)


def shapes(n: int, *, min_len: int, max_len: int, seed: int, noise: float = 0.3) -> Sequences:
    """``n`` padded sequences (n, max_len, 1) of 3 kinds, with lengths in [min_len, max_len]."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=gen)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=gen)
    t = torch.arange(max_len, dtype=torch.float32).view(1, -1)
    start = torch.randn(n, 1, generator=gen)
    slope = (0.02 + 0.08 * torch.rand(n, 1, generator=gen)) * torch.sign(torch.randn(n, 1, generator=gen))
    ramp = start + slope * t
    freq = (0.15 + 0.35 * torch.rand(n, 1, generator=gen)) * 2 * math.pi / 2
    sine = start + 0.8 * torch.sin(freq * t + 2 * math.pi * torch.rand(n, 1, generator=gen))
    walk = start + torch.cumsum(0.3 * torch.randn(n, max_len, generator=gen), dim=1)
    x = torch.where(y.view(-1, 1) == 0, ramp, torch.where(y.view(-1, 1) == 1, sine, walk))
    x = x + noise * torch.randn(x.shape, generator=gen)
    x = x * (t < lengths.view(-1, 1))  # zero padding past each length
    return Sequences(x.unsqueeze(-1), lengths, y)
