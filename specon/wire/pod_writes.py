"""An agent's requests for writes on its Kubernetes node's pods (``POST /v1/kubernetes/pods``),
made for it by the manager's pod broker with the manager's identity: plain JSON through the
codec and the declared limits, outside the agent protocol's envelope (``specon.wire.protocol``).

The request names only what the agent may choose; the broker reads the rest from the API
server and from its own decisions (``specon_manager.pod_broker``). A refusal is a reply
whose ``outcome`` says which of the runtime's failures to raise on the agent, so a write
through the broker fails exactly as one made in-process does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from specon.model import ContainerId, WorkerId
from specon.wire import codec
from specon.wire.checks import check
from specon.wire.limits import ID, LABELS, SHORT_TEXT, TEXT, Range, limit

POD_WRITES_PATH = "/v1/kubernetes/pods"
MAX_GRACE = 86_400.0


class PodOp(enum.StrEnum):
    """What the agent asks for, on the pod it names (``writes.PodWriter``)."""

    RECORD = "record"  # write the job's restore record from its live pod
    EVICT = "evict"  # record it, then evict it with ``grace`` (a save)
    DELETE = "delete"  # delete it with ``grace`` (a stop, or an ended pod forgotten)
    FORGET_RECORD = "forget_record"  # delete the restore record of a job that finished here
    ANNOTATE = "annotate"  # merge specon's state annotations into it
    CREATE = "create"  # create the job's copy on the agent's node (a start)
    WITHDRAW = "withdraw"  # delete that copy while no scheduler has bound it (a start given up)


class Outcome(enum.StrEnum):
    """How a write ended: ``done``, or the runtime failure the agent raises for it."""

    DONE = "done"
    GONE = "gone"  # NoSuchContainer
    SAVE_FAILED = "save_failed"
    START_FAILED = "start_failed"
    ALREADY_RUNNING = "already_running"
    ALREADY_FINISHED = "already_finished"
    FORBIDDEN = "forbidden"  # not this node's to ask for
    API = "api"  # the API server's error (``status``)


@dataclass(frozen=True, slots=True)
class PodWriteRequest:
    worker: WorkerId = field(metadata=limit(ID))  # the node the agent speaks for
    op: PodOp
    container: ContainerId = field(metadata=limit(ID))
    # The pod (all ops but create and forget_record): read back from the API server.
    namespace: str | None = field(default=None, metadata=limit(SHORT_TEXT))
    name: str | None = field(default=None, metadata=limit(SHORT_TEXT))
    uid: str | None = field(default=None, metadata=limit(SHORT_TEXT))
    grace: float = field(default=0.0, metadata=limit(Range(0, MAX_GRACE)))
    # create: the checkpoint's manifest file name in the job's checkpoint directory.
    checkpoint: str | None = field(default=None, metadata=limit(SHORT_TEXT))
    annotations: dict[str, str] = field(default_factory=dict, hash=False, metadata=limit(LABELS))

    @classmethod
    def parse(cls, body: bytes) -> PodWriteRequest:
        """``ValueError`` saying what is wrong."""
        req = codec.loads(cls, body)
        if problems := check(req):
            raise ValueError("; ".join(f"{p}: {w}" for p, w in problems[:20]))
        if req.op not in (PodOp.CREATE, PodOp.FORGET_RECORD) and not (req.namespace and req.name):
            raise ValueError(f"namespace, name: {req.op} names a pod")
        return req

    def to_json(self) -> bytes:
        return codec.dumps(self, PodWriteRequest)


@dataclass(frozen=True, slots=True)
class PodWriteReply:
    outcome: Outcome
    error: str | None = field(default=None, metadata=limit(TEXT))
    status: int | None = None  # outcome api: the API server's HTTP status
    annotated: bool = False  # annotate: the patch was applied
    pod: dict[str, object] = field(default_factory=dict, hash=False)  # create: the pod as created

    def to_json(self) -> bytes:
        return codec.dumps(self, PodWriteReply)

    @classmethod
    def from_json(cls, body: bytes) -> PodWriteReply:
        """``ValueError`` saying what is wrong."""
        return codec.loads(cls, body, strict=False)
