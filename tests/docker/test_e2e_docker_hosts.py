"""Docker hosts across network hosts: the manager and two agents each in a network namespace of
their own (198.51.100.0/24 on a test bridge), over TLS, each agent beside its own ``dockerd``
running in the same host; a converged container moves between the two engines and ends with
exactly its steps. The engines, their mounts and cgroups are gone afterwards, and the
``net_hosts`` fixture asserts that no namespace or link is left."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from specon.embedded.docker_hosts import DockerHost, DockerUnavailable
from specon.model import WorkerId
from specon.testing.net_hosts import NetHosts
from tests.hosts import cluster_on
from tests.integration.test_e2e_local import converged_job_moves_once_and_finishes_exactly

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

Hosts = Callable[[int], NetHosts]


def in_our_mounts(pid: int) -> bool:
    """Whether process ``pid`` shares this process's mount namespace (so its cgroups and the
    mounts its teardown removes are the ones we see)."""
    return os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (the engine's containerd). Each thread's ``children``
    file lists only what that thread forked, and Go forks from whichever thread runs the
    goroutine, so every thread's file is read."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(set(found))


def mounts_under(base: Path) -> list[str]:
    prefix = str(base.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(prefix)]


async def test_a_converged_container_moves_between_docker_hosts_on_two_network_hosts(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    hosts = net_hosts(3)
    c = cluster_on(hosts, tmp_path, runtime="docker")
    try:
        await c.start()
    except DockerUnavailable as err:
        pytest.skip(f"no Docker engine here: {err}")
    engines: dict[WorkerId, DockerHost] = {}
    base: Path | None = None
    try:
        assert c.docker is not None and c.manager is not None
        engines = dict(c.docker.hosts)
        base = c.docker.base
        assert c.manager.url == f"https://{hosts[0].address}:7700"
        # Each worker's host runs its agent and its engine (and the engine's containerd),
        # and nothing of another worker's; the manager runs alone in the first host.
        assert hosts[0].holds(c.manager.proc.pid)
        for w, host, other in [("w0", hosts[1], hosts[2]), ("w1", hosts[2], hosts[1])]:
            agent, dockerd = c.agents[WorkerId(w)].proc.pid, engines[WorkerId(w)].process.pid
            assert host.holds(agent) and host.holds(dockerd), w
            assert not other.holds(dockerd), w
            assert in_our_mounts(dockerd), f"{w}'s engine must see the cgroups and its mounts"
            containerd = children(dockerd)
            assert containerd and all(host.holds(p) for p in containerd), w
            # The agent reaches its engine through the socket file, not the network.
            assert f"unix://{engines[WorkerId(w)].socket}" in c.agents[WorkerId(w)].argv

        await converged_job_moves_once_and_finishes_exactly(c)

        st = await c.status()
        # The manager saw each agent at its own host's address, over TLS.
        assert {w.id: w.address.split(":")[0] for w in st.workers} == {
            "w0": hosts[1].address,
            "w1": hosts[2].address,
        }
        # The container the job finished in is w1's engine's, not w0's.
        on = {w: {i.id for i in await c.runtime(WorkerId(w)).list_containers()} for w in ("w0", "w1")}
        assert "fast" in on["w1"] and "fast" not in on["w0"], on
    finally:
        await c.stop()
    # The engines are stopped and reaped, and leave no mount, directory or cgroup behind.
    for w, engine in engines.items():
        assert engine.process.poll() is not None, w
        if engine.group is not None:
            assert not engine.group.cpu_dir.exists(), w
    assert engines and base is not None and not base.exists() and mounts_under(base) == []
