"""The cluster's memory of where jobs reach quality, per model: what the ``memory`` quality-point
estimate recalls (``specon.policy.quality_point``).

Each job that finishes is measured by its agent over the curve it logged (the share of its
steps at which it made 95 % of its loss reduction: ``quality_point.finished_share``) and
reported to the manager (``ContainerReport.quality_share``). The manager keeps, per model, the
newest ``PER_MODEL`` of them and sends every agent the median of each (``CommandBatch.quality``);
the simulator keeps the same memory for its agents. One model's jobs on a whole cluster are
what makes the median worth having: a worker alone sees few finish (docs/priority.md).

Bounds, so that no worker's reports (honest or not) outweigh the cluster's: a job counts once
(the digests of the newest ``SEEN`` jobs counted are kept, also past their model's window: an
agent reports an ended job for as long as its runtime lists it); one worker holds at most
``PER_WORKER`` of a model's entries (its own oldest make way); a model name is at most
``MODEL_CHARS`` printable characters (a Kubernetes label value's limit); at most ``MODELS``
models are kept, and a new one displaces the model with the fewest entries, the least
recently finished of those, so a flood of one-job models cannot push out a model the
cluster has learned. Jobs and workers are kept as short digests:
the journaled value stays under about 150 KiB. Pure: values in, values out.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Finished jobs remembered per model (the newest): a model's runs differ by seed and data.
PER_MODEL = 16
# A model's entries one worker may hold.
PER_WORKER = 4
# Models remembered: bounds the journal entry and the answer.
MODELS = 128
# The longest model name remembered (a Kubernetes label value's limit).
MODEL_CHARS = 63
# Jobs remembered as counted (their digests), the newest.
SEEN = 2048

# One finished job: its digest, its worker's digest, and its quality point as a share of its steps.
Entry = tuple[str, str, float]


def digest(name: str, size: int = 16) -> str:
    """A short, stable digest of ``name`` (``size`` hex digits)."""
    return hashlib.blake2b(name.encode(), digest_size=size // 2).hexdigest()


def model_ok(model: str) -> bool:
    """Whether ``model`` names a model the memory keeps (non-empty, printable, short)."""
    return 0 < len(model) <= MODEL_CHARS and model.isprintable()


@dataclass(frozen=True, slots=True)
class QualityMemory:
    """Per model, its newest finished jobs, oldest first (the dict in order of each model's
    latest finish); ``version`` is bumped by every change (an agent holding it needs nothing)."""

    version: int = 0
    jobs: Mapping[str, tuple[Entry, ...]] = field(default_factory=dict)
    seen: tuple[str, ...] = ()  # the digests of the newest jobs counted, oldest first
    _seen: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_seen", frozenset(self.seen))  # every heartbeat asks ``counted``

    def counted(self, job: str) -> bool:
        """Whether ``job`` was counted (among the newest ``SEEN``)."""
        return digest(job) in self._seen

    def finished(self, model: str, job: str, share: float, worker: str = "") -> QualityMemory | None:
        """This memory with ``job`` of ``model`` finished on ``worker`` at ``share`` of its
        steps; None when nothing changes (counted before, a share outside [0, 1], a model
        name ``model_ok`` refuses)."""
        if not (math.isfinite(share) and 0 <= share <= 1) or not model_ok(model):
            return None
        key, by = digest(job), digest(worker, 8)
        if key in self._seen:
            return None
        mine = list(self.jobs.get(model, ()))
        if sum(w == by for _, w, _ in mine) >= PER_WORKER:
            mine.remove(next(e for e in mine if e[1] == by))  # the worker's own oldest
        mine = [*mine, (key, by, share)][-PER_MODEL:]
        jobs = {k: v for k, v in self.jobs.items() if k != model}
        if len(jobs) >= MODELS:  # the fewest entries, then the least recently finished, goes
            del jobs[min(jobs, key=lambda m: len(jobs[m]))]
        jobs[model] = tuple(mine)
        return QualityMemory(self.version + 1, jobs, (*self.seen[-(SEEN - 1) :], key))

    def share(self, model: str) -> float | None:
        """``model``'s median share: what the ``memory`` estimate recalls (None: none kept)."""
        got = self.jobs.get(model)
        return statistics.median(s for _, _, s in got) if got else None

    def shares(self) -> dict[str, float]:
        """Each model's median share."""
        return {model: s for model in self.jobs if (s := self.share(model)) is not None}

    def to_text(self) -> str:
        jobs = {k: [list(e) for e in v] for k, v in self.jobs.items()}
        body = {"version": self.version, "jobs": jobs, "seen": list(self.seen)}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"))

    @staticmethod
    def from_text(text: str | None) -> QualityMemory:
        """The memory journaled as ``to_text`` (empty for none); ``ValueError`` if unreadable."""
        if text is None:
            return QualityMemory()
        try:
            raw: Any = json.loads(text)
            version = int(raw["version"])
            jobs = {
                str(model): tuple((str(j), str(w), float(s)) for j, w, s in entries)
                for model, entries in raw["jobs"].items()
            }
            seen = tuple(str(k) for k in raw.get("seen", ()))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"unreadable quality memory: {exc}") from None
        if version < 0 or any(not (0 <= s <= 1) for got in jobs.values() for _, _, s in got):
            raise ValueError("unreadable quality memory: a version below 0 or a share outside [0, 1]")
        return QualityMemory(version, jobs, seen)


def recall(shares: Mapping[str, float], model: str | None) -> float | None:
    """``model``'s median share (``QualityMemory.shares``, as an agent holds them); None: none
    of its jobs finished yet, or the job names no model."""
    return None if model is None else shares.get(model)
