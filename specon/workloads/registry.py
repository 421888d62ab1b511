"""The workload registry: each model with its data, defaults and one-step training.

``build(name, seed=…)`` gives a ready ``Workload``; ``train_step()`` runs one optimiser step
and returns the loss. The runner (``python -m specon.workloads``) wraps it in the job
contract; the simulator's trace recorder can call it in-process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional

from specon import jobkit
from specon.workloads import data
from specon.workloads.models import VAE, DynamicRNN, GRURegressor, SequenceClassifier, vae_loss

# Every job of a model trains on the same data set (like every MNIST job does); the job's own
# seed drives initialisation, mini-batch order and noise.
DATA_SEED = 20_240_501
IMAGE_SIZE = 28
N_IMAGES = 8192
WAVE_LENGTH = 64
N_WAVES = 8192
SHAPE_LENGTHS = (6, 48)
N_SHAPES = 8192

Batch = tuple[torch.Tensor, ...]
BatchFn = Callable[[torch.Generator], Batch]  # draws the next mini-batch from the data RNG
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
Parts = tuple[nn.Module, BatchFn, LossFn]
# Mini-batches are drawn by the CPU generator ``data_rng`` whatever the device, so a job moved
# between a GPU and a CPU trains on the same mini-batches; the data sets live on the device.


@functools.cache
def _digits() -> data.Labelled:
    return data.digits(N_IMAGES, size=IMAGE_SIZE, seed=DATA_SEED)


@functools.cache
def _waves() -> torch.Tensor:
    return data.waves(N_WAVES, length=WAVE_LENGTH, seed=DATA_SEED)


@functools.cache
def _shapes() -> data.Sequences:
    return data.shapes(N_SHAPES, min_len=SHAPE_LENGTHS[0], max_len=SHAPE_LENGTHS[1], seed=DATA_SEED)


@dataclass(frozen=True, slots=True)
class Workload:
    """A model ready to train: mini-batches come from ``data_rng``, so its state is saved too."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch_fn: BatchFn
    loss_fn: LossFn
    data_rng: torch.Generator

    def train_step(self) -> float:
        """One optimiser step on a fresh mini-batch; the mini-batch loss."""
        self.model.train()
        loss = self.loss_fn(self.model, self.batch_fn(self.data_rng))
        self.optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        self.optimizer.step()
        return float(loss.item())

    def state(self) -> bytes:
        """A checkpoint payload: model, optimizer, global RNGs and the data RNG."""
        return jobkit.torch_payload(self.model, self.optimizer, {"data_rng": self.data_rng.get_state()})

    def load(self, payload: bytes) -> None:
        """Restore what ``state()`` saved."""
        extra = jobkit.torch_restore(payload, self.model, self.optimizer)
        self.data_rng.set_state(extra["data_rng"])


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadSpec:
    """One model family and its default job size."""

    name: str
    title: str  # as SpeCon's Table II names it
    loss: str  # what the logged loss is
    steps: int
    batch_size: int
    lr: float
    make: Callable[[int, torch.device], Parts]  # batch size, device -> model, batch and loss functions


def _rows(n: int, batch_size: int) -> Callable[[torch.Generator], torch.Tensor]:
    def pick(gen: torch.Generator) -> torch.Tensor:
        return torch.randint(0, n, (batch_size,), generator=gen)

    return pick


def _make_vae(batch_size: int, device: torch.device) -> Parts:
    images = _digits().x.reshape(N_IMAGES, -1).to(device)
    pick = _rows(N_IMAGES, batch_size)

    def batch(gen: torch.Generator) -> Batch:
        return (images[pick(gen)],)

    def loss(model: nn.Module, b: Batch) -> torch.Tensor:
        logits, mu, log_var = model(b[0])
        return vae_loss(logits, b[0], mu, log_var)

    return VAE(inputs=IMAGE_SIZE * IMAGE_SIZE, hidden=400, latent=20), batch, loss


