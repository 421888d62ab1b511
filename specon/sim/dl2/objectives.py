"""The learned rule's losses and their gradients over a batch of decisions (pure numpy).

A decision is a worker's jobs (feature rows) and the order taken. Its log-probability
under the actor is Plackett-Luce's over the first ``top`` places (with near-strict weights
only the first places change who gets the CPU); imitation maximises it for the teacher's
order (cross-entropy), the actor-critic step follows advantage x its gradient plus an
entropy bonus on the first place (exploration), and the critic regresses the return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specon.policy.dl2.features import Matrix
from specon.policy.dl2.network import Network, pool


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of the rule on one worker: its jobs' features, the order taken (indices
    into the rows, first runs first), when, and which jobs (to score the outcome)."""

    x: Matrix
    order: tuple[int, ...]
    now: float
    ids: tuple[str, ...]


def softmax(s: Matrix) -> Matrix:
    e = np.exp(s - s.max())
    out: Matrix = e / e.sum()
    return out


def log_prob(s: Matrix, order: Sequence[int], top: int) -> tuple[float, Matrix]:
    """Plackett-Luce log-probability of ``order``'s first ``top`` places under scores
    ``s``, and its gradient with respect to ``s``."""
    grad = np.zeros_like(s)
    rest = np.asarray(order)
    lp = 0.0
    for _ in range(min(top, len(order) - 1)):
        p = softmax(s[rest])
        lp += float(np.log(max(p[0], 1e-300)))
        grad[rest] -= p
        grad[rest[0]] += 1.0
        rest = rest[1:]
    return lp, grad


def entropy(s: Matrix) -> tuple[float, Matrix]:
    """Entropy of the first place's distribution, and its gradient with respect to ``s``."""
    p = softmax(s)
    logp = np.log(np.maximum(p, 1e-300))
    h = float(-(p * logp).sum())
    return h, -p * (logp + h)


@dataclass(frozen=True, slots=True)
class Batch:
    """Decisions stacked for one pass of the network."""

    x: Matrix  # every decision's rows, one after the other
    bounds: tuple[tuple[int, int], ...]  # each decision's rows
    pooled: Matrix  # one pooled row per decision (the critic's input)


def stack(decisions: Sequence[Decision]) -> Batch:
    bounds: list[tuple[int, int]] = []
    at = 0
    for d in decisions:
        bounds.append((at, at + len(d.x)))
        at += len(d.x)
    return Batch(
        x=np.concatenate([d.x for d in decisions]),
        bounds=tuple(bounds),
        pooled=np.stack([pool(d.x) for d in decisions]),
    )


def imitation(
    net: Network, decisions: Sequence[Decision], top: int
) -> tuple[float, float, dict[str, Matrix]]:
    """Mean cross-entropy of the teacher's orders, the share whose first job the actor
    ranks first, and the loss's gradient (for descent)."""
    batch = stack(decisions)
    s = net.scores(batch.x, exact=True)
    d_s = np.zeros_like(s)
    loss, hits = 0.0, 0
    for d, (a, b) in zip(decisions, batch.bounds, strict=True):
        lp, g = log_prob(s[a:b], d.order, top)
        loss -= lp
        d_s[a:b] -= g
        hits += int(np.argmax(s[a:b]) == d.order[0])
    n = len(decisions)
    return loss / n, hits / n, net.actor_grads(batch.x, d_s / n)


def actor_critic(
    net: Network,
    decisions: Sequence[Decision],
    returns: Matrix,
    *,
    top: int,
    entropy_weight: float,
) -> tuple[dict[str, Matrix], float, float]:
    """Gradients (for descent) of the policy-gradient loss with the critic as baseline and
    of the critic's squared error; also the critic's mean squared error and the mean
    entropy of the first place."""
    batch = stack(decisions)
    values = net.values(batch.pooled)
    adv = returns - values
    s = net.scores(batch.x, exact=True)
    d_s = np.zeros_like(s)
    ent = 0.0
    for k, (d, (a, b)) in enumerate(zip(decisions, batch.bounds, strict=True)):
        _, g = log_prob(s[a:b], d.order, top)
        h, dh = entropy(s[a:b])
        ent += h
        d_s[a:b] -= adv[k] * g + entropy_weight * dh
    n = len(decisions)
    grads = net.actor_grads(batch.x, d_s / n)
    err = values - returns
    grads.update(net.critic_grads(batch.pooled, 2.0 * err / n))
    return grads, float(np.mean(err**2)), ent / n


class Adam:
    """Adam over a network's parameters (Kingma and Ba; the usual defaults)."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.t = 0
        self.m: dict[str, Matrix] = {}
        self.v: dict[str, Matrix] = {}

    def step(self, net: Network, grads: dict[str, Matrix], clip: float = 5.0) -> None:
        norm = float(np.sqrt(sum(float((g**2).sum()) for g in grads.values())))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        self.t += 1
        for name, raw in grads.items():
            g = raw * scale
            m = self.m[name] = self.beta1 * self.m.get(name, np.zeros_like(g)) + (1 - self.beta1) * g
            v = self.v[name] = self.beta2 * self.v.get(name, np.zeros_like(g)) + (1 - self.beta2) * g**2
            m_hat = m / (1 - self.beta1**self.t)
            v_hat = v / (1 - self.beta2**self.t)
            param = getattr(net, name)
            param -= self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
