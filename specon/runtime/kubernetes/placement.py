"""Waiting for kube-scheduler to place a restored copy on the node it is steered to.

A start creates the copy unbound (``steering``); it is restored once the scheduler binds it
to this node. A copy still unbound after the deadline (the node cannot take it: its CPU or
GPUs taken by other pods, cordoned, a taint the pod does not tolerate; or no scheduler
serves the pod's ``schedulerName``) is withdrawn, deleted only while still unbound, and the
start fails with the scheduler's own reason, so the manager rolls the move back (again
through the scheduler) and journals why. The job never runs twice: its copy is withdrawn
before any other may be created, and a copy bound at the last moment is kept as restored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from specon.model import ContainerId
from specon.runtime.base import StartFailed
from specon.runtime.kubernetes import pods, steering
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.writes import PodRef

FIRST_LOOK_S = 0.05  # between reads of the copy, doubling ...
LAST_LOOK_S = 1.0  # ... up to this

Read = Callable[[PodRef], Awaitable[Manifest | None]]  # the copy as the API holds it; None: gone
Withdraw = Callable[[PodRef], Awaitable[None]]  # delete it if still unbound (the writer's)


async def placed(
    job: ContainerId,
    created: Manifest,
    node: str,
    *,
    read: Read,
    withdraw: Withdraw,
    deadline: float = steering.PLACEMENT_DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> Manifest:
    """The copy ``created`` once bound to ``node``; ``StartFailed`` (the copy withdrawn) when it
    is not within ``deadline`` seconds, or is deleted meanwhile."""
    ref = PodRef.of(created)
    give_up = clock() + deadline
    pause = FIRST_LOOK_S
    pod: Manifest | None = created
    while True:
        if pod is None or pods.meta(pod).get("uid") != ref.uid:
            raise StartFailed(job, f"copy {ref.label} was deleted before it was scheduled")
        bound = pods.node_of(pod)
        if bound == node:
            return pod
        if bound is not None:  # the required affinity forbids it: someone else bound it
            raise StartFailed(job, f"copy {ref.label} was bound to {bound}, not to {node}")
        if clock() >= give_up:
            break
        await asyncio.sleep(pause)
        pause = min(LAST_LOOK_S, pause * 2)
        pod = await read(ref)
    why = steering.unschedulable(pod) or "no scheduler bound it (is its schedulerName served?)"
    await withdraw(ref)
    last = await read(ref)  # bound just before the withdrawal: restored after all
    if last is not None and pods.node_of(last) == node and not pods.meta(last).get("deletionTimestamp"):
        return last
    raise StartFailed(
        job, f"copy {ref.label} not scheduled onto {node} within {deadline:g} s ({why}): withdrawn"
    )
