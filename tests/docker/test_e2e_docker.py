"""End to end on Docker hosts: a real manager and ``specon-agent --runtime docker`` processes
over loopback HTTP, each worker a private Docker engine with a CPU budget, jobs containers; the
same scenario as the local runtime's end-to-end test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from specon.embedded.cluster import EmbeddedCluster
from specon.embedded.docker_hosts import DockerUnavailable
from tests.integration.test_e2e_local import POLICY, converged_job_moves_once_and_finishes_exactly

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(240)]


@contextlib.asynccontextmanager
async def started_docker_cluster(tmp_path: Path, cpus_per_worker: float) -> AsyncIterator[EmbeddedCluster]:
    """Two Docker-host workers under the end-to-end ``POLICY``; skips where Docker is impossible."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    c = EmbeddedCluster(
        tmp_path / "c", workers=2, cpus_per_worker=cpus_per_worker, policy=policy, runtime="docker"
    )
    try:
        await c.start()
    except DockerUnavailable as err:
        pytest.skip(f"no Docker engine here: {err}")
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def docker_cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    async with started_docker_cluster(tmp_path, cpus_per_worker=0.5) as c:
        yield c


async def test_a_converged_container_moves_between_docker_hosts_and_finishes_exactly(
    docker_cluster: EmbeddedCluster,
) -> None:
    await converged_job_moves_once_and_finishes_exactly(docker_cluster)
    infos = await docker_cluster.containers()
    assert {i.id for i in infos} >= {"fast"} and all(i.handle for i in infos)
