"""Which metric a log is read for, and what to say when a log yields none (docs/logs.md).

The rule (``choose``): the configured metric (``ProgressConfig.metric``) when the log has a
column, key or tag of that name. When that is the default, ``loss``, and the log has no
``loss``, the first of ``FALLBACKS`` the log has; failing those, the first name the log
lists whose words end in ``loss`` (``mse_loss``, ``train/total_loss``; a split word such as
``_step`` or ``/train`` may follow), training ones before validation ones. A metric named on
purpose (not the default) is read under that name only.

A ``MetricChoice`` applies the rule to one log as it is read: the first header, record or
tag that offers a name the rule accepts decides, and the choice is kept for the rest of the
log (a metric that changed in mid-log would mix two curves). Until then it remembers the
names it was offered, so that a log that yields nothing can say what it had instead
(``no_records``).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

DEFAULT_METRIC = "loss"

# Step-level training loss first (the most samples, the freshest), then epoch-level
# training loss, then validation loss: Lightning's ``self.log("train_loss", on_step=True,
# on_epoch=True)`` gives ``train_loss_step``/``train_loss_epoch``, the Hugging Face Trainer's
# TensorBoard tags are ``train/loss``/``eval/loss``, Keras's are ``epoch_loss``.
FALLBACKS = (
    "train_loss_step",
    "train_loss",
    "train/loss",
    "training_loss",
    "train_loss_epoch",
    "epoch_loss",
    "val_loss",
    "val/loss",
    "eval_loss",
    "eval/loss",
    "validation_loss",
    "val_loss_epoch",
)
# Words that may follow ``loss`` in a name the rule accepts, and those that mark validation.
_SPLIT_WORDS = frozenset({"train", "training", "step", "epoch", "val", "valid", "validation", "eval", "test"})
_VALIDATION_WORDS = frozenset({"val", "valid", "validation", "eval", "test"})
_WORD = re.compile(r"[^a-z0-9]+")
# Names remembered for the message of a log that yields nothing.
MAX_SEEN = 200


def _words(name: str) -> list[str]:
    return [w for w in _WORD.split(name.lower()) if w]


def is_lossy(name: str) -> bool:
    """Whether ``name`` reads as a loss: ``loss`` is one of its words, and only split words
    (``train``, ``val``, ``step``, ``epoch``...) come after it (``loss_scale`` is no loss)."""
    words = _words(name)
    if "loss" not in words:
        return False
    last = len(words) - 1 - words[::-1].index("loss")
    return all(w in _SPLIT_WORDS for w in words[last + 1 :])


def is_validation(name: str) -> bool:
    return not _VALIDATION_WORDS.isdisjoint(_words(name))


def choose(requested: str, names: Iterable[str]) -> str | None:
    """The name to read among ``names`` (a header, a record's keys, tags), or None."""
    present = list(dict.fromkeys(names))
    if requested in present:
        return requested
    if requested != DEFAULT_METRIC:
        return None
    have = set(present)
    for name in FALLBACKS:
        if name in have:
            return name
    lossy = [n for n in present if is_lossy(n)]
    training = [n for n in lossy if not is_validation(n)]
    best = training or lossy
    return best[0] if best else None


class MetricChoice:
    """The metric of one log: asked for, chosen (once), and the names seen before the choice."""

    __slots__ = ("_seen", "chosen", "requested")

    def __init__(self, requested: str = DEFAULT_METRIC) -> None:
        self.requested = requested
        self.chosen: str | None = None
        self._seen: dict[str, None] = {}

    @property
    def metric(self) -> str:
        """The name being read: the chosen one, or the requested one until a choice is made."""
        return self.chosen or self.requested

    @property
    def fallback(self) -> bool:
        """Whether a name other than the requested one was chosen (the default's fallbacks)."""
        return self.chosen is not None and self.chosen != self.requested

    @property
    def seen(self) -> list[str]:
        """The names offered before a choice was made, in the order first seen (at most ``MAX_SEEN``)."""
        return list(self._seen)

    def offer(self, names: Iterable[str]) -> str | None:
        """The metric to read from a header, record or tag carrying ``names``: the choice, made
        now if these names allow it; None if not yet made."""
        if self.chosen is not None:
            return self.chosen
        names = [n for n in names if isinstance(n, str)]
        room = MAX_SEEN - len(self._seen)
        if room > 0:
            self._seen.update(dict.fromkeys(n for n in names[:room] if n not in self._seen))
        self.chosen = choose(self.requested, names)
        return self.chosen

    def describe(self) -> str:
        """How the metric was chosen, for people: ``train_loss_step (no 'loss' in the log)``."""
        if self.chosen is None:
            return f"{self.requested} (not found)"
        if self.fallback:
            return f"{self.chosen} (no {self.requested!r} in the log: the metric rule chose it)"
        return self.chosen


def nearest(name: str, names: Iterable[str]) -> str | None:
    """The name most like ``name`` (difflib), or None if none is close."""
    matches = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return matches[0] if matches else None


def no_records(choice: MetricChoice, *, kind: str) -> str:
    """Why a log yielded no records, for a person: what it had and the nearest name.

    ``kind`` names what the format calls its names (``columns``, ``keys``, ``tags``).
    """
    seen = choice.seen
    if choice.chosen is not None:
        return f"the {kind[:-1]} {choice.chosen!r} holds no finite number"
    if not seen:
        return f"no {kind} with numbers found"
    listed = ", ".join(seen[:40]) + (f", ... ({len(seen)} in all)" if len(seen) > 40 else "")
    message = f"no {kind[:-1]} {choice.requested!r}; {kind} seen: {listed}"
    suggestion = nearest(choice.requested, seen)
    if suggestion is not None:
        return f"{message}; did you mean --metric {suggestion}?"
    return f"{message}; choose one with --metric NAME"
