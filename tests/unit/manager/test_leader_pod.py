"""The leader's label on its own pod, in-process: two replicas on one fake Lease API and one
fake pod API; the leader's pod alone carries ``specon.io/leader`` (what the HA Service
selects), the label moves on a graceful hand-over, a stale one is removed before a replica
campaigns, and an API that refuses the label is retried, not given up."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from specon_manager.app import METRICS, create_app
from specon_manager.journal import Journal
from specon_manager.leader import FencedJournal, LeaseElector, attach
from specon_manager.leader_pod import LEADER_LABEL, LeaderPod
from specon_manager.lease import Timing
from specon_manager.shell import ManagerShell

from specon.runtime.kubernetes.api import MERGE_PATCH, KubeError
from tests.unit.manager.test_leader import FakeLeases
from tests.unit.manager.test_leader_standby import TOKEN, until
from tests.unit.manager_fakes import policy

NS = "specon"


class FakePods:
    """Pods' labels by name, changed by JSON merge patches; ``refuse``: patches answer 403."""

    def __init__(self, *names: str) -> None:
        self.labels: dict[str, dict[str, str]] = {
            n: {"app.kubernetes.io/name": "specon-manager"} for n in names
        }
        self.lock = threading.Lock()
        self.refuse = False
        self.patches = 0
        self.hold: threading.Event | None = None  # a mark (label set) blocks until it is set
        self.holding = threading.Event()  # a held mark is blocked
        self.landed = threading.Event()  # the held mark was applied

    def request(self, method: str, path: str, *, body: object = None, content_type: str = "") -> Any:
        assert method == "PATCH" and content_type == MERGE_PATCH and isinstance(body, dict)
        prefix = f"/api/v1/namespaces/{NS}/pods/"
        assert path.startswith(prefix)
        held = self.hold is not None and body["metadata"]["labels"].get(LEADER_LABEL) == "true"
        if held and self.hold is not None:
            self.holding.set()
            self.hold.wait(10)
        with self.lock:
            self.patches += 1
            if self.refuse:
                raise KubeError(403, "Forbidden", "pods is forbidden")
            labels = self.labels[path.removeprefix(prefix)]
            for k, v in body["metadata"]["labels"].items():
                if v is None:
                    labels.pop(k, None)
                else:
                    labels[k] = v
            if held:
                self.landed.set()
            return {"metadata": {"labels": dict(labels)}}

    def selected(self) -> list[str]:
        """The pods the HA Service selects."""
        return sorted(n for n, labels in self.labels.items() if labels.get(LEADER_LABEL) == "true")


def replica(
    tmp_path: Path, leases: FakeLeases, pods: FakePods, identity: str
) -> tuple[web.Application, ManagerShell]:
    """A manager replica electing on ``leases``, marking ``pod-<identity>`` in ``pods``."""
    timing = Timing(lease_duration=30, renew_deadline=10, retry_period=0.05)  # only a release is fast
    elector = LeaseElector(leases, namespace=NS, name="specon-manager", identity=identity, timing=timing)
    sh = ManagerShell(
        policy=policy(), journal=FencedJournal(Journal(tmp_path / "j.db"), elector.holds), standby=True
    )
    app = create_app(sh, token=TOKEN, tick=False)
    pod = LeaderPod(pods, namespace=NS, pod=f"pod-{identity}", retry_period=0.05)
    attach(app, sh, elector, registry=app[METRICS].registry, on_lost=lambda _: None, pod=pod)
    return app, sh


async def test_the_leaders_pod_alone_carries_the_label_and_it_moves_on_a_hand_over(tmp_path: Path) -> None:
    leases, pods = FakeLeases(), FakePods("pod-a", "pod-b")
    pods.labels["pod-b"][LEADER_LABEL] = "true"  # left by b's earlier process, killed leading
    app_a, sh_a = replica(tmp_path, leases, pods, "a")
    app_b, sh_b = replica(tmp_path, leases, pods, "b")
    async with TestClient(TestServer(app_a)) as a:
        await until(lambda: pods.selected() == ["pod-a", "pod-b"], "a to mark its pod")
        assert sh_a.leading
        async with TestClient(TestServer(app_b)):
            await until(lambda: pods.selected() == ["pod-a"], "b to remove its stale mark")
            await a.close()  # a graceful stop: unmarked, then the lease released
            await until(lambda: pods.selected() == ["pod-b"], "b to lead and mark its pod")
            assert sh_b.leading and not sh_a.leading


async def test_a_refused_mark_is_retried_until_the_api_allows_it(tmp_path: Path) -> None:
    leases, pods = FakeLeases(), FakePods("pod-a")
    pods.refuse = True
    app, sh = replica(tmp_path, leases, pods, "a")
    async with TestClient(TestServer(app)):
        await until(lambda: sh.leading and pods.patches >= 4, "a to lead and try marking a few times")
        assert pods.selected() == []
        pods.refuse = False
        await until(lambda: pods.selected() == ["pod-a"], "the mark once allowed")


async def test_a_replica_stopping_while_its_mark_is_in_flight_leaves_no_mark(tmp_path: Path) -> None:
    leases, pods = FakeLeases(), FakePods("pod-a")
    pods.hold = threading.Event()  # the API answers the mark only once the replica is stopping
    app, _ = replica(tmp_path, leases, pods, "a")
    client = TestClient(TestServer(app))
    await client.start_server()
    await until(pods.holding.is_set, "a to lead and send its mark")
    stopping = asyncio.create_task(client.close())  # a graceful stop, the mark still in flight
    await asyncio.sleep(0.2)
    pods.hold.set()  # the mark lands now, after the stop began
    await stopping
    await until(pods.landed.is_set, "the held mark to land")
    assert pods.selected() == []  # the stop's unmark came after it: no agent is sent here
