"""When a restarted job trains again: the first record it appends to its progress log.

A migration's downtime ends when the restarted job writes its first progress record. The log
is the job's across all its runs, and the earlier runs wrote it on other hosts, by their
clocks: a record of the source host, whose clock may be minutes ahead of this one, would look
newer than this host's start. So the new run's records are told by where they lie (after the
log's size when the start returned), and only their timestamps, written here by this host's
clock, are compared with the start. A job quicker than the start's return to write its first
record is seen at its next one.

A copy that ends before its first record never ran: ``first_record_after`` says so, and the
agent reports its start failed instead of done (a migration must not end with its job gone).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

from specon import checkpoint as ckpt
from specon.checkpoint import open_regular
from specon.progress.fields import TS_KEYS
from specon.runtime.base import AlreadyRunning, ContainerInfo, JobSpec, Runtime, StartFailed, Supersede

log = structlog.get_logger()

# The new run's first records are read, never the whole log it appends to.
READ_LIMIT = 1 << 16
# A record's time may be this far past the reading's own (read a moment earlier, rounded);
# one further ahead is on another clock than this host's, and the reading's time is taken.
AHEAD_SLACK = 1.0


def log_size(progress: Path) -> int:
    """The log's size in bytes now: 0 when there is none yet (or it is not a regular file)."""
    try:
        fd = open_regular(progress)
    except OSError:
        return 0
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def first_record_time(progress: Path, offset: int, since: float, now: float) -> float | None:
    """When the run appending from byte ``offset`` on logged its first record after ``since``
    (this host's clock): that record's timestamp, or ``now`` for a record with none or with
    one ahead of ``now``. None while it has logged nothing after ``since``. A log now shorter than ``offset``
    was replaced: it is read from its start."""
    try:
        fd = open_regular(progress)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        start = offset if offset <= size else 0
        data = os.pread(fd, min(size - start, READ_LIMIT), start)
    finally:
        os.close(fd)
    for line in data.split(b"\n")[:-1]:  # whole lines only: the last may be half-written
        try:
            record = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(record, dict):
            continue
        ts = next((record[k] for k in TS_KEYS if record.get(k) is not None), None)
        if not (isinstance(ts, int | float) and not isinstance(ts, bool) and math.isfinite(ts)):
            return now  # a record with no time of its own: it is there now
        if ts > since:
            return float(ts) if ts <= now + AHEAD_SLACK else now
    return None


@dataclass(frozen=True, slots=True)
class FirstRecord:
    """How a started copy's wait for its first record ended."""

    at: float  # when it logged its first record (or when the wait ended without one)
    # The copy ended before it logged one: its last listing (None while it runs, or once it
    # has logged, or when it vanished from the listing after it was listed: ``vanished``).
    ended: ContainerInfo | None = None
    vanished: bool = False

    @property
    def never_ran(self) -> bool:
        """It ended (or vanished) before its first record without completing its work: the
        start did not give the job a running copy."""
        return self.vanished or (self.ended is not None and not self.ended.finished)


async def first_record_after(
    runtime: Runtime, info: ContainerInfo, since: float, offset: int, timeout: float
) -> FirstRecord:
    """Wait until the copy ``info`` (started at ``since``) logs its first record after byte
    ``offset`` of its progress log, or ends, or ``timeout`` passes (then it counts as running:
    a job that logs rarely is not a job that failed)."""
    deadline = runtime.now() + timeout
    listed = False  # a listing from a watch cache may not show a copy just created
    while runtime.now() < deadline:
        now = next((i for i in await runtime.list_containers() if i.id == info.id), None)
        ended = (now is None and listed) or (now is not None and not now.alive)
        # Read after the listing: a copy seen ended has written every record it ever will.
        ts = first_record_time(info.progress_path, offset, since, runtime.now())
        if ts is not None:
            return FirstRecord(ts)
        if ended:
            return FirstRecord(runtime.now(), ended=now, vanished=now is None)
        listed = listed or now is not None
        await runtime.sleep(0.05)
    return FirstRecord(runtime.now())


async def start_or_fall_back(
    runtime: Runtime, spec: JobSpec, checkpoint: Path | None, *, supersede: Supersede = False
) -> ContainerInfo:
    """Start ``spec`` from ``checkpoint``, or, if that no longer verifies, from the newest
    complete checkpoint beside it.

    A checkpoint can rot between the save and the restore. The job resumes from its newest
    complete checkpoint anyway (SPEC §6), so starting from the previous one only redoes the
    steps after it, where refusing would leave the job running nowhere.
    """
    try:
        return await runtime.start(spec, checkpoint=checkpoint, supersede=supersede)
    except AlreadyRunning:
        raise
    except StartFailed:
        fallback = None if checkpoint is None else ckpt.stand_in(checkpoint)
        if fallback is None:
            raise
        log.warning(
            "specon.agent.checkpoint_fallback",
            container=spec.id,
            checkpoint=str(checkpoint),
            fallback=str(fallback),
        )
        return await runtime.start(spec, checkpoint=fallback, supersede=supersede)
