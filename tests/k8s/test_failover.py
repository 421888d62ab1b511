"""Two manager replicas on the real API server: leader election through a Lease.

Each manager is a real ``specon-manager --journal kubernetes --leader-elect`` process against
the test kube-apiserver; the agents are real ``specon-agent`` processes with the local runtime
running real training jobs (``tests/integration/jobs/curve_job.py``); between them, a small
TCP proxy stands in for the HA component's Service: each new connection goes to a replica that
is Ready (``/healthz`` 200 at its last probe) and whose pod (a pod object in the API server,
one per replica, never scheduled) carries the leader's label, as the Service's endpoints are
the Ready pods its selector matches. The leader is
SIGKILLed while a migration's save is in flight: the standby takes the lease, recovers the
migration from the journal and finishes it, and the job trains exactly its steps, saved once.
``bench/bench_failover.py`` times the same failover.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from specon_manager.k8s_crd_journal import CrdJournal
from specon_manager.leader import LeaseElector, Outcome
from specon_manager.leader_pod import LEADER_LABEL
from specon_manager.lease import Record, Timing

from specon.coordinator.migration import Migration, State
from specon.embedded.cluster import EmbeddedCluster
from specon.model import Resources, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.kubernetes.api import MERGE_PATCH, KubeApi, KubeError
from specon.testing.progress_log import job_records
from specon.wire import protocol
from specon.wire.protocol import ErrorReply
from specon.wire.status import Status
from tests.integration.listening import serve_on_free_port
from tests.integration.test_e2e_local import job
from tests.k8s.cluster import KubeCluster
from tests.k8s.test_manifests import MANIFESTS, render
from tests.k8s.test_runtime_kubernetes import until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = "specon-manager"
POLICY = """\
apiVersion: specon/v1alpha1
kind: Policy
monitor: {{interval: 1, alpha: 0.02}}
messaging: {{heartbeat_interval: {heartbeat}, worker_timeout: {timeout}}}
migration: {{grace_period: 60, min_residence: 0}}  # 60: room for the held save across a failover
placement: {{require_gain: false}}  # the mechanics are tested: Algorithm 2's move is made
rebalance: {{mode: "off"}}
"""


# -- the Service stand-in ----------------------------------------------------------------------
class ServiceProxy:
    """A TCP proxy on 127.0.0.1: a new connection goes to the first backend (the selected ones,
    ``backends``) whose ``/healthz`` answered 200 at the last probe (every ``period`` s); with
    none it is closed at once, as a Service without endpoints refuses. Open connections stay
    where they went."""

    def __init__(self, backends: Callable[[], Iterable[str]], period: float = 0.2) -> None:
        self.backends = backends  # base URLs, http://127.0.0.1:PORT
        self.period = period
        self.ready: list[str] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._spawn(self._probe())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _probe(self) -> None:
        timeout = aiohttp.ClientTimeout(total=0.5)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            while True:
                ready = []
                with contextlib.suppress(KubeError):
                    for url in await asyncio.to_thread(lambda: list(self.backends())):
                        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                            async with s.get(url + "/healthz") as r:
                                if r.status == 200:
                                    ready.append(url)
                self.ready = ready
                await asyncio.sleep(self.period)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.ready:
            writer.close()
            return
        host, _, port = self.ready[0].removeprefix("http://").rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                for w in (dst, writer, up_writer):  # one side gone: the connection is over
                    w.close()

        self._spawn(pipe(reader, up_writer))
        self._spawn(pipe(up_reader, writer))


# -- the deployment --------------------------------------------------------------------------
@dataclass
class Manager:
    identity: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def events(self, name: str) -> list[dict[str, Any]]:
        """Its JSON log records of event ``name``, in order."""
        return events_in(self.log, name)


def events_in(log: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and rec.get("event") == name:
                out.append(rec)
    return out


@dataclass
class Replicas:
    """Manager replicas (``--leader-elect``) against ``cluster``, the Service stand-in in front
    of them and two local-runtime agents (w0, w1) behind it. ``lease``: extra manager flags."""

    cluster: KubeCluster
    namespace: str
    root: Path
    lease: tuple[str, ...] = ()
    heartbeat: float = 0.5  # the agents' heartbeat interval (the policy's default is 5 s)
    managers: dict[str, Manager] = field(default_factory=dict)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy = self.root / "policy.yaml"
        self.policy.write_text(POLICY.format(heartbeat=self.heartbeat, timeout=max(4.0, 4 * self.heartbeat)))
        self.kubeconfig = self.cluster.kubeconfig(self.root / "kubeconfig", namespace=self.namespace)
        self.embedded = EmbeddedCluster(
            self.root / "c", workers=2, cpus_per_worker=0.5, policy=self.policy, with_specon=False
        )
        self.service_selector = ha_service_selector(self.root / "ha")
        self.proxy = ServiceProxy(self.selected)
        self.admin = KubeApi(self.cluster.api_client())
        self._starts = 0

    async def __aenter__(self) -> Replicas:
        await self.embedded.start()  # the workers' cgroups, the volume, the tokens
        await self.proxy.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def journal(self) -> CrdJournal:
        return CrdJournal(self.admin, self.namespace, mirror_pods=False)

    def lease_record(self) -> Record | None:
        try:
            obj = self.admin.request(
                "GET", f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{LEASE}"
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return Record.of(obj)

    def selected(self) -> list[str]:
        """The URLs of the running replicas whose pods the HA Service selects (the leader's
        label; ``KubeError`` if the API cannot say)."""
        pods = self.admin.request(
            "GET", f"/api/v1/namespaces/{self.namespace}/pods", query={"labelSelector": self.service_selector}
        )
        names = {p["metadata"]["name"] for p in pods.get("items", [])}
        return [m.url for n, m in self.managers.items() if f"manager-{n}" in names and m.proc.poll() is None]

    def marked(self, name: str) -> bool:
        """Whether replica ``name``'s pod carries the leader's label."""
        pod = self.admin.request("GET", f"/api/v1/namespaces/{self.namespace}/pods/manager-{name}")
        return (pod["metadata"].get("labels") or {}).get(LEADER_LABEL) == "true"

    def _pod(self, name: str) -> None:
        """Replica ``name``'s pod object (never scheduled: only its labels matter here)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"manager-{name}", "labels": {"app.kubernetes.io/name": "specon-manager"}},
            "spec": {
                "containers": [{"name": "manager", "image": "specon:test"}],
                "automountServiceAccountToken": False,
            },
        }
        try:
            self.admin.request("POST", f"/api/v1/namespaces/{self.namespace}/pods", body=pod)
        except KubeError as exc:
            if exc.status != 409:  # a restarted replica keeps its pod, as a container restart does
                raise

    async def start_manager(self, name: str) -> Manager:
        """A replica; ``name`` plus a start count is its identity (unique per process)."""
        self._starts += 1
        identity = f"{name}-{self._starts}"
        self._pod(name)
        log = self.root / f"manager-{name}.log"
        tokens = self.embedded.tokens_dir
        argv = [
            sys.executable, "-m", "specon_manager",
            "--agent-tokens", str(tokens / "agents.yaml"),
            "--read-token-file", str(tokens / "read"),
            "--journal", "kubernetes",
            "--journal-namespace", self.namespace,
            "--kubeconfig", str(self.kubeconfig),
            "--leader-elect",
            "--leader-elect-namespace", self.namespace,
            "--leader-elect-identity", identity,
            "--leader-elect-label-pod", f"manager-{name}",
            "--policy", str(self.policy),
            "--state-dir", str(self.root / f"state-{name}"),
            *self.lease,
        ]  # fmt: skip

        def start(port: int) -> subprocess.Popen[bytes]:
            out = open(log, "ab")  # noqa: SIM115 - the child owns it
            try:
                return subprocess.Popen(
                    [*argv, "--listen", f"127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT, env=_env()
                )
            finally:
                out.close()

        proc, port = await asyncio.to_thread(serve_on_free_port, start, log)
        self.managers[name] = m = Manager(identity, proc, port, log)
        return m

    def start_agents(self) -> None:
        for i, worker in enumerate(self.embedded.workers):
            out = open(self.root / f"agent-{worker}.log", "ab")  # noqa: SIM115 - the child owns it
            argv = [
                sys.executable, "-m", "specon_agent",
                "--worker", worker,
                "--listen", f"127.0.0.{i + 2}:0",  # nothing calls an agent here: the kernel's pick
                "--manager", self.proxy.url,  # the Service
                "--volume", str(self.embedded.volume),
                "--token-file", str(self.embedded.tokens_dir / f"agent-{worker}"),
                "--cpus", str(self.embedded.cpus),
                "--cluster", self.embedded.name,
                "--policy", str(self.policy),
            ]  # fmt: skip
            try:
                self.agents[worker] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_env())
            finally:
                out.close()

    async def readyz(self, m: Manager) -> int | None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with (
                aiohttp.ClientSession() as s,
                s.get(m.url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r,
            ):
                return r.status
        return None

    async def knows_leader(self, m: Manager, identity: str) -> bool:
        """Whether replica ``m`` names ``identity`` as the leader (its ``/readyz`` body)."""
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError, ValueError):
            async with (
                aiohttp.ClientSession() as s,
                s.get(m.url + "/readyz", timeout=aiohttp.ClientTimeout(total=2)) as r,
            ):
                body = await r.json(content_type=None)
                return isinstance(body, dict) and body.get("leader") == identity
        return False

    async def leader(self) -> Manager | None:
        """The replica that says it leads (``/readyz`` 200), if any."""
        for m in list(self.managers.values()):
            if m.proc.poll() is None and await self.readyz(m) == 200:
                return m
        return None

    async def status(self, m: Manager) -> Status:
        headers = {protocol.AUTH_HEADER: f"Bearer {self.embedded.read_token}"}
        async with aiohttp.ClientSession() as s, s.get(m.url + protocol.STATUS_PATH, headers=headers) as r:
            return protocol.decode(await r.read(), Status)

    def kill(self, m: Manager) -> None:
        """A crash: SIGKILL, nothing released, nothing flushed."""
        m.proc.kill()
        m.proc.wait()

    async def submit(self, spec: JobSpec, worker: str) -> None:
        await self.embedded.submit(spec, WorkerId(worker))

    async def stop(self) -> None:
        procs = [*self.agents.values(), *(m.proc for m in self.managers.values())]
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.to_thread(p.wait, 15)
            except subprocess.TimeoutExpired:
                p.kill()
                await asyncio.to_thread(p.wait)
        await self.proxy.stop()
        await self.embedded.stop()  # kills every job, removes the cgroups


