"""The limits a protocol field declares beyond its type, and the named bounds they use.

A message field (``specon.wire.protocol``) states its limit once, in its metadata::

    sent_at: float = field(metadata=limit(TIME))

Two things are derived from these declarations and from nothing else: the checks every
decoded message passes (``specon.wire.checks``) and the schema keywords of the manager's
OpenAPI document (``specon_manager.openapi``). The kinds:

* ``Id``: the one id rule (``specon.wire.validate``);
* ``Range``: a number within ``[lo, hi]``, both included (NaN and infinities fail);
* ``Finite``: a finite number;
* ``Text``: a string of at most ``max_length`` characters;
* ``Labels``: a string map, bounded in size, its keys non-empty printable and bounded, its
  values bounded;
* ``Taints``: taints or tolerations (``key[=value][:Effect]``), bounded in number and length,
  each non-empty printable;
* ``Items``: a list of records, at most ``max_items`` of them and/or no two with the same
  ``unique`` attribute.

``specon.model.Resources`` is not the protocol's own (the model knows nothing of the wire),
so the limits of its fields are declared here, in ``BORROWED``; ``limit_of`` reads both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specon.model import Resources
from specon.policy import quality_memory
from specon.wire.validate import MAX_SECONDS


@dataclass(frozen=True, slots=True)
class Id:
    """The one id rule; the error names the id by its type (``WorkerId``: "worker id")."""


@dataclass(frozen=True, slots=True)
class Range:
    lo: float
    hi: float
    time: bool = False  # says "a time within ±hi s" when refused


@dataclass(frozen=True, slots=True)
class Finite:
    """A finite number: JSON has no other, but a message built in Python might."""


@dataclass(frozen=True, slots=True)
class Text:
    max_length: int


@dataclass(frozen=True, slots=True)
class Labels:
    max_count: int
    max_key: int
    max_value: int


@dataclass(frozen=True, slots=True)
class Taints:
    max_count: int
    max_length: int


@dataclass(frozen=True, slots=True)
class Items:
    max_items: int | None = None
    unique: str | None = None  # the attribute no two items may share


Limit = Id | Range | Finite | Text | Labels | Taints | Items

# Bounds that no honest agent reaches; each keeps one message from costing the manager
# unbounded memory or time.
MAX_SEQ = 2**63 - 1
MAX_CPU = 1e6  # cores
MAX_BYTES = 2**60
MAX_GPU = 1_000_000
MAX_TEXT = 4096  # error messages, paths
MAX_SHORT_TEXT = 512  # an address, a command id
MAX_LABELS = 128
MAX_LABEL_KEY = 317  # a Kubernetes label key: 253 prefix + "/" + 63 name
MAX_LABEL_VALUE = 1024
MAX_RESULTS = 1000
# A taint or toleration, ``key[=value][:Effect]``: a label key, a 63-character value, an effect.
MAX_TAINT = MAX_LABEL_KEY + 1 + 63 + 1 + 16
MAX_TAINTS = MAX_LABELS
MAX_POLL_WAIT = 3600.0
# A job's loss window (``specon.wire.status.LossWindow``): points, and steps a second no job reaches.
MAX_WINDOW_POINTS = 64
MAX_STEP_RATE = 1e9
# GPUs of one worker (NVML indexes up to 64 on the largest hosts) and the devices of one job.
MAX_GPU_DEVICES = 64
# Models in a batch's quality points: as many as the manager remembers.
MAX_QUALITY_MODELS = quality_memory.MODELS

# The limits many fields share.
ID = Id()
TIME = Range(-MAX_SECONDS, MAX_SECONDS, time=True)
COUNT = Range(0, MAX_SEQ)
FINITE = Finite()
TEXT = Text(MAX_TEXT)
SHORT_TEXT = Text(MAX_SHORT_TEXT)
LABELS = Labels(MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE)
TAINTS = Taints(MAX_TAINTS, MAX_TAINT)
BYTES = Range(0, MAX_BYTES)

BORROWED: Mapping[type[Any], Mapping[str, Limit]] = {
    Resources: {"cpu": Range(0, MAX_CPU), "memory": Range(0, MAX_BYTES), "gpu": Range(0, MAX_GPU)},
}

_KEY = "limit"


def limit(rule: Limit) -> dict[str, Limit]:
    """Field metadata declaring ``rule``: ``field(metadata=limit(TIME))``."""
    return {_KEY: rule}


def limit_of(cls: type[Any], f: dataclasses.Field[Any]) -> Limit | None:
    """The limit field ``f`` of ``cls`` declares, if any."""
    rule: Limit | None = f.metadata.get(_KEY)
    return rule if rule is not None else BORROWED.get(cls, {}).get(f.name)
