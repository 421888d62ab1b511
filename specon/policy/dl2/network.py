"""The learned rule's networks, in numpy: an actor that scores each job and a critic that
values a worker's state.

* Actor: the same two-layer tanh perceptron applied to every job's feature row (so it is
  indifferent to the jobs' order and count), one score per job. The jobs run in the order
  of their scores; as a policy over orders it is Plackett-Luce: the first job is drawn by
  the softmax of the scores, the next among the rest, and so on.
* Critic: a one-hidden-layer perceptron over the worker's features pooled (mean, max, min
  per feature), estimating the return of a decision (``specon.sim.dl2.train``).

A weights file is a numpy ``.npz`` with the arrays and a JSON header: its format version and
the feature names it was trained on, so a file from another feature set is refused, never
silently misread.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from specon.policy.dl2.features import COUNT, NAMES

Matrix = npt.NDArray[np.float64]

FORMAT = "specon-dl2/1"
HIDDEN = 32
# The shipped weights (``specon learn`` on the default training set).
SHIPPED = "weights.npz"


class WeightsError(ValueError):
    """A weights file that cannot be used (missing, another format, other features)."""


@dataclass(slots=True)
class Network:
    """Actor (w1, b1, w2, b2, w3, b3) and critic (c1, d1, c2, d2) parameters."""

    w1: Matrix
    b1: Matrix
    w2: Matrix
    b2: Matrix
    w3: Matrix
    b3: Matrix
    c1: Matrix
    d1: Matrix
    c2: Matrix
    d2: Matrix

    @classmethod
    def initial(cls, seed: int, hidden: int = HIDDEN) -> Network:
        """Random weights (Glorot-scaled), reproducible from ``seed``."""
        rng = np.random.default_rng(seed)

        def layer(n_in: int, n_out: int) -> Matrix:
            return rng.normal(0.0, np.sqrt(2.0 / (n_in + n_out)), (n_in, n_out))

        return cls(
            w1=layer(COUNT, hidden),
            b1=np.zeros(hidden),
            w2=layer(hidden, hidden),
            b2=np.zeros(hidden),
            w3=layer(hidden, 1),
            b3=np.zeros(1),
            c1=layer(3 * COUNT, hidden),
            d1=np.zeros(hidden),
            c2=layer(hidden, 1),
            d2=np.zeros(1),
        )

    def params(self) -> dict[str, Matrix]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def copy(self) -> Network:
        return Network(**{k: v.copy() for k, v in self.params().items()})

    # -- actor -------------------------------------------------------------------------
    def scores(self, x: Matrix, *, exact: bool = False) -> Matrix:
        """One score per row of ``x`` (higher: runs earlier). Computed in single precision
        unless ``exact`` (the losses, whose gradients ``actor_grads`` gives): numpy's float32
        ``tanh`` is vectorised, which keeps a worker of 1,000 jobs inside the decision's 3 ms
        (double precision took 5-15 ms here), and scores only rank jobs."""
        if exact:
            h1 = np.tanh(x @ self.w1 + self.b1)
            h2 = np.tanh(h1 @ self.w2 + self.b2)
            return (h2 @ self.w3 + self.b3)[:, 0]
        # einsum, not BLAS: BLAS's threads spin on the other cores after every product, which
        # more than doubled a decision's CPU here for products this small.
        f = np.float32
        h1 = np.tanh(np.einsum("ij,jk->ik", x.astype(f), self.w1.astype(f)) + self.b1.astype(f))
        h2 = np.tanh(np.einsum("ij,jk->ik", h1, self.w2.astype(f)) + self.b2.astype(f))
        out: Matrix = (np.einsum("ij,j->i", h2, self.w3[:, 0].astype(f)) + f(self.b3[0])).astype(np.float64)
        return out

    def actor_grads(self, x: Matrix, d_scores: Matrix) -> dict[str, Matrix]:
        """The gradient of ``sum(d_scores * scores(x))`` with respect to the actor's weights."""
        h1 = np.tanh(x @ self.w1 + self.b1)
        h2 = np.tanh(h1 @ self.w2 + self.b2)
        ds = d_scores[:, None]
        dz2 = (ds @ self.w3.T) * (1.0 - h2**2)
        dz1 = (dz2 @ self.w2.T) * (1.0 - h1**2)
        return {
            "w3": h2.T @ ds,
            "b3": ds.sum(axis=0),
            "w2": h1.T @ dz2,
            "b2": dz2.sum(axis=0),
            "w1": x.T @ dz1,
            "b1": dz1.sum(axis=0),
        }

    # -- critic ------------------------------------------------------------------------
    def values(self, pooled: Matrix) -> Matrix:
        """The critic's estimate for each row of pooled worker features (``pool``)."""
        h = np.tanh(pooled @ self.c1 + self.d1)
        return (h @ self.c2 + self.d2)[:, 0]

    def critic_grads(self, pooled: Matrix, d_values: Matrix) -> dict[str, Matrix]:
        """The gradient of ``sum(d_values * values(pooled))`` for the critic's weights."""
        h = np.tanh(pooled @ self.c1 + self.d1)
        dv = d_values[:, None]
        dz = (dv @ self.c2.T) * (1.0 - h**2)
        return {"c2": h.T @ dv, "d2": dv.sum(axis=0), "c1": pooled.T @ dz, "d1": dz.sum(axis=0)}

    # -- files -------------------------------------------------------------------------
    def save(self, path: Path, **meta: object) -> None:
        """Write the weights and a header (``meta`` added to it: how they were trained)."""
        header = {"format": FORMAT, "features": list(NAMES), **meta}
        with open(path, "wb") as f:
            # numpy's stub types ``**kwds`` as its own flags, not as the arrays they are.
            save = cast(Any, np.savez_compressed)
            save(f, header=np.array(json.dumps(header)), **self.params())