def ha_service_selector(workdir: Path) -> str:
    """The selector of the agents' Service in the base patched by components/ha, as a
    ``labelSelector`` query."""
    workdir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(MANIFESTS, workdir)
    (workdir / "kustomization.yaml").write_text(f"resources: [{rel}]\ncomponents: [{rel}/components/ha]\n")
    (svc,) = [
        d for d in render(workdir) if d["kind"] == "Service" and d["metadata"]["name"] == "specon-manager"
    ]
    return ",".join(f"{k}={v}" for k, v in sorted(svc["spec"]["selector"].items()))


def _env() -> dict[str, str]:
    # No shared token from the environment, no pod identity: each process gets its flags.
    return {k: v for k, v in os.environ.items() if k not in ("SPECON_TOKEN", "POD_NAME", "POD_NAMESPACE")}


def records(r: Replicas, jid: str) -> list[dict[str, Any]]:
    return job_records(r.embedded.volume, jid)


@contextlib.asynccontextmanager
async def replicas(
    cluster: KubeCluster,
    namespace: str,
    root: Path,
    *lease: str,
    heartbeat: float = 0.5,
    show_logs: bool = True,
) -> AsyncIterator[Replicas]:
    r = Replicas(cluster, namespace, root, tuple(lease), heartbeat)
    try:
        async with r:
            yield r
    finally:
        for f in sorted(root.glob("*.log")) if show_logs else ():  # shown when a test fails
            print(f"== {f.name} ==\n{f.read_text(errors='replace')[-4000:]}")


