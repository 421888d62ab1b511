"""What a pluggable piece of the decision code declares about itself, once.

Two kinds of things plug in: priority rules (``priority.rule``; ``Rule``, collected by
``specon.policy.priority.rules``) and convergence classifiers (``monitor.classifier``;
``ClassifierKind``, collected by ``specon.policy.classifier``). Each declares its name, a
few words for the list of choices, its knobs (a frozen dataclass whose fields carry their
help in ``metadata["doc"]``) with their defaults, the checks no type can express, and what
it does. The policy file is built from these declarations (``specon.config.sections``:
the section's choices, one sub-section per thing with knobs, the help strings and the
checks), and so are the command line's choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from specon.config import MonitorConfig
    from specon.model import ContainerId
    from specon.policy.monitor import MonitorState
    from specon.policy.priority.base import JobProgress

A = TypeVar("A")
P = TypeVar("P", bound="Plugin[Any]")


def no_problems(args: object) -> list[str]:
    """The checks of a thing whose knobs' types say everything."""
    return []


@dataclass(frozen=True, slots=True, kw_only=True)
class Plugin(Generic[A]):
    """What the policy file needs of a pluggable thing."""

    # Its value in the choosing key (``priority.rule``, ``monitor.classifier``), and the key
    # of its own section beside that key.
    name: str
    # A few words for the list of choices (the choosing key's help).
    summary: str
    # Its knobs: a frozen dataclass (each field's help in ``metadata["doc"]``), whose
    # ``args()`` are the defaults; None: it has none (and no section).
    args: type[A] | None = None
    # The help of its section.
    doc: str = ""
    # The checks of its knobs no type can express, each as ``field: problem``.
    problems: Callable[[A], list[str]] = no_problems
    # Its place among the choices (the policy file's order; ties by name).
    rank: int = 100


@dataclass(frozen=True, slots=True, kw_only=True)
class Rule(Plugin[A]):
    """A priority rule: a worker's jobs in, their CPU weights out (``specon.policy.priority``)."""

    # The jobs' CPU weights under the rule's knobs; None: it sets none (every job keeps the
    # runtime's default share).
    weights: Callable[[Sequence[JobProgress], A], dict[ContainerId, int]] | None
    # It reads Algorithm 1's gain: its agents classify even under a policy that never moves.
    needs_gain: bool = False
    # The catalogue has a peer policy of it (DS's placement, no moves, its weights).
    peer: bool = True


class TickFn(Protocol):
    """One classifier tick of one container (``specon.policy.classifier``)."""

    def __call__(
        self,
        state: MonitorState,
        samples: Sequence[float],
        now: float,
        cfg: MonitorConfig,
        *,
        nonfinite: int = 0,
        horizon: float | None = None,
    ) -> MonitorState: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassifierKind(Plugin[A]):
    """A convergence classifier (Algorithm 1's per-container tick; the state is shared)."""

    tick: TickFn


def registry(plugins: Iterable[P]) -> Mapping[str, P]:
    """``plugins`` by name, in rank order (ties by name); ``ValueError`` for a name used twice."""
    ordered = sorted(plugins, key=lambda p: (p.rank, p.name))
    names = [p.name for p in ordered]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"declared more than once: {', '.join(twice)}")
    return MappingProxyType({p.name: p for p in ordered})


def choices_doc(plugins: Iterable[Plugin[Any]], sep: str = ": ") -> str:
    """The choosing key's help: each name and its summary."""
    return "; ".join(f"{p.name}{sep}{p.summary}" for p in plugins)


def section_docs(section: str, plugins: Iterable[Plugin[Any]]) -> dict[str, str]:
    """The help of every plugin's section below ``section`` and of each of its knobs, keyed
    by their dotted path in the policy file."""
    out: dict[str, str] = {}
    for p in plugins:
        if p.args is None:
            continue
        out[f"{section}.{p.name}"] = p.doc
        for f in dataclasses.fields(p.args):
            out[f"{section}.{p.name}.{f.name}"] = str(f.metadata.get("doc", ""))
    return out
