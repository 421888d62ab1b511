"""Real Docker engines as separate "hosts" on one machine, for the Docker backend's tests.

Each :class:`Engine` is a ``specon.embedded.docker_hosts.DockerHost`` (its own ``dockerd`` with a
private socket, data root and exec root; no bridge, no iptables: containers run with
``network_mode`` ``none`` or ``host`` only) plus SDK clients. ``ensure_dockerd`` installs
Debian's ``docker.io`` when ``dockerd`` is missing; where that is impossible it raises
:class:`DockerUnavailable` and the tests skip with the reason.

Images come from ``tests/rootfs.py``: an empty root filesystem imported with ``docker import``
plus read-only binds of the host's Python (:func:`python_image`, :func:`job_binds`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import docker

from specon.embedded.docker_hosts import DockerHost, DockerUnavailable, ensure_dockerd, start_host, stop_host
from specon.runtime.docker.backend import import_image
from tests.rootfs import host_binds, host_rootfs

__all__ = ["DockerUnavailable", "Engine", "ensure_dockerd", "start_engine", "stop_engine"]

PYTHON_IMAGE = "specon-test/python:1"


@dataclass
class Engine(DockerHost):
    """A :class:`DockerHost` with SDK clients of it (closed by :func:`stop_engine`)."""

    clients: list[docker.DockerClient] = field(default_factory=list)

    def client(self) -> docker.DockerClient:
        c = docker.DockerClient(base_url=self.url, timeout=60)
        self.clients.append(c)
        return c

    @property
    def data_root(self) -> Path:
        return self.base / "data"


def start_engine(
    name: str,
    base: Path,
    *,
    experimental: bool = False,
    criu_bin: Path | None = None,
    init_path: Path | None = None,
) -> Engine:
    """Start a private ``dockerd`` under ``base`` (``specon.embedded.docker_hosts.start_host``)."""
    host = start_host(name, base, experimental=experimental, criu_bin=criu_bin, init_path=init_path)
    return Engine(name=host.name, base=host.base, process=host.process, group=host.group)


def remove_managed(engine: Engine) -> None:
    """Force-remove every container of ``engine`` (between tests: the engine stays up)."""
    c = engine.client()
    for container in c.containers.list(all=True):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)


def stop_engine(engine: Engine) -> None:
    """Remove its containers, close its clients, stop it (``specon.embedded.docker_hosts.stop_host``)."""
    with contextlib.suppress(Exception):
        remove_managed(engine)
    for c in engine.clients:
        with contextlib.suppress(Exception):
            c.close()
    engine.clients.clear()
    stop_host(engine)


def python_image(engine: Engine, tag: str = PYTHON_IMAGE) -> str:
    """Import the host-Python image into ``engine`` (once per engine); returns its tag."""
    return import_image(engine.client(), host_rootfs(engine.base / "rootfs"), tag)


def job_binds(volume: Path) -> dict[str, dict[str, str]]:
    """docker SDK ``volumes=``: the host's Python read-only, the shared volume read-write."""
    binds = {host: {"bind": inside, "mode": "ro"} for host, inside in host_binds()}
    binds[str(volume)] = {"bind": str(volume), "mode": "rw"}
    return binds
