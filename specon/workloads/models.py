"""The five model families of SpeCon's Table II, as small PyTorch modules."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from torch.nn.utils.rnn import pack_padded_sequence


class VAE(nn.Module):
    """A fully connected variational auto-encoder (the classic MNIST VAE shape)."""

    def __init__(self, *, inputs: int, hidden: int, latent: int) -> None:
        super().__init__()
        self.encode_hidden = nn.Linear(inputs, hidden)
        self.mean = nn.Linear(hidden, latent)
        self.log_var = nn.Linear(hidden, latent)
        self.decode_hidden = nn.Linear(latent, hidden)
        self.decode_out = nn.Linear(hidden, inputs)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Reconstruction logits, latent mean and log-variance."""
        h = functional.relu(self.encode_hidden(x))
        mu, log_var = self.mean(h), self.log_var(h)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * log_var)
        return self.decode_out(functional.relu(self.decode_hidden(z))), mu, log_var


def vae_loss(logits: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """Reconstruction (binary cross-entropy) plus KL divergence, summed per image, batch mean."""
    recon = functional.binary_cross_entropy_with_logits(logits, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + log_var - mu.pow(2) - log_var.exp())
    return (recon + kld) / x.shape[0]


class SequenceClassifier(nn.Module):
    """An LSTM reading a sequence (an image row by row) and classifying it; optionally
    bidirectional, classifying from both directions' final states."""

    def __init__(self, *, inputs: int, hidden: int, classes: int, bidirectional: bool) -> None:
        super().__init__()
        self.rnn = nn.LSTM(inputs, hidden, batch_first=True, bidirectional=bidirectional)
        self.out = nn.Linear(hidden * (2 if bidirectional else 1), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h_n, _) = self.rnn(x)  # h_n: (directions, batch, hidden)
        logits: torch.Tensor = self.out(torch.cat(list(h_n), dim=1))
        return logits


class GRURegressor(nn.Module):
    """A GRU predicting the next value of a series at every time step."""

    def __init__(self, *, hidden: int) -> None:
        super().__init__()
        self.rnn = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x.unsqueeze(-1))
        prediction: torch.Tensor = self.out(y)
        return prediction.squeeze(-1)


class DynamicRNN(nn.Module):
    """An LSTM over variable-length sequences (packed, so padding is never read)."""

    def __init__(self, *, inputs: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(inputs, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _, (h_n, _) = self.rnn(packed)  # the state after each sequence's own last element
        logits: torch.Tensor = self.out(h_n[-1])
        return logits
