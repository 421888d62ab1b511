"""Leader election on a ``coordination.k8s.io/v1`` Lease: the decisions alone, no I/O and no
clock (every time is passed in), so they are tested with a fake clock.

The semantics are client-go's (``k8s.io/client-go/tools/leaderelection``, what
kube-controller-manager and the descheduler use):

* the Lease's spec is the record: ``holderIdentity``, ``leaseDurationSeconds``,
  ``acquireTime``, ``renewTime``, ``leaseTransitions``;
* a candidate judges expiry by **its own clock**: the record is expired once it has not
  changed for ``leaseDurationSeconds`` since this candidate first saw it as it is
  (``observe``). Clocks of different hosts are never compared; only their rates must agree;
* an empty ``holderIdentity`` is a released lease: anyone may take it at once;
* every write carries the ``resourceVersion`` read (or is a create): of two candidates that
  try at once, the API server lets one through and answers the other 409 (``leader.py``);
* the leader renews every ``retry_period`` and stops acting as leader when it could not
  renew for ``renew_deadline`` (``holds``): that is shorter than the lease, so it has stopped
  before any other candidate can judge the lease expired.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# client-go's JitterFactor: candidates wait retry_period * [1, 1.2) between tries, and the
# renew deadline must leave room for a retry.
JITTER = 1.2
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"  # metav1.MicroTime as the API server writes it


@dataclass(frozen=True, slots=True)
class Timing:
    """How long a lease lasts and how often it is renewed or tried, in seconds.

    The defaults replace a SIGKILLed leader within ``lease_duration + 2 * retry_period`` =
    10 s (expiry as seen by the standby, plus up to one retry for it to see the last renew
    and one for its next try), leaving room within 15 s for the new leader to read the
    journal and for the agents' retries to reach it. kube-controller-manager's 15/10/2 s
    would take up to ~19 s. The 3 s between the renew deadline and the lease bound a write
    already sent when the leader stops (see ``leader.FencedJournal``).
    """

    lease_duration: float = 8.0
    renew_deadline: float = 5.0
    retry_period: float = 1.0

    def problems(self) -> list[str]:
        """What is wrong with these values (client-go's rules); empty when they are usable."""
        out = [
            f"{name} must be > 0, got {value}"
            for name, value in (
                ("lease duration", self.lease_duration),
                ("renew deadline", self.renew_deadline),
                ("retry period", self.retry_period),
            )
            if not value > 0
        ]
        if out:
            return out
        if self.lease_duration != int(self.lease_duration) or self.lease_duration < 1:
            out.append(
                f"lease duration must be whole seconds >= 1 (leaseDurationSeconds), got {self.lease_duration}"
            )
        if self.lease_duration <= self.renew_deadline:
            out.append(
                f"lease duration ({self.lease_duration}) must be greater than the renew deadline "
                f"({self.renew_deadline})"
            )
        if self.renew_deadline <= JITTER * self.retry_period:
            out.append(
                f"renew deadline ({self.renew_deadline}) must be greater than {JITTER} x the retry "
                f"period ({self.retry_period})"
            )
        return out


@dataclass(frozen=True, slots=True)
class Record:
    """A Lease's spec. ``holder`` empty: nobody holds it (released, or never held)."""

    holder: str = ""
    duration: int = 0  # leaseDurationSeconds
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> Record:
        """The record of a Lease object; a field that is missing or of the wrong type (a
        Lease edited by hand) takes its default, so a damaged lease reads as expired."""
        spec = lease.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}

        def text(key: str) -> str | None:
            value = spec.get(key)
            return value if isinstance(value, str) else None

        def number(key: str) -> int:
            value = spec.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        return cls(
            holder=text("holderIdentity") or "",
            duration=number("leaseDurationSeconds"),
            acquire_time=text("acquireTime"),
            renew_time=text("renewTime"),
            transitions=number("leaseTransitions"),
        )

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time is not None:
            out["acquireTime"] = self.acquire_time
        if self.renew_time is not None:
            out["renewTime"] = self.renew_time
        return out


@dataclass(frozen=True, slots=True)
class Seen:
    """A record as a candidate last read it: its ``resourceVersion`` (for the next write) and
    ``since``, the candidate's monotonic time when it first saw the record as it is."""

    record: Record
    version: str
    since: float

    @property
    def expires(self) -> float:
        """When, on this candidate's clock, the record is expired if it does not change."""
        return self.since + self.record.duration


def observe(prev: Seen | None, record: Record, version: str, now: float) -> Seen:
    """``record`` read at ``now``: its expiry runs from when it last changed as seen here."""
    if prev is not None and prev.record == record:
        return Seen(record, version, prev.since)
    return Seen(record, version, now)


@dataclass(frozen=True, slots=True)
class Acquire:
    """Take the lease: create it (``create``) or update the record read."""

    create: bool = False


@dataclass(frozen=True, slots=True)
class Renew:
    """Ours: write a new renewTime."""


@dataclass(frozen=True, slots=True)
class Follow:
    """Another candidate holds a lease that has not expired: try again later."""

    holder: str
    expires_in: float


Decision = Acquire | Renew | Follow


def decide(identity: str, seen: Seen | None, now: float) -> Decision:
    """What the candidate ``identity`` does with the lease it read (None: there is none)."""
    if seen is None:
        return Acquire(create=True)
    record = seen.record
    if record.holder == identity:
        return Renew()
    if not record.holder or now >= seen.expires:
        return Acquire()
    return Follow(record.holder, seen.expires - now)


def micro_time(wall: float) -> str:
    """``wall`` (seconds since the epoch) as a metav1.MicroTime."""
    return dt.datetime.fromtimestamp(wall, dt.UTC).strftime(_MICRO_TIME)


def claimed(identity: str, seen: Seen | None, timing: Timing, wall: float) -> Record:
    """The record ``identity`` writes to take or renew the lease at wall-clock ``wall``: a
    new holder counts a transition and stamps its acquireTime; a renewal keeps both."""
    now = micro_time(wall)
    old = seen.record if seen is not None else None
    duration = int(timing.lease_duration)
    if old is not None and old.holder == identity:
        return Record(identity, duration, old.acquire_time or now, now, old.transitions)
    transitions = 0 if old is None else old.transitions + 1
    return Record(identity, duration, now, now, transitions)


def released(record: Record, wall: float) -> Record:
    """The record a leader leaves on a graceful stop (client-go's ReleaseOnCancel): nobody
    holds it, so a standby takes it at its next try instead of waiting for the expiry."""
    now = micro_time(wall)
    return Record("", 1, now, now, record.transitions)


def holds(renewed: float | None, timing: Timing, now: float) -> bool:
    """Whether a leader whose last successful write was *sent* at ``renewed`` (monotonic)
    may still act: the lease it renewed cannot have expired for anyone before
    ``renewed + lease_duration``; it stops at the earlier renew deadline."""
    return renewed is not None and now - renewed < timing.renew_deadline