# What a manager logs when it decides: a command for an agent (the recovered save sent again,
# a start), a migration moved to its next state or ended, a new one decided.
DECISIONS = (
    "specon.manager.command_queued",
    "specon.manager.migration_state",
    "specon.manager.migration_finished",
    "specon.manager.migration_decided",
)


@dataclass(frozen=True)
class Failover:
    """One failover, times from the SIGKILL (seconds, this machine's clock)."""

    acquired: float  # the standby logged leader_acquired
    heartbeat: float  # the first heartbeat the new leader accepted (an agent's manager_connected)
    decision: float  # the new leader's first decision (``DECISIONS``)
    migration: Migration  # as it ended


def _ts(rec: dict[str, Any]) -> float:
    from datetime import datetime  # noqa: PLC0415

    return datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00")).timestamp()


async def kill_the_leader_mid_migration(r: Replicas, steps: int = 300) -> Failover:
    """The scenario: two replicas, a converged job's save held in flight, the leader SIGKILLed,
    the save released once the standby leads. Returns the failover's times; asserts that every
    open migration ends, the job trains exactly its steps, saved once.

    The job is held (curve_job's ``--until-released``) until its migration has ended: on a
    loaded machine a job of fixed length could complete before it was called converged and
    saved, and there would be no save in flight to kill the leader under."""
    first = await r.start_manager("a")
    await until(r.leader, "the first replica to lead", timeout=60)
    second = await r.start_manager("b")
    assert await r.readyz(second) == 503  # a standby while the first holds the lease
    r.start_agents()

    async def both_agents() -> bool:
        return len((await r.status(first)).workers) >= 2

    await until(both_agents, "both agents heartbeating through the Service", timeout=120)
    gate = r.root / "save-gate"
    release = r.root / "release"  # the job's own end, after its migration
    hold = ("--save-seconds", "90", "--save-gate", str(gate), "--until-released", str(release))
    await r.submit(job("slow", steps, "converge", extra=hold), "w0")
    await r.submit(job("steady", 2000, "linear"), "w0")
    journal = r.journal()

    def saving() -> Migration | None:
        return next((m for m in journal.in_flight() if m.state is State.SAVING), None)

    held = await until(lambda: asyncio.to_thread(saving), "the save to begin", timeout=120)
    killed_at = time.time()
    r.kill(first)  # mid-migration: the job is saving, held by the gate
    new = await until(r.leader, "the standby to take over", timeout=60)
    assert new is second
    gate.touch()  # the save may end now: its result goes to the new leader

    async def ended() -> Migration | None:
        m = await asyncio.to_thread(journal.get, held.id)
        return m if m is not None and m.state.terminal else None

    done = await until(ended, "the recovered migration to end", timeout=180)
    release.touch()  # moved (or rolled back): the job may finish
    await until(
        lambda: any(x.get("event") == "finished" for x in records(r, "slow")), "the job to finish", 180
    )
    # Every open migration ended; the job ran once at a time and trained exactly its steps.
    assert [m.id for m in await asyncio.to_thread(journal.in_flight)] == []
    (total,) = [int(x["steps"]) for x in records(r, "slow") if x.get("event") == "finished"]
    assert total >= steps
    trained = [int(x["step"]) for x in records(r, "slow") if "loss" in x]
    assert sorted(trained) == list(range(1, total + 1)), "every step exactly once"
    events = [x.get("event") for x in records(r, "slow") if "event" in x]
    assert events.count("checkpointed") == 1 and events.count("started") == 2, events  # saved once
    record = r.lease_record()
    assert record is not None and record.holder == second.identity and record.transitions >= 1

    acquired = _ts(second.events("specon.manager.leader_acquired")[0]) - killed_at
    connected = [
        _ts(e)
        for w in r.agents
        for e in events_in(r.root / f"agent-{w}.log", "specon.agent.manager_connected")
        if _ts(e) > killed_at
    ]
    decided = [_ts(e) for name in DECISIONS for e in second.events(name)]  # a standby decides nothing
    return Failover(acquired, min(connected) - killed_at, min(decided) - killed_at, done)


