"""The pod broker's rules (``specon_manager.pod_broker``) and the writer's own checks
(``specon.runtime.kubernetes.writes``), on fakes; the real API server's side is in
tests/k8s/test_manifests.py (RBAC) and tests/k8s/test_e2e_kubernetes.py (over HTTP)."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from specon_manager.auth import Identity
from specon_manager.pod_broker import PodBroker

from specon.config import default_policy
from specon.coordinator.effects import Recovered
from specon.coordinator.machine import Coordinator
from specon.coordinator.migration import Migration, State
from specon.coordinator.outbox import Outbox
from specon.model import ContainerId, WorkerId
from specon.runtime.base import NoSuchContainer, SaveFailed, Supersede
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.broker import BrokerWriter, raise_for, reply_for
from specon.runtime.kubernetes.steering import ANN_MOVE, steer
from specon.runtime.kubernetes.writes import Forbidden, PodRef, PodWrites, checkpoint_name
from specon.wire.pod_writes import Outcome, PodOp, PodWriteReply, PodWriteRequest
from specon.wire.protocol import Action, Command

JOB = ContainerId("training.j1")
NODE_A, NODE_B = WorkerId("node-a"), WorkerId("node-b")
POD = {"namespace": "training", "name": "j1", "uid": "u1"}


class FakeWrites:
    """What the broker asked the writer for (the writer's own checks: ``PodWrites`` below)."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail

    def _did(self, *call: Any) -> None:
        self.calls.append(call)
        if self.fail is not None:
            raise self.fail

    async def record(self, job: ContainerId, ref: PodRef, node: str) -> None:
        self._did("record", job, ref, node)

    async def evict(self, job: ContainerId, ref: PodRef, node: str, grace: float) -> None:
        self._did("evict", job, ref, node, grace)

    async def delete(self, job: ContainerId, ref: PodRef, node: str, grace: int, *, alive: bool) -> None:
        self._did("delete", job, ref, node, grace, alive)

    async def forget_record(self, job: ContainerId, node: str) -> None:
        self._did("forget_record", job, node)

    async def annotate(
        self, job: ContainerId, ref: PodRef, node: str, annotations: Mapping[str, str]
    ) -> bool:
        self._did("annotate", job, ref, node, dict(annotations))
        return True

    async def create(
        self, job: ContainerId, node: str, checkpoint: str | None, supersede: Supersede, *, token: str | None
    ) -> dict[str, Any]:
        self._did("create", job, node, checkpoint, supersede, token)
        return {"metadata": {"name": "j1-g2", "namespace": "training"}}

    async def withdraw(self, job: ContainerId, ref: PodRef, node: str) -> None:
        self._did("withdraw", job, ref, node)


def broker(writes: FakeWrites, *migrations: Migration) -> tuple[PodBroker, Outbox]:
    """The broker of a coordinator (restarted) with ``migrations`` back from its journal."""
    core = Coordinator(
        policy=default_policy(), now=0.0, recovered=Recovered(in_flight=migrations, restarted=True)
    )
    shell = SimpleNamespace(core=core, clock=lambda: 0.0)
    return PodBroker(cast(Any, shell), cast(PodWrites, writes)), core.commands


def command(action: Action, worker: WorkerId = NODE_A, **kw: Any) -> tuple[WorkerId, Command]:
    return worker, Command(
        id=f"m1:{action.value}:{worker}:0", action=action, container=JOB, deadline=9e9, **kw
    )


def node(worker: WorkerId) -> Identity:
    return Identity(name=f"node:{worker}", worker=worker)


def ask(op: PodOp, worker: WorkerId = NODE_A, **kw: Any) -> PodWriteRequest:
    where = {} if op in (PodOp.CREATE, PodOp.FORGET_RECORD) else POD
    return PodWriteRequest(worker=worker, op=op, container=JOB, **{**where, **kw})


async def test_a_create_or_eviction_the_manager_did_not_decide_is_refused_and_nothing_is_written() -> None:
    writes = FakeWrites()
    b, box = broker(writes)
    for op in (PodOp.CREATE, PodOp.EVICT, PodOp.WITHDRAW):
        reply = await b.write(node(NODE_A), ask(op))
        assert reply.outcome is Outcome.FORBIDDEN and "pending" in (reply.error or "")
    box.put(*command(Action.START, NODE_B), after_write=0)  # a start, but of another worker
    box.put(*command(Action.SAVE, NODE_B), after_write=0)
    for op in (PodOp.CREATE, PodOp.EVICT, PodOp.WITHDRAW):
        assert (await b.write(node(NODE_A), ask(op))).outcome is Outcome.FORBIDDEN
    assert writes.calls == []
    assert b.collector.labels(op="create", outcome="forbidden")._value.get() == 2
    # The start's own worker may withdraw the copy it asked for (the writer checks which).
    assert (await b.write(node(NODE_B), ask(PodOp.WITHDRAW, worker=NODE_B))).outcome is Outcome.DONE
    assert writes.calls == [("withdraw", JOB, PodRef("training", "j1", "u1"), NODE_B)]


async def test_a_decided_start_creates_on_the_asking_node_with_the_commands_own_takeover() -> None:
    writes = FakeWrites()
    b, box = broker(writes)
    box.put(*command(Action.START, supersede=True, lost=NODE_B), after_write=0)
    reply = await b.write(node(NODE_A), ask(PodOp.CREATE, checkpoint="ckpt-000040.json"))
    assert reply.outcome is Outcome.DONE and reply.pod["metadata"] == {
        "name": "j1-g2",
        "namespace": "training",
    }
    assert writes.calls == [("create", JOB, NODE_A, "ckpt-000040.json", NODE_B, "m1:start:node-a:0")]


async def test_a_save_awaited_after_its_migration_failed_still_evicts() -> None:
    writes = FakeWrites()
    b, box = broker(writes)
    worker, save = command(Action.SAVE, migration="m1")
    box.put(worker, save, after_write=0)
    box.deliver(worker, durable=0)
    box.retract("m1", [worker], await_saves_at=1.0)  # failed meanwhile; its result is awaited
    assert (await b.write(node(NODE_A), ask(PodOp.EVICT, grace=30.0))).outcome is Outcome.DONE
    assert writes.calls == [("evict", JOB, PodRef("training", "j1", "u1"), NODE_A, 30.0)]


async def test_a_node_speaks_only_for_itself() -> None:
    writes = FakeWrites()
    b, box = broker(writes)
    box.put(*command(Action.START, NODE_B), after_write=0)
    reply = await b.write(node(NODE_A), ask(PodOp.CREATE, worker=NODE_B))
    assert reply.outcome is Outcome.FORBIDDEN and "may not speak for" in (reply.error or "")
    assert writes.calls == []


async def test_only_a_pending_stop_deletes_a_pod_that_runs() -> None:
    writes = FakeWrites()
    b, box = broker(writes)
    await b.write(node(NODE_A), ask(PodOp.DELETE))
    box.put(*command(Action.STOP), after_write=0)
    await b.write(node(NODE_A), ask(PodOp.DELETE, grace=5.0))
    assert [c[-1] for c in writes.calls] == [False, True]


async def test_a_writers_failure_reaches_the_agent_as_the_same_runtime_failure() -> None:
    b, box = broker(
        FakeWrites(fail=SaveFailed(JOB, "eviction refused by a PodDisruptionBudget; it keeps running"))
    )
    box.put(*command(Action.SAVE), after_write=0)
    reply = await b.write(node(NODE_A), ask(PodOp.EVICT))
    assert reply.outcome is Outcome.SAVE_FAILED

    async def send(req: PodWriteRequest) -> PodWriteReply:
        return PodWriteReply.from_json(reply.to_json())  # as it crosses the wire

    with pytest.raises(SaveFailed) as exc:
        await BrokerWriter(send, NODE_A).evict(JOB, PodRef("training", "j1", "u1"), 30.0)
    assert str(exc.value) == f"{JOB}: eviction refused by a PodDisruptionBudget; it keeps running"
    with pytest.raises(KubeError) as api:
        raise_for(reply_for(KubeError(429, "TooManyRequests", "slow down")), JOB)
    assert api.value.status == 429


def test_requests_that_break_a_rule_do_not_parse() -> None:
    good = ask(PodOp.EVICT, grace=3.0)
    assert PodWriteRequest.parse(good.to_json()) == good
    for bad in (
        b"{",
        b'{"worker": "node-a", "op": "evict", "container": "training.j1"}',  # no pod named
        b'{"worker": "node-a", "op": "exec", "container": "training.j1"}',
        b'{"worker": "node-a", "op": "create", "container": "training.j1", "grace": -1}',
        b'{"worker": "node a", "op": "create", "container": "training.j1"}',
    ):
        with pytest.raises(ValueError):
            PodWriteRequest.parse(bad)


# -- the writer's own checks, on a fake API ---------------------------------------------------
def pod(node: str, *, job: str = "j1", managed: bool = True, phase: str = "Running") -> dict[str, Any]:
    labels = {"specon.io/job": job, **({"specon.io/managed": "true"} if managed else {})}
    return {
        "metadata": {
            "name": "j1",
            "namespace": "training",
            "uid": "u1",
            "resourceVersion": "7",
            "labels": labels,
        },
        "spec": {"nodeName": node, "containers": [{"name": "train", "image": "x"}]},
        "status": {"phase": phase},
    }


def unbound(node: str, **kw: Any) -> dict[str, Any]:
    """A copy steered to ``node`` that no scheduler has bound (Pending)."""
    p = pod(node, phase="Pending", **kw)
    steer(p, node)
    return p


class FakeApi:
    def __init__(self, objects: dict[str, Any], fail: KubeError | None = None) -> None:
        self.objects = objects
        self.writes: list[tuple[str, str]] = []
        self.bodies: list[Any] = []
        self.fail = fail

    def request(self, method: str, path: str, **kw: Any) -> Any:
        if method != "GET":
            self.writes.append((method, path))
            self.bodies.append(kw.get("body"))
            if self.fail is not None:
                raise self.fail
            return {}
        if path not in self.objects:
            raise KubeError(404, "NotFound", path)
        return self.objects[path]


@pytest.mark.parametrize(
    ("found", "error"),
    [
        (pod("node-b"), "bound to node-b, not to node-a"),
        (pod("node-a", job="j2"), "a pod of job training.j2"),
        (pod("node-a", managed=False), "not a managed pod"),
    ],
)
async def test_the_writer_touches_only_a_managed_pod_of_the_job_on_the_askers_node(
    found: dict[str, Any], error: str
) -> None:
    api = FakeApi({"/api/v1/namespaces/training/pods/j1": found})
    writes = PodWrites(cast(Any, api))
    ref = PodRef("training", "j1", "u1")
    for call in (
        writes.evict(JOB, ref, NODE_A, 10.0),
        writes.delete(JOB, ref, NODE_A, 0),
        writes.record(JOB, ref, NODE_A),
        writes.annotate(JOB, ref, NODE_A, {"specon.io/category": "converged"}),
    ):
        with pytest.raises(Forbidden, match=error):
            await call
    assert api.writes == []


async def test_the_writer_sets_only_specons_state_annotations_and_knows_a_replaced_pod() -> None:
    api = FakeApi({"/api/v1/namespaces/training/pods/j1": pod("node-a")})
    writes = PodWrites(cast(Any, api))
    with pytest.raises(Forbidden, match=r"may not set: specon\.io/managed"):
        await writes.annotate(JOB, PodRef("training", "j1"), NODE_A, {"specon.io/managed": "false"})
    with pytest.raises(NoSuchContainer, match="replaced"):
        await writes.evict(JOB, PodRef("training", "j1", "other-uid"), NODE_A, 10.0)
    with pytest.raises(Forbidden, match="has not ended"):
        await writes.delete(JOB, PodRef("training", "j1"), NODE_A, 0, alive=False)
    assert await writes.annotate(JOB, PodRef("training", "j1"), NODE_A, {"specon.io/category": "converged"})
    assert api.writes == [("PATCH", "/api/v1/namespaces/training/pods/j1")]


async def test_only_a_copy_still_unbound_and_steered_to_the_asking_node_is_withdrawn() -> None:
    path = "/api/v1/namespaces/training/pods/j1"
    ref = PodRef("training", "j1", "u1")
    for found, error in [
        (unbound("node-b"), "bound to node-b, not to node-a"),
        (unbound("node-a", job="j2"), "a pod of job training.j2"),
        (unbound("node-a", managed=False), "not a managed pod"),
        ({**pod("node-a", phase="Pending"), "spec": {"containers": []}}, "bound to no node"),  # unsteered
    ]:
        api = FakeApi({path: found})
        with pytest.raises(Forbidden, match=error):
            await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
        assert api.writes == []
    # Bound meanwhile (it runs: the start succeeded after all), or gone: nothing to do.
    for objects in ({path: pod("node-a")}, {}):
        api = FakeApi(objects)
        await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
        assert api.writes == []
    # Unbound: deleted only as it was read (bound since: 409, and it stays).
    api = FakeApi({path: unbound("node-a")})
    await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
    assert api.writes == [("DELETE", path)]
    assert api.bodies == [{"gracePeriodSeconds": 0, "preconditions": {"uid": "u1", "resourceVersion": "7"}}]
    api = FakeApi({path: unbound("node-a")}, fail=KubeError(409, "Conflict", "changed"))
    await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
    with pytest.raises(KubeError, match="500"):
        await PodWrites(cast(Any, FakeApi({path: unbound("node-a")}, fail=KubeError(500, "", "x")))).withdraw(
            JOB, ref, NODE_A
        )


async def test_a_jobs_unbound_replacement_for_a_move_is_withdrawn_wherever_it_is_steered() -> None:
    """A rollback's start turns the move: the Job's replacement steered to the old target never
    ran and is withdrawn by the node the move now goes to (the controller makes the next)."""
    path = "/api/v1/namespaces/training/pods/j1"
    ref = PodRef("training", "j1", "u1")
    job_owned = [{"apiVersion": "batch/v1", "kind": "Job", "name": "j1", "uid": "j", "controller": True}]
    replacement = unbound("node-b")
    replacement["metadata"]["ownerReferences"] = job_owned
    replacement["metadata"]["annotations"][ANN_MOVE] = "m-1"
    api = FakeApi({path: replacement})
    await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
    assert api.writes == [("DELETE", path)]
    # Not a Job's replacement for a move (a bare copy, or no move's mark): only its own node may.
    for found in (
        unbound("node-b"),
        {**replacement, "metadata": {**replacement["metadata"], "annotations": {}}},
    ):
        api = FakeApi({path: found})
        with pytest.raises(Forbidden, match="not to node-a"):
            await PodWrites(cast(Any, api)).withdraw(JOB, ref, NODE_A)
        assert api.writes == []


@pytest.mark.parametrize("name", ["../x.json", "a/b.json", "..", ".", "", "x" * 300])
def test_a_checkpoint_is_a_file_name_in_the_jobs_directory(name: str) -> None:
    with pytest.raises(ValueError, match="not a file name"):
        checkpoint_name(name)
    assert checkpoint_name("ckpt-000040.json") == "ckpt-000040.json"


async def test_a_restarted_manager_allows_what_its_journaled_migrations_are_doing() -> None:
    """Restarted mid-migration, the manager has the migration back from its journal but not
    the command its agent is carrying out: the save of a ``saving`` migration on its source,
    the start of a ``restoring`` one on its target, a rollback start of a ``failed`` one on its
    source (the token is the command's id, so a create retried across the restart is the same)."""
    saving = Migration("m1", JOB, NODE_A, NODE_B, "converged", State.SAVING, attempts=0)
    writes = FakeWrites()
    b, _ = broker(writes, saving)
    assert (await b.write(node(NODE_A), ask(PodOp.EVICT))).outcome is Outcome.DONE
    assert (await b.write(node(NODE_B), ask(PodOp.EVICT, worker=NODE_B))).outcome is Outcome.FORBIDDEN
    assert (await b.write(node(NODE_B), ask(PodOp.CREATE, worker=NODE_B))).outcome is Outcome.FORBIDDEN
    restoring = Migration("m1", JOB, NODE_A, NODE_B, "converged", State.RESTORING)
    b, _ = broker(writes, restoring)
    assert (await b.write(node(NODE_B), ask(PodOp.CREATE, worker=NODE_B))).outcome is Outcome.DONE
    # As the coordinator sends it: its source, never heard from since the restart, taken over.
    assert writes.calls[-1] == ("create", JOB, NODE_B, None, NODE_A, "m1:start:node-b:0")
    assert (await b.write(node(NODE_A), ask(PodOp.EVICT))).outcome is Outcome.FORBIDDEN
    failed = Migration("m1", JOB, NODE_A, NODE_B, "converged", State.FAILED)
    b, _ = broker(writes, failed)
    assert (await b.write(node(NODE_A), ask(PodOp.CREATE))).outcome is Outcome.DONE
    assert writes.calls[-1][-1] == "m1:rollback:node-a:0"
    # Either of its workers: a rollback turns to the target after refusals on the source.
    assert (await b.write(node(NODE_B), ask(PodOp.CREATE, worker=NODE_B))).outcome is Outcome.DONE
    assert writes.calls[-1][-1] == "m1:rollback:node-b:0"
