"""The classifiers: their registry, and the interface the agent and the simulator use,
whichever ``cfg.classifier``.

``CLASSIFIERS`` lists every classifier a policy may name (``monitor.classifier``), each
declared by its own module (``CLASSIFIER``: name, knobs, checks, tick;
``specon.policy.plugin.ClassifierKind``); the policy file's ``monitor`` section is built
from it (the choices, one sub-section per classifier with knobs, their help and checks),
and so is the command line's ``--classifier``. ``classifier_for(cfg)`` returns a
``Classifier`` bound to the monitor config; every classifier shares ``MonitorState`` (so
``mark_migrated``, ``answer_request`` and the serialised form are the same) and differs
only in its per-container ``tick``. ``tick_worker`` runs one tick for all containers of a
worker and then the worker-level request rule (SPEC §3.3).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from specon.model import ContainerId, Direction
from specon.policy import monitor, robust
from specon.policy.monitor import MonitorState
from specon.policy.plugin import ClassifierKind, TickFn, registry

if TYPE_CHECKING:  # the policy file's schema is built from this registry
    from specon.config import MonitorConfig

A = TypeVar("A")

# Every classifier, each declared in its own module (a new one is added here).
CLASSIFIERS: Mapping[str, ClassifierKind[Any]] = registry((monitor.CLASSIFIER, robust.CLASSIFIER))
NAMES: tuple[str, ...] = tuple(CLASSIFIERS)


def args_of(cfg: MonitorConfig, kind: ClassifierKind[A]) -> A:
    """``kind``'s knobs in ``cfg`` (its sub-section of ``monitor``)."""
    return cast(A, getattr(cfg, kind.name))


def horizon(total: float | None, done: float | None) -> float | None:
    """A job's horizon for a tick: the steps it declared over the steps it has done (>= 1);
    None when it declared none or has logged no step yet."""
    if total is None or done is None or not (math.isfinite(total) and math.isfinite(done)) or done <= 0:
        return None
    return max(1.0, total / done)


@dataclass(frozen=True, slots=True)
class WorkerTickResult:
    states: Mapping[ContainerId, MonitorState]
    # Containers whose request was raised on this tick (send at once). Requests still
    # pending from earlier ticks are not repeated here: see ``monitor.pending_requests``.
    requests: tuple[ContainerId, ...] = ()


def tick_worker(
    states: Mapping[ContainerId, MonitorState],
    samples: Mapping[ContainerId, Sequence[float]],
    now: float,
    cfg: MonitorConfig,
    *,
    nonfinite: Mapping[ContainerId, int] | None = None,
    horizons: Mapping[ContainerId, float] | None = None,
) -> WorkerTickResult:
    """One tick for every container on a worker, then the request rule.

    A container without an entry in ``samples`` had no new sample (a stale tick); one
    without an entry in ``horizons`` declared no length (``horizon``).
    Samples for a container without a state are a caller error (``ValueError``): the
    agent adds a container with ``initial`` before feeding it.
    """
    unknown = samples.keys() - states.keys()
    if unknown:
        raise ValueError(f"samples for containers without a monitor state: {sorted(unknown)}")
    tick = _tick_fn(cfg)
    get = samples.get
    if nonfinite or horizons:
        bad = (nonfinite or {}).get
        span = (horizons or {}).get
        ticked = {
            cid: tick(s, get(cid, ()), now, cfg, nonfinite=bad(cid, 0), horizon=span(cid))
            for cid, s in states.items()
        }
    else:
        ticked = {cid: tick(s, get(cid, ()), now, cfg) for cid, s in states.items()}
    new_states, requests = monitor.apply_request_rule(ticked, cfg)
    return WorkerTickResult(new_states, requests)


def _tick_fn(cfg: MonitorConfig) -> TickFn:
    try:
        return CLASSIFIERS[cfg.classifier].tick
    except KeyError:
        known = ", ".join(sorted(CLASSIFIERS))
        raise ValueError(f"unknown classifier {cfg.classifier!r} (known: {known})") from None


@dataclass(frozen=True, slots=True)
class Classifier:
    """One classifier bound to its config; every method is pure."""

    cfg: MonitorConfig
    _tick: TickFn = field(repr=False)

    @property
    def name(self) -> str:
        return self.cfg.classifier

    def initial(self, *, direction: Direction = Direction.MINIMIZE) -> MonitorState:
        return monitor.initial(direction=direction)

    def tick(
        self,
        state: MonitorState,
        samples: Sequence[float],
        now: float,
        *,
        nonfinite: int = 0,
        horizon: float | None = None,
    ) -> MonitorState:
        return self._tick(state, samples, now, self.cfg, nonfinite=nonfinite, horizon=horizon)

    def tick_worker(
        self,
        states: Mapping[ContainerId, MonitorState],
        samples: Mapping[ContainerId, Sequence[float]],
        now: float,
        *,
        nonfinite: Mapping[ContainerId, int] | None = None,
        horizons: Mapping[ContainerId, float] | None = None,
    ) -> WorkerTickResult:
        return tick_worker(states, samples, now, self.cfg, nonfinite=nonfinite, horizons=horizons)

    def mark_migrated(self, state: MonitorState, now: float) -> MonitorState:
        return monitor.mark_migrated(state, now)

    def answer_request(self, state: MonitorState) -> MonitorState:
        return monitor.answer_request(state)

    def to_dict(self, state: MonitorState) -> dict[str, Any]:
        """The state as plain data (``monitor.to_dict``: the one codec, ``specon.wire.codec``)."""
        return monitor.to_dict(state)

    def from_dict(self, d: Mapping[str, Any]) -> MonitorState:
        return monitor.from_dict(d)


def classifier_for(cfg: MonitorConfig) -> Classifier:
    """The classifier ``cfg.classifier`` names; ``ValueError`` for an unknown name."""
    return Classifier(cfg, _tick_fn(cfg))
