"""The Migration journal (``specon_manager.k8s_crd_journal``) against a real kube-apiserver with
the CRD of ``manifests/base/crd.yaml``: every state round-trips, ``kubectl get migrations`` shows
the printer columns, writers conflict and redo, retention, the carry-over from the ConfigMap
journal (an in-flight migration carried over, then completed; a carry-over killed midway), and
the size of the largest object at 10,000 jobs' marks and 1,000 migrations."""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import urllib3
from specon_manager.k8s_crd_journal import MARK_SHARDS, CrdJournal
from specon_manager.k8s_journal import KubeJournal

from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.api import KubeApi, KubeError
from tests.k8s.cluster import KubeCluster
from tests.k8s.test_manifests import kubectl

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIMIT = 256 * 1024


def journal(cluster: KubeCluster, namespace: str) -> CrdJournal:
    return CrdJournal(KubeApi(cluster.api_client()), namespace, mirror_pods=False)


def moved(mid: str, job: str = "training.job-1", at: float = 1_700_000_000.25) -> Migration:
    node1, node2 = WorkerId("node-1"), WorkerId("node-2")
    return Migration(mid, ContainerId(job), node1, node2, "converged", decided_at=at, updated_at=at)


def every_state(m: Migration) -> list[Migration]:
    """``m`` through each state of a migration that completes, and one that rolls back."""
    t = m.decided_at
    saving = m.to(State.SAVING, at=t + 1, stopped_at=t + 1.5, attempts=1)
    spec = '{"id": "training.job-1", "argv": ["python", "train.py"]}'
    saved = saving.to(
        State.SAVED, at=t + 2, checkpoint="/data/ckpt-40.json", checkpoint_step=40, spec=spec, lost_steps=3
    )
    restoring = saved.to(State.RESTORING, at=t + 3)
    running = restoring.to(State.RUNNING, at=t + 4, started_at=t + 4.125)
    failed = saved.to(State.FAILED, at=t + 5, error="start refused: node-2 lost")
    return [m, saving, saved, restoring, running, running.to(State.DONE, at=t + 5),
            failed, failed.to(State.ROLLED_BACK, at=t + 6)]  # fmt: skip


def test_every_state_round_trips_and_in_flight_follows_it(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    j = journal(kube_cluster, kube_namespace)
    for i, state in enumerate(every_state(moved("m18c-1"))):
        m = replace(state, id=f"m18c-{i}")
        j.put(m)
        assert j.get(m.id) == m, m.state
        assert (m.id in {x.id for x in j.in_flight()}) == m.in_flight
        j.put(m)  # unchanged: rewritten as it is
        assert journal(kube_cluster, kube_namespace).get(m.id) == m
    # Every later state of one migration, written over its first.
    for m in every_state(moved("m2")):
        j.put(m)
        assert j.get("m2") == m
    assert len(j.all()) == 9 and j.get("none") is None


def test_kubectl_get_and_describe_show_the_columns(kube_cluster: KubeCluster, kube_namespace: str,
                                                   tmp_path: Path) -> None:  # fmt: skip
    j = journal(kube_cluster, kube_namespace)
    states = every_state(moved("m3"))
    j.put(states[5])  # done: downtime 2.625 s
    j.put(replace(states[7], id="m4"))  # rolled back, with its error
    config = kube_cluster.kubeconfig(tmp_path / "kubeconfig", namespace=kube_namespace)

    def run(*args: str) -> str:
        return subprocess.run([kubectl(), "--kubeconfig", str(config), *args], check=True,
                              capture_output=True, text=True, timeout=60).stdout  # fmt: skip

    table = [line.split() for line in run("get", "migrations").splitlines()]
    assert table[0] == ["NAME", "JOB", "FROM", "TO", "STATE", "REASON", "DOWNTIME", "AGE"]
    rows = {row[0]: row[1:] for row in table[1:]}
    assert rows["specon-m3"][:6] == ["training.job-1", "node-1", "node-2", "done", "converged", "2.625"]
    # No downtime (it never started on node-2): an empty cell.
    assert rows["specon-m4"][:5] == ["training.job-1", "node-1", "node-2", "rolled_back", "converged"]
    assert "start refused: node-2 lost" in run("get", "migrations", "-o", "wide")
    described = run("describe", "migration", "specon-m4")
    for text in ("Kind:         Migration", "State:", "rolled_back", "Checkpoint:", "/data/ckpt-40.json",
                 "Error:", "start refused", "From:", "node-1", "Lost Steps:"):  # fmt: skip
        assert text in described, text
    # The same table through the API (what kubectl renders), columns by name.
    http = urllib3.PoolManager(ca_certs=str(kube_cluster.ca_file))
    resp = http.request(
        "GET",
        f"{kube_cluster.server}/apis/specon.io/v1alpha1/namespaces/{kube_namespace}/migrations",
        headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io",
                 "Authorization": f"Bearer {kube_cluster.admin_token}"},
    )  # fmt: skip
    served = json.loads(resp.data)
    assert served["kind"] == "Table"
    cells = {r["cells"][0]: r["cells"][1:7] for r in served["rows"]}
    assert cells == {
        "specon-m3": ["training.job-1", "node-1", "node-2", "done", "converged", 2.625],
        "specon-m4": ["training.job-1", "node-1", "node-2", "rolled_back", "converged", None],
    }
    assert [c["name"] for c in served["columnDefinitions"]][:8] == [
        "Name", "Job", "From", "To", "State", "Reason", "Downtime", "Age"]  # fmt: skip


