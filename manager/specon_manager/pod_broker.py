"""The pod broker: the writes on managed pods that agents ask for on Kubernetes
(``POST /v1/kubernetes/pods``, ``specon.wire.pod_writes``), made with the manager's identity.

A node's credential may only read (``manifests/``); so a node taken over by an attacker can
ask for what its agent legitimately needs and nothing more. Each request is checked twice:

* **by this manager's decisions**: an eviction only while a save of that job is queued for
  that worker (or awaited after its migration failed), a create (or the withdrawal of a
  copy no scheduler placed) only while a start is, the deletion of a pod that has not ended
  only while a stop is; after a restart, the save or start its journaled migration is in
  (``outbox.decided``); a take-over of a lost node's pod only where the start command itself
  says so (``supersede``/``lost``);
* **by the API server's view** (``writes.PodWrites``): the pod named is a managed pod of that
  job bound to the requester's node (a withdrawn copy: steered there), a copy is made for the
  requester's node from the job's trusted original, annotations are specon's own.

What a refusal means to the agent is the runtime failure a write made in-process would raise
(``broker.reply_for``). Refusals are counted (``specon_pod_writes_total{op,outcome}``) and
logged (``specon.manager.pod_write_refused``).
"""

from __future__ import annotations

import structlog
from prometheus_client import Counter

from specon.coordinator.outbox import decided
from specon.model import WorkerId
from specon.runtime.base import RuntimeFailure, supersede_of
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.broker import reply_for
from specon.runtime.kubernetes.pods import PodError
from specon.runtime.kubernetes.writes import Forbidden, PodRef, PodWrites
from specon.wire.pod_writes import Outcome, PodOp, PodWriteReply, PodWriteRequest
from specon.wire.protocol import Action, Command
from specon_manager.auth import Identity
from specon_manager.shell import ManagerShell

log = structlog.get_logger()

# The command that must be pending for the op (None: the API server's view alone decides).
_NEEDS: dict[PodOp, Action | None] = {
    PodOp.EVICT: Action.SAVE,
    PodOp.CREATE: Action.START,
    PodOp.WITHDRAW: Action.START,
    PodOp.RECORD: None,
    PodOp.DELETE: None,  # an ended pod; one that runs needs a stop (below)
    PodOp.FORGET_RECORD: None,
    PodOp.ANNOTATE: None,
}


class PodBroker:
    """Makes the writes ``shell``'s decisions allow, with ``writes``' API identity."""

    def __init__(self, shell: ManagerShell, writes: PodWrites) -> None:
        self.shell = shell
        self.writes = writes
        # Registered by ``create_app`` in the manager's registry.
        self.collector = Counter(
            "specon_pod_writes",
            "Writes on managed pods asked of the manager by agents, by operation and outcome",
            ["op", "outcome"],
            registry=None,
        )

    def _pending(self, worker: WorkerId, req: PodWriteRequest, action: Action) -> Command | None:
        core = self.shell.core
        in_flight = core.migrations.values()
        now = self.shell.clock()
        return decided(core.commands, in_flight, worker, req.container, action, command=core.command, now=now)

    async def write(self, who: Identity, req: PodWriteRequest) -> PodWriteReply:
        """Answer ``req`` from ``who`` (authenticated); never raises for a refusal."""
        worker = WorkerId(req.worker)
        try:
            if not who.may_speak_for(worker):
                raise Forbidden(req.container, f"{who.name} may not speak for worker {worker}")
            reply = await self._write(worker, req)
        except (PodError, ValueError) as exc:  # a container id that names no pod of any namespace
            reply = reply_for(Forbidden(req.container, str(exc)))
        except (RuntimeFailure, KubeError) as exc:
            reply = reply_for(exc)
            if isinstance(exc, Forbidden):
                log.warning(
                    "specon.manager.pod_write_refused",
                    identity=who.name,
                    worker=worker,
                    op=req.op.value,
                    container=req.container,
                    error=reply.error,
                )
        self.collector.labels(op=req.op.value, outcome=reply.outcome.value).inc()
        return reply

    async def _write(self, worker: WorkerId, req: PodWriteRequest) -> PodWriteReply:
        needs = _NEEDS[req.op]
        cmd = None if needs is None else self._pending(worker, req, needs)
        if needs is not None and cmd is None:
            raise Forbidden(req.container, f"no {needs.value} of {req.container} is pending on {worker}")
        done = PodWriteReply(outcome=Outcome.DONE)
        pod = PodRef(req.namespace or "", req.name or "", req.uid)
        w = self.writes
        match req.op:
            case PodOp.RECORD:
                await w.record(req.container, pod, worker)
            case PodOp.EVICT:
                await w.evict(req.container, pod, worker, req.grace)
            case PodOp.DELETE:
                stop = self._pending(worker, req, Action.STOP) is not None
                await w.delete(req.container, pod, worker, int(req.grace), alive=stop)
            case PodOp.FORGET_RECORD:
                await w.forget_record(req.container, worker)
            case PodOp.WITHDRAW:
                await w.withdraw(req.container, pod, worker)
            case PodOp.ANNOTATE:
                annotated = await w.annotate(req.container, pod, worker, req.annotations)
                return PodWriteReply(outcome=Outcome.DONE, annotated=annotated)
            case PodOp.CREATE:
                assert cmd is not None  # _NEEDS: a start
                created = await w.create(
                    req.container, worker, req.checkpoint, supersede_of(cmd.supersede, cmd.lost), token=cmd.id
                )
                log.info("specon.manager.pod_created", worker=worker, container=req.container, command=cmd.id)
                return PodWriteReply(outcome=Outcome.DONE, pod=created)
        return done
