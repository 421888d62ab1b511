"""A job's progress log (``progress.jsonl``) as a test reads it while the job may be writing.

Only whole lines count: a job appends a record with one write, but a reader can catch it
halfway (a torn read), and the last line without its newline is then read next time. A
whole line that is not a record is the writer's fault and says so (``BrokenLogError``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specon.runtime.volume import JobPaths


class BrokenLogError(AssertionError):
    """A progress log with a line that is not a whole record (the writer left half a line)."""


def progress_records(path: Path) -> list[dict[str, Any]]:
    """The records of the progress log at ``path`` whose lines are complete ([] without one)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError as exc:
            raise BrokenLogError(f"{path}: line {n} is not a record: {line[:80]!r}") from exc
    return out


def job_records(volume: Path, job: str) -> list[dict[str, Any]]:
    """``progress_records`` of ``job``'s log on the shared ``volume`` (its root)."""
    return progress_records(JobPaths.of(volume, job).progress)
