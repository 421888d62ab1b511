"""Framework jobs moved between Docker hosts: the scenario of tests/integration/test_frameworks.py
with every worker a private Docker engine and every job a container. The job image is the
offline host-Python image (tests/rootfs.py): the repo and the venv, with the frameworks the
extras installed, are bound read-only inside, so a container runs the same interpreter and
libraries as the unmoved reference run beside the cluster."""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specon.embedded.cluster import EmbeddedCluster
from tests.docker.test_e2e_docker import started_docker_cluster
from tests.integration.test_frameworks import FRAMEWORKS, framework_job_moves_exactly

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]


@pytest.fixture
async def docker_cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    async with started_docker_cluster(tmp_path, cpus_per_worker=1.0) as c:
        yield c


@pytest.mark.parametrize("name", ["lightning", "transformers"])
async def test_a_framework_container_moves_between_docker_hosts_exactly(
    docker_cluster: EmbeddedCluster, tmp_path: Path, name: str
) -> None:
    fw = FRAMEWORKS[name]
    if importlib.util.find_spec(fw.module) is None:
        pytest.skip(f"{fw.module} is not installed (the {name} extra)")
    await framework_job_moves_exactly(docker_cluster, fw, tmp_path / "unmoved")
    infos = await docker_cluster.containers()
    assert all(i.handle for i in infos if i.id == "fw")
