"""Algorithm 1, the container monitor (SPEC §3), as a pure per-container state machine.

Every Δ the agent hands each container's new samples to ``tick``; the state that comes
back says the container's category, its last growth G and whether it wants a
reallocation request. The worker-level request rule (SPEC §3.3) needs the whole worker,
so it lives in ``apply_request_rule`` (``specon.policy.classifier.tick_worker`` runs
both). Nothing here reads a clock, a file or a logger: ``now`` is an argument.

The SPEC's readings of the printed pseudocode, all implemented here:

* tick 0 records E, tick 1 computes G and classifies nothing; classification starts when
  G(t_m) and G(t_{m-1}) both exist;
* the three ``if``s are exclusive branches and a slowing tick moves **one** step
  PC -> WC -> CC (lines 10-12 are a typo for WC -> CC); a slowing tick in CC wants a request;
* G exactly alpha resets to PC;
* a tick without samples is skipped (``stale: skip``) or repeats the previous E, i.e.
  G = 0 (``stale: zero``, paper mode);
* once ``migrated``, a container is frozen in CC and never classified or requests again.

G is an absolute difference, so the metric's direction does not matter to this
classifier (a rising accuracy slows down exactly like a falling loss); the direction is
still kept in the state because the ``robust`` classifier needs it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from specon.model import ACTIVE_CATEGORIES, Category, ContainerId, Direction
from specon.policy.plugin import ClassifierKind
from specon.wire import codec

if TYPE_CHECKING:  # the policy file's schema is built from the classifiers declared here
    from specon.config import Aggregate, MonitorConfig, Normalize

_PC, _WC, _CC, _DV = Category.PROGRESSING, Category.WATCHING, Category.CONVERGED, Category.DIVERGING

# A diverging job is still training and occupies its worker like a progressing one, so
# it counts towards the request rule's "active" containers.
REQUEST_ACTIVE = ACTIVE_CATEGORIES | {_DV}

STATE_FORMAT = 1


@dataclass(frozen=True, slots=True)
class MonitorState:
    """One container as the monitor sees it. Serialise with ``to_dict``/``from_dict``."""

    # The classification: PC, WC or CC (the robust classifier adds DIVERGING). Never
    # STALLED: that is a display flag on top (see ``display``), so a silent log cannot
    # make the monitor forget where the job was.
    category: Category = _PC
    direction: Direction = Direction.MINIMIZE
    ticks: int = 0
    # E(t_{m-1}) and G(t_{m-1}); None until the first / second tick with an E.
    last_e: float | None = None
    last_g: float | None = None
    # Largest |E| seen, the divisor of ``normalize: max``.
    max_abs_e: float = 0.0
    # Stale ticks in a row, and whether that run has reached ``stale_ticks``.
    stale_run: int = 0
    stalled: bool = False
    # Time of the latest WC -> CC step; kept after a reset to PC (history for metrics).
    t_cc: float | None = None
    # This tick was a slowing tick in CC: the classifier would like a request sent.
    wants_request: bool = False
    # A request was raised and the manager has not answered; the agent repeats it.
    pending_request: bool = False
    migrated: bool = False
    t_migrated: float | None = None
    # Only the robust classifier fills these (kept flat, not in a sub-object, because
    # every object built per container per tick counts at 10,000 containers):
    # the smoothed E of the last ``trend_window`` ticks with an E, oldest first (the
    # newest is the current EMA), and the last ``n`` "slow" votes, oldest first.
    smoothed: tuple[float, ...] = ()
    votes: tuple[bool, ...] = ()
    # The robust doubling test's running log-time fit (layout in ``specon.policy.robust``).
    fit: tuple[float, ...] = ()

    @property
    def display(self) -> Category:
        """The category to report: STALLED while the log is silent, else ``category``."""
        return Category.STALLED if self.stalled else self.category


def initial(*, direction: Direction = Direction.MINIMIZE) -> MonitorState:
    """A new container: progressing, not migrated (Algorithm 1, initial settings)."""
    return MonitorState(direction=direction)


def aggregate_samples(samples: Sequence[float], how: Aggregate) -> float | None:
    """E(t_m) from the finite samples of one interval, or None if there are none."""
    n = len(samples)
    if n == 0:
        return None
    e = samples[-1] if how == "last" else sum(samples) / n
    if math.isfinite(e):
        return e
    # Rare path: a non-finite sample slipped through, or the plain sum overflowed.
    finite = [x for x in samples if math.isfinite(x)]
    if not finite:
        return None
    if how == "last":
        return finite[-1]
    e = sum(x / len(finite) for x in finite)
    return e if math.isfinite(e) else finite[-1]


def normalised_change(diff: float, previous: float, max_abs: float, normalize: Normalize) -> float:
    """|ΔE| made comparable with alpha: by the largest |E| seen, by |E(t_{m-1})|, or as is.

    A zero divisor falls back to the absolute difference so G stays finite on the wire.
    """
    diff = abs(diff)
    if normalize == "max" and max_abs > 0.0:
        g = diff / max_abs
    elif normalize == "previous" and previous != 0.0:
        g = diff / abs(previous)
    else:
        g = diff
    return g if g <= sys.float_info.max else sys.float_info.max


def _stale(state: MonitorState, cfg: MonitorConfig) -> MonitorState:
    """A tick with no sample under ``stale: skip``: only the stale counters move."""
    run = state.stale_run + 1
    return MonitorState(
        state.category,
        state.direction,
        state.ticks + 1,
        state.last_e,
        state.last_g,
        state.max_abs_e,
        run,
        0 < cfg.stale_ticks <= run,
        state.t_cc,
        False,
        state.pending_request,
        state.migrated,
        state.t_migrated,
        state.smoothed,
        state.votes,
        state.fit,
    )


def tick(
    state: MonitorState,
    samples: Sequence[float],
    now: float,
    cfg: MonitorConfig,
    *,
    nonfinite: int = 0,
    horizon: float | None = None,
) -> MonitorState:
    """One categorisation tick of Algorithm 1 for one container.

    ``samples`` are the values logged in (t_{m-1}, t_m]; non-finite ones are ignored
    (``nonfinite``, their count, and ``horizon``, the job's declared length, are accepted for
    interface parity with ``robust`` and unused here: the paper knows neither). The states
    are built positionally: this runs for every container every Δ and
    ``dataclasses.replace`` would triple its cost.
    """
    del nonfinite, horizon
    if state.migrated:
        return state
    e = aggregate_samples(samples, cfg.aggregate)
    if e is None:
        if cfg.stale == "skip" or state.last_e is None:
            return _stale(state, cfg)
        # Paper mode: "the previous value will be returned", so G = 0.
        e = state.last_e
        run = state.stale_run + 1
    else:
        run = 0
    stalled = 0 < cfg.stale_ticks <= run
    max_abs = state.max_abs_e if state.max_abs_e >= abs(e) else abs(e)
    category, t_cc, pending, wants = state.category, state.t_cc, state.pending_request, False
    last_e = state.last_e
    if last_e is None:  # tick 0: record E
        g: float | None = None
    else:
        g = normalised_change(e - last_e, last_e, max_abs, cfg.normalize)
        gp = state.last_g
        if gp is not None:  # tick >= 2: classify
            if g >= cfg.alpha:
                category, pending = _PC, False
            elif g < gp:  # slowing: one step
                if category is _PC:
                    category = _WC
                elif category is _WC:
                    category, t_cc = _CC, now
                elif category is _CC:
                    wants = True
                else:  # a state from the robust classifier: start over
                    category = _PC
            # else bouncing: stay
    return MonitorState(
        category,
        state.direction,
        state.ticks + 1,
        e,
        g,
        max_abs,
        run,
        stalled,
        t_cc,
        wants,
        pending,
        False,
        None,
        state.smoothed,
        state.votes,
        state.fit,
    )


# ``classifier: specon`` (``specon.policy.classifier``); no knobs of its own.
CLASSIFIER: ClassifierKind[None] = ClassifierKind(
    name="specon", summary="Algorithm 1 as printed (repaired)", tick=tick, rank=10
)


def raise_request(state: MonitorState) -> MonitorState:
    """Turn a wanted request into a pending one (the caller checked the request rule)."""
    if state.pending_request or not state.wants_request or state.migrated:
        return state
    return replace(state, pending_request=True)


def answer_request(state: MonitorState) -> MonitorState:
    """The manager answered without marking the container (e.g. no capacity): clear it.

    A later slowing tick in CC may request again.
    """
    return replace(state, pending_request=False, wants_request=False)


def mark_migrated(state: MonitorState, now: float) -> MonitorState:
    """The manager decided for this container (moved or told to stay): freeze it in CC."""
    return replace(
        state,
        category=_CC,
        t_cc=state.t_cc if state.t_cc is not None else now,
        pending_request=False,
        wants_request=False,
        stalled=False,
        migrated=True,
        t_migrated=now,
    )


def is_request_active(state: MonitorState) -> bool:
    """Whether the container counts as active training for the request rule."""
    return not state.migrated and state.category in REQUEST_ACTIVE


def _count_active(states: Iterable[MonitorState]) -> int:
    return sum(1 for s in states if is_request_active(s))


def apply_request_rule(
    states: Mapping[ContainerId, MonitorState], cfg: MonitorConfig
) -> tuple[dict[ContainerId, MonitorState], tuple[ContainerId, ...]]:
    """SPEC §3.3-4 over one worker's freshly ticked states.

    A container that wants a request gets one only if at least ``request_min_active``
    containers on the worker are active (PC or WC; paper mode 2, i.e. |PC|+|WC| > 1).
    Returns the new states and the ids whose request was raised now; a request already
    pending is not raised again (the agent repeats pending ones in its heartbeats).
    """
    out = dict(states)
    wanting = [cid for cid, s in states.items() if s.wants_request and not s.pending_request]
    if not wanting or _count_active(states.values()) < cfg.request_min_active:
        return out, ()
    for cid in wanting:
        out[cid] = raise_request(states[cid])
    return out, tuple(wanting)


def pending_requests(states: Mapping[ContainerId, MonitorState]) -> tuple[ContainerId, ...]:
    """The ids whose request is still unanswered (to repeat in a heartbeat)."""
    return tuple(cid for cid, s in states.items() if s.pending_request)


# --- serialisation: the agent carries a state across a restore on another worker ---


def to_dict(state: MonitorState) -> dict[str, Any]:
    """A plain, JSON-ready dict (finite floats, strings, bools, lists), via ``specon.wire.codec``."""
    return {"format": STATE_FORMAT, **codec.to_data(state, MonitorState)}


class StateError(ValueError):
    """A serialised monitor state is malformed."""


def from_dict(d: Mapping[str, Any]) -> MonitorState:
    """Inverse of ``to_dict``; every problem is reported in one ``StateError``.

    Read through ``specon.wire.codec`` (a missing key takes its default; an unknown one, from a
    newer agent, is ignored), then the checks the types cannot say: a classifier category
    (never STALLED, a display flag) and non-negative counters.
    """
    if not isinstance(d, Mapping):
        raise StateError(f"monitor state: expected a mapping, got {codec.describe(d)}")
    data = dict(d)
    fmt = data.pop("format", STATE_FORMAT)
    errors: list[str] = []
    if fmt != STATE_FORMAT:
        errors.append(f"format: unsupported {fmt!r} (this build reads {STATE_FORMAT})")
    try:
        state = codec.from_data(MonitorState, data, strict=False)
    except codec.SchemaError as e:
        errors += map(str, e.problems)
        state = e.partial if isinstance(e.partial, MonitorState) else MonitorState()
    if state.category is Category.STALLED:
        errors.append(f"category: not a classifier category: {state.category.value!r}")
    errors += [f"{key}: must be >= 0, got {n}" for key, n in _counters(state) if n < 0]
    if errors:
        raise StateError("monitor state: " + "; ".join(errors))
    if state.max_abs_e < 0.0:  # a magnitude: older writers never wrote a negative one
        state = replace(state, max_abs_e=-state.max_abs_e)
    return state


def _counters(state: MonitorState) -> tuple[tuple[str, int], ...]:
    return (("ticks", state.ticks), ("stale_run", state.stale_run))
