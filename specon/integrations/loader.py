"""``ResumableLoader``: a torch ``DataLoader`` that a Lightning job resumes mid-epoch.

Lightning (2.6) saves a train loader's ``state_dict()`` in its checkpoints and hands it back
to ``load_state_dict()`` on resume, but only for loaders that have them. A plain
``DataLoader`` restarts its epoch from the first batch, with a new shuffle, while the step
count goes on: a job resumed mid-epoch trains some samples twice and others not at all.
This loader's state is its epoch's shuffle seed and the batches trained from it; resumed, it
draws the same permutation and skips those batches. The skip reads them (it goes through
the loader's own iterator), so it costs their loading, not their training.

What it cannot restore: random transforms inside worker processes (``num_workers > 0``) are
seeded afresh, and a custom sampler's order is reproduced only if the sampler itself is
deterministic (a ``RandomSampler``, which ``shuffle=True`` makes, is re-seeded here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

_END = object()


class ResumableLoader(DataLoader[Any]):
    """A ``DataLoader`` (same arguments) with ``state_dict``/``load_state_dict``.

    ``in_hand``: batches handed out but not trained yet, left out of the saved position
    (``specon.integrations.lightning.Migratable`` sets it around the checkpoints it takes
    before a step).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_hand = 0
        self._seed: int | None = None
        self._handed = 0
        self._resume: tuple[int | None, int] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator, not a _BaseDataLoaderIter
        seed, skip = self._resume if self._resume is not None else (None, 0)
        self._resume = None
        if seed is None:
            # What a RandomSampler draws for itself: from the loader's generator, else the global one.
            seed = int(torch.empty((), dtype=torch.int64).random_(generator=self.generator).item())
        self._seed = seed
        if isinstance(self.sampler, RandomSampler):
            self.sampler.generator = torch.Generator().manual_seed(seed)
        iterator = super().__iter__()
        self._handed = 0
        for _ in range(skip):
            if next(iterator, _END) is _END:
                break
            self._handed += 1
        return self._counted(iterator)

    def _counted(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for batch in iterator:
            self._handed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """``{"seed", "position"}``: this epoch's shuffle seed and the batches trained from it."""
        return {"seed": self._seed, "position": max(0, self._handed - self.in_hand)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration resumes the saved epoch at its saved position."""
        seed = state.get("seed")
        self._resume = (int(seed) if seed is not None else None, int(state.get("position", 0)))