async def test_the_standby_takes_over_from_a_leader_killed_mid_migration(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    async with replicas(kube_cluster, kube_namespace, tmp_path) as r:
        f = await kill_the_leader_mid_migration(r)
        # The held save finished under the new leader: the job moved on to w1.
        assert (f.migration.state, f.migration.target) == (State.DONE, "w1")
        assert 0 < f.acquired <= f.decision
        print(
            f"\nFAILOVER: lease taken {f.acquired:.2f} s after the SIGKILL, first heartbeat accepted "
            f"{f.heartbeat:.2f} s, first decision {f.decision:.2f} s"
        )
        # The killed replica, restarted, is a standby: the lease is the other's.
        again = await r.start_manager("a")
        await until(lambda: r.readyz(again), "the restarted replica to serve", timeout=60)
        assert await r.readyz(again) == 503
        assert (await r.leader()) is r.managers["b"]
        # The killed leader's mark was on its pod; the restarted process took it off.
        await until(
            lambda: r.selected() == [r.managers["b"].url], "the Service to select b alone", timeout=30
        )


async def test_a_standby_refuses_writes_and_a_graceful_stop_hands_over_at_once(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    """A 60 s lease: the standby can only lead within the test's time because the stopping
    leader gives the lease back."""
    async with replicas(kube_cluster, kube_namespace, tmp_path, "--leader-elect-lease-duration", "60") as r:
        first = await r.start_manager("a")
        await until(r.leader, "the first replica to lead", timeout=60)
        await until(lambda: r.selected() == [first.url], "the leader to mark its pod", timeout=30)
        second = await r.start_manager("b")
        # Serving is not enough: until its first read of the lease a standby knows no leader.
        await until(
            lambda: r.knows_leader(second, first.identity), "the standby to read the lease", timeout=60
        )
        token = (r.embedded.tokens_dir / "agent-w0").read_text()
        hb = protocol.Heartbeat(
            worker=WorkerId("w0"),
            address="127.0.0.2:1",
            seq=int(time.time() * 1e6),
            sent_at=time.time(),
            capacity=Resources(cpu=1.0),
            usage=0.0,
        )
        headers = {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}
        async with aiohttp.ClientSession() as s:
            async with s.post(
                second.url + protocol.HEARTBEAT_PATH, data=protocol.encode(hb), headers=headers
            ) as resp:
                assert resp.status == 503
                err = protocol.decode(await resp.read(), ErrorReply)
            assert err.error == f"standby: the leader is {first.identity}; retry"
            async with s.get(second.url + "/healthz") as resp:
                health = await resp.json()
            assert resp.status == 200 and (health["role"], health["leader"]) == ("standby", first.identity)
            async with s.post(
                first.url + protocol.HEARTBEAT_PATH, data=protocol.encode(hb), headers=headers
            ) as resp:
                assert resp.status == 200  # the leader takes it
        assert r.journal().get_meta("started_at") is not None  # the leader's; the standby wrote nothing
        first.proc.send_signal(signal.SIGTERM)  # a graceful stop (a rolling restart, a drain)
        assert await asyncio.to_thread(first.proc.wait, 30) == 0
        assert first.events("specon.manager.leader_released")
        new = await until(r.leader, "the standby to lead after the release", timeout=30)
        assert new is second
        assert not r.marked("a")  # a took its mark off as it stopped
        await until(lambda: r.selected() == [second.url], "the new leader to mark its pod", timeout=30)
        async with aiohttp.ClientSession() as s, s.get(second.url + "/healthz") as resp:
            assert resp.status == 200  # both replicas were Ready all along: the label chose
        record = r.lease_record()
        assert record is not None and record.holder == second.identity and record.duration == 60


async def test_a_leader_that_loses_the_lease_stops_at_once_and_exits_1(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    """Another holder in the Lease (as after a partition the leader did not notice): at its
    next renewal the leader stands down and exits 1, for Kubernetes to restart it as a standby."""
    async with replicas(kube_cluster, kube_namespace, tmp_path) as r:
        m = await r.start_manager("a")
        await until(r.leader, "the replica to lead", timeout=60)
        path = f"/apis/coordination.k8s.io/v1/namespaces/{kube_namespace}/leases/{LEASE}"
        lease = r.admin.request("GET", path)
        lease["spec"]["holderIdentity"] = "intruder"
        r.admin.request("PUT", path, body=lease)
        assert await asyncio.to_thread(m.proc.wait, 30) == 1
        (lost,) = m.events("specon.manager.leader_lost")
        assert lost["reason"] == "the lease is held by intruder"
        record = r.lease_record()
        assert record is not None and record.holder == "intruder"  # not released: it was not its own


def test_the_ha_deployment_applies_server_side(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    """The base patched by components/ha is a valid Deployment (probes, anti-affinity, env,
    the leader's label passed its pod name) and Service (selecting the leader's label). Every
    replica is Ready when it serves: readiness is /healthz, not the leader-only /readyz. (Its
    PodDisruptionBudget is policy/v1, which this v1.20 server does not serve.)"""
    rel = os.path.relpath(MANIFESTS, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(f"resources: [{rel}]\ncomponents: [{rel}/components/ha]\n")
    admin = KubeApi(kube_cluster.api_client())
    where = {
        "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
        "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        "Service": "/api/v1/namespaces/{ns}/services",
    }
    applied = set()
    for d in render(tmp_path):
        if d["kind"] in where and "manager" in d["metadata"]["name"]:
            d["metadata"]["namespace"] = kube_namespace
            made = admin.request(
                "POST", where[d["kind"]].format(ns=kube_namespace), query={"dryRun": "All"}, body=d
            )
            applied.add(d["kind"])
            if d["kind"] == "Service":
                assert made["spec"]["selector"][LEADER_LABEL] == "true"
            if d["kind"] == "Deployment":
                (c,) = made["spec"]["template"]["spec"]["containers"]
                assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
                assert "--leader-elect-label-pod=$(POD_NAME)" in c["args"]
    assert applied == set(where)


async def test_the_ha_role_allows_the_elector_and_nothing_more(kube_rbac_cluster: KubeCluster) -> None:
    """The HA component's Role under --authorization-mode=RBAC, as the manager's
    ServiceAccount: every call of the elector is allowed; other Leases can be created (RBAC
    cannot restrict a create by name) but not read or changed; none can be deleted; pods'
    labels can be patched (the leader's mark), pods neither read, listed, created nor deleted."""
    cluster = kube_rbac_cluster
    admin = KubeApi(cluster.api_client())
    rbac = [d for d in render(MANIFESTS / "components" / "ha") if d["kind"] in ("Role", "RoleBinding")]
    assert sorted(d["kind"] for d in rbac) == ["Role", "RoleBinding"]
    with cluster.temporary_namespace("ha") as ns:
        sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "specon-manager"}}
        admin.request("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body=sa)
        for d in rbac:
            d["metadata"]["namespace"] = ns
            for sub in d.get("subjects", []):
                sub["namespace"] = ns
            plural = "roles" if d["kind"] == "Role" else "rolebindings"
            admin.request("POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/{plural}", body=d)
        manager = KubeApi(cluster.api_client(cluster.service_account_token(ns, "specon-manager")))
        timing = Timing()

        def candidate(name: str, identity: str) -> LeaseElector:
            return LeaseElector(manager, namespace=ns, name=name, identity=identity, timing=timing)

        a = candidate(LEASE, "a")
        a.check()  # absent: a 404, not a 403
        assert (await a._attempt()).outcome is Outcome.HELD  # create
        a.leading = True
        assert (await a._attempt()).outcome is Outcome.HELD  # update (renew)
        a._seen = None
        assert (await a._attempt()).outcome is Outcome.HELD  # get, then update
        assert await a.release()
        other = candidate("elsewhere", "x")  # another Lease: the elector cannot even read it
        got = await other._attempt()
        assert got.outcome is Outcome.FAILED and got.error is not None and "403" in got.error
        path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "elsewhere"}}
        made = manager.request("POST", path, body=lease)  # allowed: RBAC cannot restrict a create by name
        lease["metadata"]["resourceVersion"] = made["metadata"]["resourceVersion"]
        for method, where, body in (
            ("PUT", f"{path}/elsewhere", lease),
            ("GET", f"{path}/elsewhere", None),
            ("GET", path, None),
            ("DELETE", f"{path}/{LEASE}", None),
        ):
            with pytest.raises(KubeError) as denied:
                manager.request(method, where, body=body)
            assert denied.value.status == 403, (method, where)
        # Its own pod's label (any pod of its namespace: RBAC cannot name one made later), and
        # nothing else of pods: no read, list, create or delete.
        pods = f"/api/v1/namespaces/{ns}/pods"
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "manager-a"},
               "spec": {"containers": [{"name": "m", "image": "specon:test"}]}}  # fmt: skip
        admin.request("POST", pods, body=pod)
        mark = {"metadata": {"labels": {LEADER_LABEL: "true"}}}
        manager.request("PATCH", f"{pods}/manager-a", body=mark, content_type=MERGE_PATCH)
        assert admin.request("GET", f"{pods}/manager-a")["metadata"]["labels"] == {LEADER_LABEL: "true"}
        for method, where, body in (
            ("GET", f"{pods}/manager-a", None),
            ("GET", pods, None),
            ("POST", pods, {**pod, "metadata": {"name": "another"}}),
            ("DELETE", f"{pods}/manager-a", None),
        ):
            with pytest.raises(KubeError) as denied:
                manager.request(method, where, body=body)
            assert denied.value.status == 403, (method, where)
        a.close()
        other.close()
