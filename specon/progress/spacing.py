"""Where records without timestamps sit in time, for ``specon classify`` (docs/logs.md).

The agent times each record by the poll that read it; a finished log read afterwards has
lost that, and most frameworks' logs carry no time (Keras and Lightning CSV, the Trainer's
``trainer_state.json`` and console lines). Records with a timestamp are placed by it; those
without one follow each other by the first rule that applies:

1. ``given``: the user's ``--seconds-per-record``;
2. ``lifetime``: the file was written over a known time (its birth to its last
   modification, at least ``MIN_LIFETIME``): the records spread evenly over it, the last at
   the modification, so ``lifetime / n`` apart;
3. ``tick``: otherwise one record per categorisation interval, as an agent polling a job
   that logs once an interval would read them.

A file written in one go (a copy, a checkout, a ``trainer_state.json`` saved whole) tells
nothing of how long its records took: its lifetime is under ``MIN_LIFETIME``, and rule 3
applies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# A file written over less time than this was written in one go (copied, saved whole).
MIN_LIFETIME = 1.0

Rule = Literal["given", "lifetime", "tick"]


@dataclass(frozen=True, slots=True)
class Spacing:
    """The time between records without timestamps, and which rule set it."""

    seconds: float
    rule: Rule
    untimed: int  # the records it applies to

    def describe(self) -> str:
        why = {
            "given": "--seconds-per-record",
            "lifetime": f"spread over the file's lifetime, {self.seconds * self.untimed:.0f} s from birth"
            " to last modification",
            "tick": "one per categorisation interval: the file's times do not tell how long it was"
            " written; --seconds-per-record sets it",
        }[self.rule]
        return f"{self.untimed} records without timestamps, placed {self.seconds:.3g} s apart ({why})"


def spacing_for(untimed: int, *, given: float | None, lifetime: float | None, interval: float) -> Spacing:
    """The spacing of ``untimed`` records (rules in the module doc)."""
    if given is not None:
        return Spacing(given, "given", untimed)
    if lifetime is not None and lifetime >= MIN_LIFETIME and untimed > 0:
        return Spacing(lifetime / untimed, "lifetime", untimed)
    return Spacing(interval, "tick", untimed)