def pool(x: Matrix) -> Matrix:
    """A worker's job rows pooled to one row: mean, max and min of each feature."""
    return np.concatenate([x.mean(axis=0), x.max(axis=0), x.min(axis=0)])


def read(path: Path) -> tuple[Network, dict[str, object]]:
    """The network in ``path`` and its header (``WeightsError`` where it cannot be used)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            arrays = {f.name: np.asarray(data[f.name], dtype=np.float64) for f in fields(Network)}
    except (OSError, KeyError, ValueError) as err:
        raise WeightsError(f"{path}: not a dl2 weights file ({err})") from None
    if header.get("format") != FORMAT:
        raise WeightsError(f"{path}: format {header.get('format')!r}, expected {FORMAT!r}")
    if tuple(header.get("features", ())) != NAMES:
        raise WeightsError(f"{path}: trained on other features ({header.get('features')})")
    net = Network(**arrays)
    hidden = net.w1.shape[1]
    expected = {
        "w1": (COUNT, hidden),
        "w2": (hidden, hidden),
        "w3": (hidden, 1),
        "c1": (3 * COUNT, hidden),
        "c2": (hidden, 1),
    }
    for name, shape in expected.items():
        if getattr(net, name).shape != shape:
            raise WeightsError(f"{path}: {name} has shape {getattr(net, name).shape}, expected {shape}")
    return net, header


def shipped_path() -> Path:
    """The weights shipped in the package."""
    return Path(str(resources.files("specon") / "data" / "dl2" / SHIPPED))


@lru_cache(maxsize=8)
def _cached(path: str, mtime_ns: int) -> Network:
    return read(Path(path))[0]


def load(path: str = "") -> Network:
    """The network of weights file ``path`` ("" for the shipped one), read once per version
    of the file."""
    p = Path(path) if path else shipped_path()
    try:
        mtime = p.stat().st_mtime_ns
    except OSError as err:
        raise WeightsError(f"{p}: {err.strerror or err}") from None
    return _cached(str(p), mtime)
