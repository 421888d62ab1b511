"""The save skeleton every runtime backend shares (SPEC §6): one place decides what a save
did, so the local, Docker and Kubernetes backends judge alike.

A backend supplies only how its job is asked to checkpoint and stop (``halt``: SIGTERM and
wait, or record and evict and wait) and what happens once it is gone (``release``); the
skeleton marks the container busy, notes the newest complete checkpoint before the save,
refuses a save whose job is gone without a verifiable checkpoint while every earlier one is
corrupt, and builds the ``SaveResult`` (forced, rolled back, finished) with
``SaveResult.after``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import structlog

from specon import checkpoint as ckpt
from specon.model import ContainerId, WorkerId
from specon.runtime.base import ContainerState, SaveFailed, SaveResult

log = structlog.get_logger()


async def unrecoverable(checkpoints: Path) -> bool:
    """No complete checkpoint verifies, yet one was written: every checkpoint is corrupt."""
    latest = await asyncio.to_thread(ckpt.latest_complete, checkpoints)
    return latest is None and not ckpt.never_written(checkpoints)


async def run_save(
    container_id: ContainerId,
    worker: WorkerId,
    *,
    grace: float,
    checkpoints: Path,
    busy: dict[ContainerId, ContainerState],
    halt: Callable[[float], Awaitable[bool]],
    finished: Callable[[], bool],
    release: Callable[[], Awaitable[None]] | None = None,
    events: str,
    context: Mapping[str, object],
    corrupt: str,
) -> SaveResult:
    """Save ``container_id``: the skeleton around a backend's ``halt``.

    ``halt(t0)`` asks the job to checkpoint and waits until it is gone (``t0``: the save's
    ``time.monotonic()`` start); it returns whether the job was killed at the deadline
    (``forced``) and raises ``SaveFailed`` when the job may still run. ``finished`` tells
    whether the job completed its work; ``release`` runs once the job is gone and its
    checkpoint judged (inside the busy mark). ``events`` prefixes the log events
    (``<events>.saving``, ``.save_failed``, ``.saved``), logged with ``context``; ``corrupt``
    is the refusal when the job is gone without a verifiable checkpoint and every earlier
    one is corrupt.
    """
    if container_id in busy:
        raise SaveFailed(container_id, f"a {busy[container_id].value} is already in progress")
    busy[container_id] = ContainerState.SAVING
    t0 = time.monotonic()
    try:
        before = ckpt.key(await asyncio.to_thread(ckpt.latest_complete, checkpoints))
        log.info(f"{events}.saving", **context, container=container_id, grace=grace)
        forced = await halt(t0)
        latest = await asyncio.to_thread(ckpt.latest_complete, checkpoints)
        done = finished()
        if latest is None and not done and not ckpt.never_written(checkpoints):
            log.error(f"{events}.save_failed", **context, container=container_id, left_running=False)
            raise SaveFailed(container_id, corrupt)
        if release is not None:
            await release()
    finally:
        busy.pop(container_id, None)
    result = SaveResult.after(
        container_id,
        worker,
        latest=latest,
        before=before,
        seconds=time.monotonic() - t0,
        forced=forced,
        finished=done,
    )
    log.info(
        f"{events}.saved",
        **context,
        container=container_id,
        step=result.step,
        seconds=round(result.seconds, 3),
        forced=forced,
        rolled_back=result.rolled_back,
        finished=done,
    )
    return result
