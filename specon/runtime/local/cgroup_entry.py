"""Where a new process of a worker goes (its cgroups and CPUs), as plain data, and how the
process gets there itself. Standard library only: the warm interpreter
(``specon.runtime.local.zygote``) and the cold launcher (``specon.runtime.local.launcher``,
which loads this file from beside it) apply an entry the runtime computed (``CpuBudget.entry``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

TYPE_CHECKING = False  # not typing's: the launcher loads this file and should not import typing
if TYPE_CHECKING:
    from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    """Where a new process of a worker goes: the ``cgroup.procs`` files it writes itself
    into, each with a fallback or None, and the CPUs it is pinned to (None: any). Plain
    data, so a process that did not compute it (the warm interpreter) can apply it."""

    files: tuple[tuple[str, str | None], ...] = ()
    affinity: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"files": [list(f) for f in self.files], "affinity": self.affinity}

    @classmethod
    def from_json(cls, e: Mapping[str, Any]) -> Entry:
        """``to_json``'s inverse; ``KeyError``, ``TypeError`` or ``ValueError`` if malformed."""
        affinity = e.get("affinity")
        return cls(
            files=tuple((str(f), None if alt is None else str(alt)) for f, alt in e["files"]),
            affinity=None if affinity is None else tuple(int(c) for c in affinity),
        )


def make_entry(
    procs_files: Iterable[Path],
    affinity: frozenset[int] | None,
    fallback: Mapping[Path, Path] | None = None,
) -> Entry:
    files = tuple(
        (os.fspath(p), None if fallback is None or p not in fallback else os.fspath(fallback[p]))
        for p in procs_files
    )
    return Entry(files, tuple(sorted(affinity)) if affinity else None)


def enter(entry: Entry) -> None:
    """Join ``entry``'s groups and pin its CPUs, from inside the new process (raw syscalls
    only, so it is safe between fork and exec). A file that cannot be written is replaced
    by its fallback: a job's group another process removed between its creation and this
    write (an agent prunes the groups of jobs it does not see running) leaves the job in
    the worker's group, in its budget."""

    def join(f: str) -> None:
        fd = os.open(f, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    for f, alt in entry.files:
        try:
            join(f)
        except OSError:
            if alt is None:
                raise
            join(alt)
    if entry.affinity:
        os.sched_setaffinity(0, entry.affinity)