def _make_classifier(*, bidirectional: bool, hidden: int) -> Callable[[int, torch.device], Parts]:
    def make(batch_size: int, device: torch.device) -> Parts:
        x, y = _digits().x.to(device), _digits().y.to(device)
        pick = _rows(N_IMAGES, batch_size)

        def batch(gen: torch.Generator) -> Batch:
            idx = pick(gen)
            return x[idx], y[idx]  # rows of the image are the time steps

        def loss(model: nn.Module, b: Batch) -> torch.Tensor:
            return functional.cross_entropy(model(b[0]), b[1])

        model = SequenceClassifier(inputs=IMAGE_SIZE, hidden=hidden, classes=10, bidirectional=bidirectional)
        return model, batch, loss

    return make


def _make_gru(batch_size: int, device: torch.device) -> Parts:
    series = _waves().to(device)
    pick = _rows(N_WAVES, batch_size)

    def batch(gen: torch.Generator) -> Batch:
        s = series[pick(gen)]
        return s[:, :-1], s[:, 1:]

    def loss(model: nn.Module, b: Batch) -> torch.Tensor:
        return functional.mse_loss(model(b[0]), b[1])  # the quadratic loss

    return GRURegressor(hidden=64), batch, loss


def _make_dynrnn(batch_size: int, device: torch.device) -> Parts:
    seqs = _shapes()
    x, y = seqs.x.to(device), seqs.y.to(device)  # the lengths stay on the CPU, as packing wants
    pick = _rows(N_SHAPES, batch_size)

    def batch(gen: torch.Generator) -> Batch:
        idx = pick(gen)
        return x[idx], seqs.lengths[idx], y[idx]

    def loss(model: nn.Module, b: Batch) -> torch.Tensor:
        return functional.cross_entropy(model(b[0], b[1]), b[2])

    return DynamicRNN(inputs=1, hidden=64, classes=3), batch, loss


# Sized for ~40 steps per CPU second on one thread (bench/bench_workloads.py measures it).
WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            name="vae",
            title="Variational Autoencoder",
            loss="reconstruction",
            steps=2000,
            batch_size=512,
            lr=1e-3,
            make=_make_vae,
        ),
        WorkloadSpec(
            name="gru",
            title="Gated Recurrent Unit",
            loss="quadratic",
            steps=2000,
            batch_size=128,
            lr=1e-2,
            make=_make_gru,
        ),
        WorkloadSpec(
            name="birnn",
            title="Bidirectional RNN",
            loss="softmax",
            steps=2000,
            batch_size=64,
            lr=2e-3,
            make=_make_classifier(bidirectional=True, hidden=128),
        ),
        WorkloadSpec(
            name="rnn",
            title="Recurrent Network",
            loss="softmax",
            steps=2000,
            batch_size=128,
            lr=2e-3,
            make=_make_classifier(bidirectional=False, hidden=128),
        ),
        WorkloadSpec(
            name="dynrnn",
            title="Dynamic RNN",
            loss="softmax",
            steps=2000,
            batch_size=128,
            lr=1e-2,
            make=_make_dynrnn,
        ),
    )
}


def build(
    name: str,
    *,
    seed: int,
    batch_size: int | None = None,
    lr: float | None = None,
    device: str | torch.device = "cpu",
) -> Workload:
    """A fresh ``Workload`` of model ``name`` (see ``WORKLOADS``) on ``device``, seeded for
    repeatability.

    Seeds torch's global RNG (initialisation and the VAE's sampling noise draw from it; on a
    GPU the noise draws from CUDA's generator, which ``torch.manual_seed`` seeds too).
    """
    try:
        spec = WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}") from None
    batch_size = spec.batch_size if batch_size is None else batch_size
    lr = spec.lr if lr is None else lr
    if batch_size < 1 or lr <= 0:
        raise ValueError(f"batch size must be >= 1 and lr > 0, got {batch_size} and {lr}")
    torch.manual_seed(seed)
    model, batch_fn, loss_fn = spec.make(batch_size, torch.device(device))
    model.to(device)  # before the optimizer: its state follows the parameters
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    data_rng = torch.Generator().manual_seed(seed + 1)
    return Workload(name, model, optimizer, batch_fn, loss_fn, data_rng)
