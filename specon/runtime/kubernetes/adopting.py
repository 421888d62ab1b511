"""A start of a job whose controller makes its pods (a ``batch/v1`` Job): the replacement the
controller made is adopted, never a second pod created.

A move evicts the Job's pod; its controller creates the replacement at once, which the
manager's admission webhook steers to the move's current target (required node affinity) and
makes wait for the evicted copy to end (``specon.fence``). The target's start waits for that
pod to appear and be bound here (``placement.placed``: one the scheduler cannot place within
the deadline is withdrawn, so the controller makes another, steered to wherever the move then
goes). A replacement still unbound and steered elsewhere (the move turned: a rollback's start
here) is withdrawn for the same reason. It fails, saying why, when the controller's pod went
to another node (no webhook: the scheduler chose freely; the job runs there, and heartbeats
say so) or none appears in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping

from specon.model import ContainerId
from specon.runtime.base import StartFailed
from specon.runtime.kubernetes import placement, pods, steering
from specon.runtime.kubernetes.pods import Manifest
from specon.runtime.kubernetes.writes import PodRef

ListPods = Callable[[], Awaitable[list[Manifest]]]  # every pod of the job, as the API holds them
Mark = Callable[[PodRef, Mapping[str, str]], Awaitable[bool]]  # annotate the pod (the writer's)
LOOK_S = 0.5


async def adopted(
    job: ContainerId,
    node: str,
    *,
    list_pods: ListPods,
    read: placement.Read,
    withdraw: placement.Withdraw,
    mark: Mark,
    deadline: float = steering.PLACEMENT_DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> Manifest:
    """The controller's pod of ``job`` bound to ``node``, marked adopted (``mark``);
    ``StartFailed`` when none is steered
    or bound here within ``deadline`` seconds (each pod unbound that long is withdrawn), or one
    went elsewhere."""
    give_up = clock() + deadline
    while True:
        current = [p for p in await list_pods() if pods.alive(p) and not pods.terminating(p)]
        here = [p for p in current if steering.steered_to(p) == node]
        if here:
            pod = max(here, key=pods.recency)
            bound = await placement.placed(
                job, pod, node, read=read, withdraw=withdraw, deadline=max(0.0, give_up - clock())
            )
            # Its agent lists it as the job's from now on (``steering.awaiting_adoption``).
            if not await mark(PodRef.of(bound), {steering.ANN_ADOPTED: "true"}):
                raise StartFailed(
                    job, f"could not mark pod {PodRef.of(bound).label} adopted; it stays unlisted"
                )
            return bound
        # Steered for this move before it turned here (a rollback): never ran; withdrawn, so
        # the controller makes the next one, which the webhook steers here.
        for stale in [p for p in current if pods.node_of(p) is None and steering.steered_to(p) is not None]:
            await withdraw(PodRef.of(stale))
            current.remove(stale)
        elsewhere = [p for p in current if steering.steered_to(p) is not None]
        if elsewhere:
            where = ", ".join(f"{pods.key_of(p)[1]} on {steering.steered_to(p)}" for p in elsewhere)
            raise StartFailed(
                job,
                f"the job's controller placed its pod elsewhere ({where}), not on {node}: is the "
                "admission webhook installed (components/webhook)?",
            )
        if clock() >= give_up:
            raise StartFailed(job, f"no pod of the job's controller came to {node} within {deadline:g} s")
        await asyncio.sleep(LOOK_S)
