"""How a Kubernetes agent asks the manager for its pod writes (``--pod-writes manager``): the
runtime's ``BrokerWriter`` sends through the agent's ``ManagerClient``.

A manager that cannot be reached (restarting, a failover between replicas) is asked again,
backing off, for up to ``RETRY_FOR_S``: a save or a start in progress does not fail for a
manager that is back a few seconds later (each write is idempotent: a create carries its
command's id, an eviction or deletion of a pod already gone is done). Past that, or when the
manager refuses the request outright, it is an API failure to the runtime (the save or start
fails, and the manager decides again), never an exception the runtime does not know."""

from __future__ import annotations

import time

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
)

from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.broker import Send
from specon.wire.pod_writes import PodWriteReply, PodWriteRequest
from specon_agent.client import ManagerClient, ManagerRejected, ManagerUnavailable

log = structlog.get_logger()

RETRY_FOR_S = 45.0  # within a save's or start's deadline (grace period + worker timeout)


def manager_sender(client: ManagerClient, *, retry_for: float = RETRY_FOR_S) -> Send:
    def retrying(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("specon.agent.pod_write_retry", attempt=state.attempt_number, error=str(exc))

    async def send(req: PodWriteRequest) -> PodWriteReply:
        deadline = time.monotonic() + retry_for  # the attempts' own timeouts included
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(ManagerUnavailable),
                wait=wait_exponential(multiplier=0.25, max=4.0),
                stop=stop_after_delay(retry_for),
                before_sleep=retrying,
                reraise=True,
            ):
                with attempt:
                    return await client.pod_write(req, timeout=max(1.0, deadline - time.monotonic()))
        except ManagerUnavailable as exc:
            raise KubeError(0, "ManagerUnavailable", f"the manager cannot be reached: {exc}") from exc
        except ManagerRejected as exc:
            raise KubeError(exc.status, "ManagerRejected", f"the manager refused the request: {exc}") from exc
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    return send
