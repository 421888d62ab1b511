"""The last record of a JSON-lines progress log: how runtimes and tools tell a job's state.

Reads only the log's tail. The last line may be half-written and the first one cut by
the seek; both are skipped, never an error.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

TAIL_BYTES = 4096


def last_record(progress: Path, *, tail_bytes: int = TAIL_BYTES) -> dict[str, Any] | None:
    """The last complete JSON object in the log's final ``tail_bytes``, or None."""
    try:
        with open(progress, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - tail_bytes))
            tail = fh.read()
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
