"""From timing records to the model's inputs and back: pure, no I/O and no clock.

``service_times`` reads a **one-worker** run (the PS's ``update`` records and the worker's
``minibatch`` records, as ``server`` and ``worker`` write them) and measures the four mean
service times of Section III-A, per mini-batch ``i`` of the worker:

- worker:   ``compute_end[i] - recv_end[i]`` (the parameters fully in, to the gradient ready);
- uplink:   PS ``recv_end[i] - compute_end[i]`` (sending starts, to the last byte at the PS);
- server:   PS ``apply_end[i] - recv_end[i]`` (the hand-over to the updater, the update, the
  snapshot of the parameters);
- downlink: ``recv_end[i+1] - PS apply_end[i]`` (the reply's first byte sent, to its last in).

The four tile the worker's cycle with no gap, so the model with one worker gives back the
measured one-worker throughput. Stamps from two processes are compared: they must share a
clock (``time.monotonic()`` of one machine: the network namespaces here; across machines
the paper's ``tcpdump`` of both ends, or synchronised clocks, would be needed).

``measured_throughput`` is the throughput at the PS over a steady window: the updates whose
``apply_end`` falls ``warmup`` seconds after every worker joined, ``(n - 1) / (last - first)``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specon.sim.asgd.mva import ServiceTimes

Record = Mapping[str, Any]
STATIONS = ("worker", "uplink", "server", "downlink")


class ProfileError(ValueError):
    """The records cannot give a profile (too few, several workers, inconsistent stamps)."""


@dataclass(frozen=True, slots=True)
class Profile:
    """The mean service times of a one-worker run and how they were measured."""

    times: ServiceTimes
    samples: int  # mini-batches averaged
    stdev: Mapping[str, float]  # per station, seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "worker": self.times.worker,
            "uplink": self.times.uplink,
            "server": self.times.server,
            "downlink": self.times.downlink,
            "samples": self.samples,
            "stdev": dict(self.stdev),
        }


def _float(rec: Record, key: str) -> float:
    value = rec.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ProfileError(f"record {dict(rec)!r} has no number {key!r}")
    return float(value)


def _by_event(records: Iterable[Record], event: str) -> list[Record]:
    return [r for r in records if r.get("event") == event]


def service_times(ps: Iterable[Record], worker: Iterable[Record], *, skip: int = 3) -> Profile:
    """The four mean service times of a one-worker run; the first ``skip`` mini-batches (TCP
    and caches warming up) are left out."""
    updates = _by_event(ps, "update")
    batches = _by_event(worker, "minibatch")
    workers = {r.get("worker") for r in updates} | {r.get("worker") for r in batches}
    if len(workers) > 1:
        raise ProfileError(
            f"a profile needs a one-worker run; these records come from workers {sorted(map(str, workers))}"
        )
    if skip < 0:
        raise ProfileError(f"skip must be >= 0, got {skip}")
    update_of = {int(_float(r, "seq")): r for r in updates}
    batch_of = {int(_float(r, "seq")): r for r in batches}
    samples: dict[str, list[float]] = {s: [] for s in STATIONS}
    for seq in sorted(batch_of):
        if seq < skip or seq not in update_of or seq + 1 not in batch_of:
            continue
        b, u, nxt = batch_of[seq], update_of[seq], batch_of[seq + 1]
        values = {
            "worker": _float(b, "compute_end") - _float(b, "recv_end"),
            "uplink": _float(u, "recv_end") - _float(b, "compute_end"),
            "server": _float(u, "apply_end") - _float(u, "recv_end"),
            "downlink": _float(nxt, "recv_end") - _float(u, "apply_end"),
        }
        if any(v < 0 for v in values.values()):
            raise ProfileError(f"mini-batch {seq}: stamps out of order {values} (not one clock?)")
        for s, v in values.items():
            samples[s].append(v)
    n = len(samples["worker"])
    if n < 2:
        raise ProfileError(
            f"{n} complete mini-batch(es) after skipping {skip}: run the one-worker profile longer"
        )
    # A station faster than the clock's resolution still took some time: the model needs > 0.
    means = {s: max(statistics.fmean(v), 1e-6) for s, v in samples.items()}
    return Profile(
        ServiceTimes(means["worker"], means["uplink"], means["server"], means["downlink"]),
        n,
        {s: statistics.stdev(v) for s, v in samples.items()},
    )


@dataclass(frozen=True, slots=True)
class Rate:
    """Mini-batches per second at the PS over a window of ``updates`` updates."""

    throughput: float
    updates: int
    window: float  # seconds


def measured_throughput(ps: Iterable[Record], *, warmup: float) -> Rate:
    """The PS's steady throughput: updates applied ``warmup`` s after its clock started (its
    ``clock`` record: every expected worker joined), or else after its first update."""
    records = list(ps)
    ends = sorted(_float(r, "apply_end") for r in _by_event(records, "update"))
    if not ends:
        raise ProfileError("no update applied: nothing to measure")
    clocks = _by_event(records, "clock")
    start = _float(clocks[0], "t") if clocks else ends[0]
    steady = [t for t in ends if t >= start + warmup]
    if len(steady) < 3:
        raise ProfileError(
            f"{len(steady)} update(s) after a {warmup:g}s warm-up ({len(ends)} in all): run longer"
        )
    window = steady[-1] - steady[0]
    return Rate((len(steady) - 1) / window, len(steady), window)


def relative_error(predicted: float, measured: float) -> float:
    """|predicted - measured| / measured."""
    if measured <= 0:
        raise ProfileError(f"measured throughput must be positive, got {measured}")
    return abs(predicted - measured) / measured


def spread(errors: Sequence[float]) -> tuple[float, float, float]:
    """(max, mean, min) of ``errors``: a row of the paper's Table II."""
    if not errors:
        raise ProfileError("no error to summarise")
    return max(errors), statistics.fmean(errors), min(errors)