def test_writers_that_collide_redo_on_fresh_data(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    writers = [journal(kube_cluster, kube_namespace) for _ in range(2)]
    marks = [[Mark(ContainerId(f"w{w}-c{i}"), float(i), 1, w, WorkerId("node-1")) for i in range(40)]
             for w in range(2)]  # fmt: skip
    states = every_state(moved("m5"))

    def work(w: int) -> None:
        for mk in marks[w]:
            writers[w].put_mark(mk)
        for m in states[:6]:
            writers[w].put(m)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 80 marks in at most 64 shards: some shared a shard, and none was lost.
    assert writers[0].marks() == {mk.container: mk for batch in marks for mk in batch}
    assert writers[1].get("m5") == states[5]
    # A write on a stale resourceVersion is refused (409) by the server: the redo is real.
    admin = KubeApi(kube_cluster.api_client())
    path = f"/apis/specon.io/v1alpha1/namespaces/{kube_namespace}/migrations/specon-m5"
    stale = admin.request("GET", path)
    writers[0].put(states[4])  # an older state, written over
    with pytest.raises(KubeError, match=r"Conflict"):
        admin.request("PUT", f"{path}/status", body={**stale, "status": {"state": "failed"}})


def test_retention_deletes_ended_migrations_only(kube_cluster: KubeCluster, kube_namespace: str) -> None:
    j = journal(kube_cluster, kube_namespace)
    for mid, at in (("old1", 10.0), ("old2", 20.0), ("new", 95.0)):
        j.put(replace(every_state(moved(mid, at=1.0))[5], updated_at=at))
    j.put(every_state(moved("open", at=1.0))[2])  # saved: in flight
    assert j.forget(100.0, 50.0, keep_newest=1) == 2
    assert sorted(m.id for m in j.all()) == ["new", "open"]
    assert j.forget(100.0, 50.0, keep_newest=0) == 0 and len(j.all()) == 2


def test_a_migration_whose_writer_stopped_before_its_status_reads_as_decided(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    j = journal(kube_cluster, kube_namespace)
    m = moved("m6")
    api = KubeApi(kube_cluster.api_client())
    obj = {"apiVersion": "specon.io/v1alpha1", "kind": "Migration",
           "metadata": {"name": "specon-m6", "labels": {"specon.io/record": "migration",
                                                        "specon.io/in-flight": "true"}},
           "spec": {"id": "m6", "job": "training.job-1", "from": "node-1", "to": "node-2",
                    "reason": "converged", "decidedAt": m.decided_at}}  # fmt: skip
    api.request("POST", f"/apis/specon.io/v1alpha1/namespaces/{kube_namespace}/migrations", body=obj)
    assert j.in_flight() == [m]


def legacy_journal(cluster: KubeCluster, namespace: str) -> KubeJournal:
    return KubeJournal(KubeApi(cluster.api_client()), namespace, mirror_pods=False)


def configmaps(cluster: KubeCluster, namespace: str) -> list[str]:
    found = KubeApi(cluster.api_client()).request("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    return sorted(
        cm["metadata"]["name"] for cm in found["items"] if cm["metadata"]["name"] != "kube-root-ca.crt"
    )


def test_an_upgraded_manager_carries_the_configmap_journal_over_once(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    old = legacy_journal(kube_cluster, kube_namespace)
    states = every_state(moved("m7"))
    ended = replace(states[5], id="m8")
    old.put(states[2])  # saved, in flight when the old manager stopped
    old.put(ended)
    marks = [
        Mark(ContainerId(f"training.job-{i}"), float(i), i % 3, 0, WorkerId("node-1")) for i in range(50)
    ]
    for mk in marks:
        old.put_mark(mk)
    old.set_meta("started_at", "12.5")
    new = journal(kube_cluster, kube_namespace)
    assert new.in_flight() == [states[2]]  # read: carried over
    assert (new.carried.migrations, new.carried.in_flight, new.carried.marks) == (2, 1, 50)
    assert new.all() == [states[2], ended] and new.marks() == {mk.container: mk for mk in marks}
    assert new.get_meta("started_at") == "12.5"
    left = configmaps(kube_cluster, kube_namespace)
    assert "specon-marks" not in left and not [n for n in left if n.startswith("specon-migration-")]
    # Once: the next read finds nothing to carry.
    assert new.in_flight() == [states[2]] and new.carried.migrations == 0
    # The carried-over migration goes on to completion in the new journal.
    for m in states[3:6]:
        new.put(m)
    assert new.in_flight() == [] and new.get("m7") == states[5]


def test_a_carry_over_killed_midway_gives_the_same_result_when_run_again(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    old = legacy_journal(kube_cluster, kube_namespace)
    carried = [replace(every_state(moved(f"m9-{i}"))[i], id=f"m9-{i}") for i in range(6)]
    for m in carried:
        old.put(m)
    for i in range(5):
        old.put_mark(Mark(ContainerId(f"j{i}"), None, 0, i))
    killed = journal(kube_cluster, kube_namespace)
    calls = 0
    real_put = killed.put

    def put_then_die(m: Migration) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise KeyboardInterrupt("killed")
        real_put(m)

    killed.put = put_then_die  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        killed.in_flight()
    assert len(configmaps(kube_cluster, kube_namespace)) > 1  # part still there
    again = journal(kube_cluster, kube_namespace)
    assert len(again.all()) == 3  # written before the kill
    again.in_flight()
    assert again.all() == sorted(carried, key=lambda m: (m.decided_at, m.id))
    left = configmaps(kube_cluster, kube_namespace)
    assert len(again.marks()) == 5 and all(n.startswith("specon-marks-") for n in left), left


def largest(cluster: KubeCluster, namespace: str) -> tuple[int, str, int]:
    """(bytes, name, objects) of the journal's largest object as the API serves it."""
    api = KubeApi(cluster.api_client())
    items: list[dict[str, Any]] = []
    for path in (f"/apis/specon.io/v1alpha1/namespaces/{namespace}/migrations",
                 f"/api/v1/namespaces/{namespace}/configmaps"):  # fmt: skip
        items += api.request("GET", path)["items"]
    sizes = sorted((len(json.dumps(o, separators=(",", ":"))), o["metadata"]["name"]) for o in items)
    return (*sizes[-1], len(items))


@pytest.mark.slow
def test_no_object_over_256_kib_at_10000_jobs_marks_and_1000_migrations(
    kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    j = journal(kube_cluster, kube_namespace)
    # Long names and every field set: the largest a mark gets.
    marks = [
        Mark(ContainerId(f"ml-training-team-{i % 10}.pytorch-job-{i:05d}-worker-0"), 1_700_000_000.125 + i,
             3, 2, WorkerId(f"gpu-node-{i % 500:03d}.cluster.example.com"), i % 2 == 0, 1)
        for i in range(10_000)
    ]  # fmt: skip
    j.put_marks(marks)
    j.put_mark(marks[0])  # and one write as the coordinator makes it
    spec = json.dumps(
        {"id": "x", "argv": ["python", "train.py"] * 50, "env": {f"K{i}": "v" * 40 for i in range(40)}}
    )
    for i in range(1_000):
        done = every_state(moved(f"m{i:04x}-{i}", job=str(marks[i].container), at=1_700_000_000.0 + i))[5]
        j.put(replace(done, spec=spec, error="e" * 200))
    size, name, count = largest(kube_cluster, kube_namespace)
    print(f"largest journal object: {name} {size} bytes ({size / 1024:.1f} KiB) of {count} objects")
    assert size <= LIMIT, (name, size)
    assert len(j.marks()) == 10_000 and len(j.all()) == 1_000
    assert count == 1_000 + MARK_SHARDS + 0  # no meta written here
