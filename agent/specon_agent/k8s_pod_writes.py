"""How a Kubernetes agent asks the manager for its pod writes (``--pod-writes manager``): the
runtime's ``BrokerWriter`` sends through the agent's ``ManagerClient``; a manager that cannot
be reached or refuses the request outright is an API failure to the runtime (the save or
start fails, and the manager decides again), never an exception it does not know."""

from __future__ import annotations

from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.broker import Send
from specon.wire.pod_writes import PodWriteReply, PodWriteRequest
from specon_agent.client import ManagerClient, ManagerRejected, ManagerUnavailable


def manager_sender(client: ManagerClient) -> Send:
    async def send(req: PodWriteRequest) -> PodWriteReply:
        try:
            return await client.pod_write(req)
        except ManagerUnavailable as exc:
            raise KubeError(0, "ManagerUnavailable", f"the manager cannot be reached: {exc}") from exc
        except ManagerRejected as exc:
            raise KubeError(0, "ManagerRejected", f"the manager refused the request: {exc}") from exc

    return send
