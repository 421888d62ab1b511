"""The embedded cluster's workers as Docker hosts: one private engine per worker.

Each worker is a ``dockerd`` of its own (``specon.embedded.docker_hosts``) whose containers share the
worker's CPU budget, with the host-Python image imported (``specon.embedded.host_image``); jobs are
submitted as containers of that image and the agents run ``--runtime docker`` against their
engine, allowed to bind only the host paths that image needs. Given network hosts, worker *i*'s
engine runs in host *i* (``specon.embedded.network_host.Host``), beside that worker's agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specon.embedded.docker_hosts import DockerHost, start_host, stop_host
from specon.embedded.host_image import host_binds, host_rootfs
from specon.embedded.network_host import Host
from specon.model import WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.docker.backend import DockerRuntime, connect, import_image
from specon.runtime.docker.recipe import Bind, HostRules, Recipe

IMAGE = "specon-embedded/python:1"


@dataclass
class DockerWorkers:
    """The engines, the driver's runtime of each, and how agents and jobs are configured."""

    base: Path
    volume: Path
    hosts: dict[WorkerId, DockerHost]
    runtimes: dict[WorkerId, DockerRuntime]

    @classmethod
    def start(
        cls,
        root: Path,
        volume: Path,
        workers: list[WorkerId],
        cpus: float,
        name: str,
        *,
        hosts: Sequence[Host] | None = None,
    ) -> DockerWorkers:
        """Start one engine per worker with a budget of ``cpus`` (blocking: call off the loop),
        each in its worker's network host when ``hosts`` (one per worker) are given."""
        if hosts is not None and len(hosts) != len(workers):
            raise ValueError(f"{len(workers)} workers need {len(workers)} hosts, got {len(hosts)}")
        root.mkdir(parents=True, exist_ok=True)
        # Engine sockets must fit in 108 bytes: a short directory, linked from ``root``.
        base = Path(tempfile.mkdtemp(prefix="sp-", dir="/tmp"))
        with contextlib.suppress(OSError):
            (root / "engines").symlink_to(base)
        out = cls(base=base, volume=volume, hosts={}, runtimes={})
        try:
            rootfs = host_rootfs(base / "rootfs")
            rules = out.rules()
            for i, w in enumerate(workers):
                network = hosts[i] if hosts is not None else None
                host = start_host(w, base / w, cpus=cpus, cgroup=("specon", name, w), network=network)
                out.hosts[w] = host
                client = connect(host.url)
                import_image(client, rootfs, IMAGE)
                out.runtimes[w] = DockerRuntime(volume, w, client, rules=rules, cpus=cpus)
        except BaseException:
            out.stop_engines()
            raise
        return out

    def rules(self) -> HostRules:
        return HostRules(volume=str(self.volume), ro_bind_prefixes=tuple(h for h, _ in host_binds()))

    def agent_args(self, worker: WorkerId) -> list[str]:
        args = ["--runtime", "docker", "--docker-host", self.hosts[worker].url]
        for prefix in self.rules().ro_bind_prefixes:
            args += ["--allow-bind", prefix]
        return args

    def containerised(self, spec: JobSpec) -> JobSpec:
        """``spec`` with the container recipe that runs it in the host-Python image."""
        recipe = Recipe(
            image=IMAGE,
            command=spec.command,
            env=spec.env,
            binds=tuple(Bind(h, c) for h, c in host_binds()),
            volume_target=str(self.volume),
        )
        return replace(spec, template=recipe.to_json())

    async def teardown(self) -> None:
        for rt in self.runtimes.values():
            with contextlib.suppress(Exception):
                await rt.stop_all(grace=0.0)
            rt.close()
        await asyncio.to_thread(self.stop_engines)

    def stop_engines(self) -> None:
        for host in self.hosts.values():
            stop_host(host)
        self.hosts.clear()
        shutil.rmtree(self.base, ignore_errors=True)
