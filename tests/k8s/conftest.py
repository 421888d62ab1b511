"""Fixtures for tests against a real kube-apiserver (see cluster.py and kubelet.py).

- ``kube_binaries`` (session): :class:`Binaries`; the build runs once per session, before the
  first test, outside any test timeout (a cold build takes ~5 min, then it is cached).
- ``kube_cluster`` (session): a :class:`KubeCluster` with ``--authorization-mode=AlwaysAllow``;
  every cluster here has the Migration CRD installed (``manifests/base/crd.yaml``), as
  ``kubectl apply -k manifests/`` installs it.
- ``kube_rbac_cluster`` (session): a second one with ``--authorization-mode=RBAC``; only
  started when a test asks for it.
- ``kube_api`` (function): an admin ``kubernetes.client.ApiClient`` for ``kube_cluster``.
- ``kube_namespace`` / ``kube_rbac_namespace`` (function): a fresh namespace name in that
  cluster; its pods are force-deleted and the namespace removed afterwards.
- ``fake_kubelet`` (function): a started :class:`FakeKubelet` serving Nodes ``node-1``..``node-3``
  (4 CPU / 8 GiB, addresses 127.0.0.1..3, label ``specon.io/test-node=true``) on
  ``kube_cluster``; stopped (every process killed, Nodes deleted) before the namespace goes.
- ``node_binaries`` (session): :class:`NodeBinaries` (``build-apiserver.sh --node``: kubelet +
  pause built once beside the apiserver, containerd/runc/CNI from apt), skipping where impossible.
- ``real_cluster`` (session): a control plane of its own for the real nodes (the stand-in's
  ``node-1``.. on ``kube_cluster`` would clash with them).
- ``real_nodes`` (session): :class:`RealNodes` ``node-1`` and ``node-2`` on ``real_cluster``,
  each a containerd + kubelet v1.20.2, with the pause and training images imported.
- ``real_namespace`` (function): a fresh namespace of ``real_cluster``; its pods are deleted
  gracefully (the kubelets stop their containers) before the namespace goes.

Every test under tests/k8s sees them. Never import them into a test module: pytest would
register them again as that module's, and each such module would start session fixtures of its
own (a kube-apiserver each, a pair of real nodes each).
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from kubernetes import client

from specon.runtime.kubernetes.api import KubeApi
from tests.k8s.cluster import Binaries, BuildImpossibleError, KubeCluster, ensure_binaries
from tests.k8s.crd import install_crd
from tests.k8s.kubelet import FakeKubelet, NodeSpec
from tests.k8s.nodes import NodeBinaries, RealNodes, ensure_node_binaries
from tests.k8s.nodes import real_nodes as real_nodes_of

__all__ = [
    "fake_kubelet",
    "kube_api",
    "kube_binaries",
    "kube_cluster",
    "kube_namespace",
    "kube_rbac_cluster",
    "kube_rbac_namespace",
    "node_binaries",
    "real_cluster",
    "real_namespace",
    "real_nodes",
]

TEST_NODES = tuple(
    NodeSpec(f"node-{i}", address=f"127.0.0.{i}", labels={"specon.io/test-node": "true"}) for i in (1, 2, 3)
)

# One build per session and kind, shared by the collection hook and the fixtures: the result,
# or the error to raise again.
_builds: dict[str, Any] = {}
T = TypeVar("T")


def _once(config: pytest.Config, what: str, build: Callable[[], T]) -> T:
    if what not in _builds:
        capture = config.pluginmanager.getplugin("capturemanager")
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"tests/k8s: ensuring {what}, once")
        try:
            # Let the build script's progress reach the terminal.
            with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
                _builds[what] = build()
        except (BuildImpossibleError, subprocess.CalledProcessError, OSError, RuntimeError) as err:
            _builds[what] = err
    got = _builds[what]
    if isinstance(got, BaseException):
        raise got
    return cast("T", got)


def _build_once(config: pytest.Config) -> Binaries:
    return _once(config, "kube-apiserver + etcd (a cold build takes ~5 min)", ensure_binaries)


def _build_nodes_once(config: pytest.Config) -> NodeBinaries:
    return _once(config, "kubelet + containerd (a cold kubelet build takes ~3-5 min)", ensure_node_binaries)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build before the first test runs, so the build is not charged to a test's timeout."""
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    # The node build first: on a cold cache it builds the apiserver too, from the same tree.
    if "node_binaries" in used:
        with contextlib.suppress(Exception):  # reported by the fixture, per test
            _build_nodes_once(session.config)
    if "kube_binaries" in used:
        with contextlib.suppress(Exception):
            _build_once(session.config)


@pytest.fixture(scope="session")
def kube_binaries(pytestconfig: pytest.Config) -> Binaries:
    try:
        return _build_once(pytestconfig)
    except BuildImpossibleError as err:
        pytest.skip(f"no real kube-apiserver: {err}")


@pytest.fixture(scope="session")
def kube_cluster(kube_binaries: Binaries) -> Iterator[KubeCluster]:
    with KubeCluster(kube_binaries, authorization_mode="AlwaysAllow") as cluster:
        install_crd(KubeApi(cluster.api_client()))  # as `kubectl apply -k manifests/` does
        yield cluster


@pytest.fixture(scope="session")
def kube_rbac_cluster(kube_binaries: Binaries) -> Iterator[KubeCluster]:
    with KubeCluster(kube_binaries, authorization_mode="RBAC") as cluster:
        install_crd(KubeApi(cluster.api_client()))
        yield cluster


@pytest.fixture
def kube_api(kube_cluster: KubeCluster) -> Iterator[client.ApiClient]:
    api = kube_cluster.api_client()
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def kube_namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    with kube_cluster.temporary_namespace() as name:
        yield name


@pytest.fixture
def kube_rbac_namespace(kube_rbac_cluster: KubeCluster) -> Iterator[str]:
    with kube_rbac_cluster.temporary_namespace() as name:
        yield name


@pytest.fixture
def fake_kubelet(kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path) -> Iterator[FakeKubelet]:
    # Depends on kube_namespace so it stops (killing its processes) before the namespace goes.
    with FakeKubelet(kube_cluster, TEST_NODES, workdir=tmp_path / "kubelet") as kubelet:
        yield kubelet


@pytest.fixture(scope="session")
def node_binaries(pytestconfig: pytest.Config, kube_binaries: Binaries) -> NodeBinaries:
    try:
        return _build_nodes_once(pytestconfig)
    except BuildImpossibleError as err:
        pytest.skip(f"no real Kubernetes nodes: {err}")


@pytest.fixture(scope="session")
def real_cluster(kube_binaries: Binaries) -> Iterator[KubeCluster]:
    # The Job controller, for the Jobs that run on the real nodes (test_job_real_nodes.py).
    with KubeCluster(kube_binaries, authorization_mode="AlwaysAllow", controllers=("job",)) as cluster:
        install_crd(KubeApi(cluster.api_client()))  # as `kubectl apply -k manifests/` does
        yield cluster


@pytest.fixture(scope="session")
def real_nodes(
    real_cluster: KubeCluster, node_binaries: NodeBinaries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealNodes]:
    with real_nodes_of(real_cluster, node_binaries, tmp_path_factory.mktemp("images")) as nodes:
        yield nodes


@pytest.fixture
def real_namespace(real_cluster: KubeCluster, real_nodes: RealNodes) -> Iterator[str]:
    with real_cluster.temporary_namespace() as name:
        try:
            yield name
        finally:
            real_nodes.drain(name)
