"""A JSON-lines progress log's last record (how runtimes and tools tell a job's state), and
all its records (``read_records``, for a report after the run).

``last_record`` reads only the log's tail. The last line may be half-written and the first one cut by
the seek; both are skipped, never an error. Anything but a regular file at the path (a
FIFO, a device, a symlink) has no record: it is never waited on and never read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from specon.checkpoint import open_regular, read_regular

TAIL_BYTES = 4096
WHOLE_MAX = 1 << 30  # the most ``read_records`` reads of one log


def last_record(progress: Path, *, tail_bytes: int = TAIL_BYTES) -> dict[str, Any] | None:
    """The last complete JSON object in the log's final ``tail_bytes``, or None."""
    try:
        fd = open_regular(progress)
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - tail_bytes)
            # Up to the size seen at the start: a log growing meanwhile cannot stretch the read.
            tail = os.pread(fd, size - start, start)
        finally:
            os.close(fd)
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            return record
    return None


def last_event(progress: Path) -> str | None:
    """The ``event`` of the log's last record (``"finished"``, ``"checkpointed"``...), if any."""
    record = last_record(progress)
    event = None if record is None else record.get("event")
    return event if isinstance(event, str) else None


def read_records(path: Path) -> list[dict[str, Any]]:
    """A progress log's whole records, read at once ([] without one; a line cut short by a
    killed writer is skipped): for a report after the run, not a tailer. Like the tail, never
    anything but a regular file (a job could plant a FIFO there), and at most ``WHOLE_MAX``."""
    try:
        lines = read_regular(path, WHOLE_MAX).decode("utf-8", errors="replace").splitlines()
    except OSError:  # absent, not a regular file, or larger than any log a report reads
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out
