"""The Kubernetes end-to-end scenarios on real nodes: two kubelets v1.20.2, each with its own
containerd, running the pods in containers of the offline training image (``nodes.py``).

The scenario code is the stand-in tests' own (``test_e2e_kubernetes.py``,
``test_runtime_kubernetes.py``); here it runs through real kubelets: eviction, SIGTERM and the
grace period, pod teardown and creation are the kubelet's. One pair of nodes serves the session.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from specon.runtime.kubernetes import KubeApi, KubernetesRuntime
from tests.k8s.cluster import KubeCluster
from tests.k8s.conftest import *  # noqa: F403  (the fixtures)
from tests.k8s.nodes import RealNodes, on_real_node
from tests.k8s.test_e2e_kubernetes import Deployment, converged_pod_moves, deployed, manager_restart_recovers
from tests.k8s.test_runtime_kubernetes import (
    deaf_job_is_killed_and_resumes,
    disruption_budget_blocks_the_save,
    shared_volume,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture
def real_admin(real_cluster: KubeCluster) -> KubeApi:
    return KubeApi(real_cluster.api_client())


@pytest.fixture
def real_volume(real_admin: KubeApi, real_namespace: str, tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "shared"
    shared_volume(real_admin, real_namespace, root)
    yield root
    real_admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{real_namespace}")


@pytest.fixture
async def real_runtimes(
    real_cluster: KubeCluster, real_namespace: str, real_volume: Path, real_nodes: RealNodes
) -> AsyncIterator[dict[str, KubernetesRuntime]]:
    # The default kill_slack (15 s): a real kubelet confirms a deletion only once the pod's
    # containers, volumes and cgroups are gone, seconds after the kill.
    made = {
        node: KubernetesRuntime(
            real_cluster.api_client(), node, volume_root=real_volume, namespace=real_namespace
        )
        for node in real_nodes.names
    }
    yield made
    for rt in made.values():
        rt.close()


@pytest.fixture
async def real_deployment(
    real_cluster: KubeCluster, real_namespace: str, real_nodes: RealNodes, tmp_path: Path
) -> AsyncIterator[Deployment]:
    async with deployed(real_cluster, real_namespace, tmp_path, adapt=on_real_node) as d:
        yield d


async def test_a_converged_pod_moves_between_real_nodes_and_finishes_exactly(
    real_deployment: Deployment,
) -> None:
    down = await converged_pod_moves(real_deployment, steps=300)
    assert down.gap < 30  # through real kubelets: eviction, teardown, a new container


async def test_a_manager_killed_mid_migration_recovers_from_the_api_on_real_nodes(
    real_deployment: Deployment,
) -> None:
    await manager_restart_recovers(real_deployment)


async def test_a_disruption_budget_blocks_the_move_on_a_real_node(
    real_admin: KubeApi, real_namespace: str, real_runtimes: dict[str, KubernetesRuntime]
) -> None:
    await disruption_budget_blocks_the_save(real_admin, real_namespace, real_runtimes, adapt=on_real_node)


async def test_a_job_deaf_to_sigterm_is_killed_by_the_kubelet_and_resumes_from_its_checkpoint(
    real_admin: KubeApi, real_namespace: str, real_volume: Path, real_runtimes: dict[str, KubernetesRuntime]
) -> None:
    await deaf_job_is_killed_and_resumes(
        real_admin, real_namespace, real_volume, real_runtimes, adapt=on_real_node, steps=600
    )
