"""The embedded default: a whole specon cluster on one machine, as real processes.

A manager process on 127.0.0.1 and one agent process per worker, each on its own
loopback address (127.0.0.2, 127.0.0.3, ...), talking real HTTP; workers are CPU-budgeted
cgroups of the local runtime (or, with ``runtime="docker"``, one private Docker engine each,
its containers sharing the worker's CPU budget: ``specon.embedded.docker_hosts``); jobs are real
training processes whose logs and checkpoints live in one directory standing for the
persistent volume. Used by ``specon demo`` and by the end-to-end tests.

Given ``hosts`` (network hosts of their own: ``specon.testing.net_hosts``), the manager runs
on the first and agent *i* on host *i + 1*, each listening on its host's address; given
``tls``, the manager serves HTTPS and the agents verify it against the CA. Across hosts
without ``tls`` the agents are started with ``--insecure-http``, as an operator would have to.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

import aiohttp
import structlog
import yaml

from specon.checkpoint import atomic_write
from specon.embedded.network_host import Host
from specon.model import ContainerId, WorkerId
from specon.runtime.base import ContainerInfo, JobSpec, Runtime
from specon.runtime.local.cluster import LocalCluster
from specon.wire import protocol
from specon.wire.status import Status

if TYPE_CHECKING:
    from specon.embedded.docker_workers import DockerWorkers

RuntimeName = Literal["local", "docker"]

MANAGER_PORT = 7700
AGENT_PORT = 7701


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files: the CA agents trust, the manager's certificate (for its host's address) and key."""

    ca: Path
    cert: Path
    key: Path


log = structlog.get_logger()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


#: Starts of a daemon whose port was taken between its pick and its bind, before giving up.
PORT_ATTEMPTS = 5


async def _on_a_free_port(host: str, start: Callable[[int], Awaitable[Daemon]]) -> Daemon:
    """``start(port)`` on a port free a moment ago; on another one when the daemon exited
    because that one was taken meanwhile (any process may bind a free port: other runs'
    picks, agents' outgoing connections bound to their loopback address)."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return await start(free_port(host))
        except DaemonExitedError as exc:
            if "address already in use" not in str(exc).lower() or attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


class DaemonExitedError(RuntimeError):
    """A daemon exited before it was healthy; the message carries its log's tail."""


@dataclass(slots=True)
class Daemon:
    name: str
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)


class EmbeddedCluster:
    """Start with ``async with EmbeddedCluster(...) as c``; everything is stopped on exit."""

    def __init__(
        self,
        root: Path,
        *,
        workers: int,
        cpus_per_worker: float,
        policy: Path | None = None,
        name: str | None = None,
        python: str = sys.executable,
        with_specon: bool = True,
        runtime: RuntimeName = "local",
        warm: bool = False,
        hosts: Sequence[Host] | None = None,
        tls: TlsFiles | None = None,
        agent_args: Sequence[str] = (),
    ) -> None:
        """``agent_args``: more arguments for every agent (e.g. ``--gpu-standby auto``)."""
        if hosts is not None and len(hosts) != workers + 1:
            raise ValueError(f"{workers} workers need {workers + 1} hosts: the manager's first")
        self.root = root
        self.volume = root / "volume"
        self.logs = root / "logs"
        # Each agent's ``--taints-file`` (``taints/<worker>``): a reclaim notice for a worker
        # with no Node, as a spot VM's hook would write it (``set_taints``).
        self.taints_dir = root / "taints"
        self.n_workers = workers
        self.cpus = cpus_per_worker
        self.policy = policy
        self.name = name or f"e{os.getpid()}{secrets.token_hex(2)}"
        self.python = python
        self.with_specon = with_specon
        self.runtime_name = runtime
        # Local runtime: built-in workload jobs fork from a warm interpreter per worker, in
        # the driver (first starts) and in each agent (restores).
        self.warm = warm and runtime == "local"
        self.docker: DockerWorkers | None = None
        # One token per agent (it speaks only for its own worker) and one to read status.
        self.tokens_dir = root / "tokens"
        self.agent_tokens = {w: secrets.token_urlsafe(32) for w in self.workers}
        self.read_token = secrets.token_urlsafe(32)
        self.operator_token = secrets.token_urlsafe(32)  # drain and uncordon (``tokens/operator``)
        self.manager: Daemon | None = None
        self.agents: dict[WorkerId, Daemon] = {}
        self.cluster: LocalCluster | None = None
        self.hosts = list(hosts) if hosts is not None else None
        self.tls = tls
        self.agent_args = tuple(agent_args)
        # The driver's own requests (health, status) verify the manager like the agents do.
        self.ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=tls.ca) if tls else True

    @property
    def workers(self) -> list[WorkerId]:
        return [WorkerId(f"w{i}") for i in range(self.n_workers)]

    def runtime(self, worker: WorkerId) -> Runtime:
        if self.docker is not None:
            return self.docker.runtimes[worker]
        assert self.cluster is not None, "cluster not started"
        return self.cluster.runtimes[worker]

    # -- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> EmbeddedCluster:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        self.volume.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._write_tokens()
        # The driver's own view of the workers: to submit jobs and to tear everything down.
        if self.runtime_name == "docker":
            from specon.embedded.docker_workers import DockerWorkers  # noqa: PLC0415  (the docker SDK)

            self.docker = await asyncio.to_thread(
                DockerWorkers.start,
                self.root / "engines",
                self.volume,
                self.workers,
                self.cpus,
                self.name,
                hosts=self.hosts[1:] if self.hosts else None,  # each engine beside its worker's agent
            )
        else:
            self.cluster = LocalCluster(
                self.volume, [self.cpus] * self.n_workers, name=self.name, warm=self.warm
            )
        if not self.with_specon:
            await self._warm_up()
            return
        try:
            await self.start_manager()
            for i, w in enumerate(self.workers):
                await self.start_agent(w, self.hosts[i + 1].address if self.hosts else f"127.0.0.{i + 2}")
            await self._warm_up()
        except BaseException:
            await self.stop()
            raise

    async def _warm_up(self) -> None:
        """Wait (bounded) for the driver's warm interpreters, so a run's clock starts with
        them imported; the agents' import at the same time."""
        if self.cluster is not None and not await self.cluster.warm_up():
            log.warning("specon.embedded.warm_timeout", reason="jobs start cold until it is ready")

    def _write_tokens(self) -> None:
        self.tokens_dir.mkdir(mode=0o700, parents=True, exist_ok=True)

        def secret(name: str, text: str) -> None:
            path = self.tokens_dir / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)

        secret("agents.yaml", yaml.safe_dump(dict(self.agent_tokens)))
        secret("read", self.read_token)
        secret("operator", self.operator_token)
        for w, token in self.agent_tokens.items():
            secret(f"agent-{w}", token)

    async def start_manager(self, port: int | None = None) -> Daemon:
        """Start the manager: on ``port``, or on its old one (a restart: the agents know that
        URL), or on a port picked now, picked again if taken before the manager bound it."""
        port = port or (int(self.manager.url.rsplit(":", 1)[1]) if self.manager else None)
        if port is None and self.hosts:
            port = MANAGER_PORT  # a host of its own: nothing else binds there
        if port is None:
            return await _on_a_free_port("127.0.0.1", self._start_manager)
        return await self._start_manager(port)

    async def _start_manager(self, port: int) -> Daemon:
        address = self.hosts[0].address if self.hosts else "127.0.0.1"
        argv = [
            self.python, "-m", "specon_manager",
            "--listen", f"{address}:{port}",
            "--agent-tokens", str(self.tokens_dir / "agents.yaml"),
            "--read-token-file", str(self.tokens_dir / "read"),
            "--operator-token-file", str(self.tokens_dir / "operator"),
            "--state-dir", str(self.root / "manager"),
        ]  # fmt: skip
        if self.policy is not None:
            argv += ["--policy", str(self.policy)]
        if self.tls is not None:
            argv += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
        scheme = "https" if self.tls else "http"
        host = self.hosts[0] if self.hosts else None
        self.manager = await self._spawn("manager", f"{scheme}://{address}:{port}", argv, host)
        return self.manager

    async def start_agent(self, worker: WorkerId, host: str, port: int | None = None) -> Daemon:
        if port is None and self.hosts:
            port = AGENT_PORT
        if port is None:
            return await _on_a_free_port(host, lambda p: self._start_agent(worker, host, p))
        return await self._start_agent(worker, host, port)

    async def _start_agent(self, worker: WorkerId, host: str, port: int) -> Daemon:
        assert self.manager is not None
        argv = [
            self.python, "-m", "specon_agent",
            "--worker", worker,
            "--listen", f"{host}:{port}",
            "--manager", self.manager.url,
            "--volume", str(self.volume),
            "--token-file", str(self.tokens_dir / f"agent-{worker}"),
        ]  # fmt: skip
        if self.docker is not None:
            argv += self.docker.agent_args(worker)
        else:
            argv += ["--cpus", str(self.cpus), "--cluster", self.name]
            if self.warm:
                argv.append("--warm")
        if self.policy is not None:
            argv += ["--policy", str(self.policy)]
        argv += ["--taints-file", str(self.taints_dir / worker)]
        argv += self.agent_args
        if self.tls is not None:
            argv += ["--ca-file", str(self.tls.ca)]
        elif self.hosts:
            argv.append("--insecure-http")
        net_host = next((h for h in self.hosts or () if h.address == host), None)
        d = await self._spawn(f"agent-{worker}", f"http://{host}:{port}", argv, net_host)
        self.agents[worker] = d
        return d

    async def _spawn(self, name: str, url: str, argv: list[str], host: Host | None = None) -> Daemon:
        log_path = self.logs / f"{name}.log"
        out = open(log_path, "ab")  # noqa: SIM115 - the child owns it for its lifetime
        try:
            # The host's wrapper execs the daemon: the pid, and its signals, are the daemon's own.
            command = host.wrap(argv) if host is not None else argv
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()
        d = Daemon(name, url, proc, log_path, argv)
        try:
            await self._wait_healthy(d)
        except BaseException:
            # Never leave a daemon running that nobody tracks (a second agent for one worker).
            self.kill(d)
            raise
        return d

    async def _wait_healthy(self, d: Daemon, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if d.proc.poll() is not None:
                    tail = d.log_path.read_text(errors="replace")[-2000:]
                    raise DaemonExitedError(f"{d.name} exited with {d.proc.returncode}:\n{tail}")
                with contextlib.suppress(aiohttp.ClientError, OSError):
                    async with s.get(
                        d.url + "/healthz", timeout=aiohttp.ClientTimeout(total=2), ssl=self.ssl
                    ) as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{d.name} not healthy after {timeout}s; see {d.log_path}")

    def set_taints(self, worker: WorkerId, *taints: str) -> None:
        """Announce ``taints`` (``key[=value]:Effect``) on ``worker``, as its host's notice hook
        would; none: take them all back. Its agent reports them at its next heartbeat."""
        self.taints_dir.mkdir(parents=True, exist_ok=True)
        path = self.taints_dir / worker
        atomic_write(path, "".join(f"{t}\n" for t in taints).encode())  # never half a file

    def kill(self, d: Daemon, sig: int = signal.SIGKILL) -> None:
        """Signal a daemon (SIGKILL: a crash, for fault tests) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            d.proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            d.proc.wait(timeout=30)

    async def lose_host(self, worker: WorkerId) -> list[ContainerId]:
        """``worker``'s host dies: its agent and every job process on it are SIGKILLed at once
        (no goodbye, no save), as ``tests/integration/test_recovery.py`` does; the jobs killed.
        The local runtime only (a Docker worker's processes are its engine's)."""
        if self.cluster is None:
            raise RuntimeError("a host loss is played on the local runtime only")
        agent = self.agents.pop(worker, None)
        if agent is not None:
            self.kill(agent)
        running = await self.runtime(worker).pids()
        for pid in sorted({pid for pids in running.values() for pid in pids}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return sorted(running)

    async def stop(self) -> None:
        """Stop agents and manager (SIGTERM, then SIGKILL), kill every job, remove cgroups."""
        daemons = [*self.agents.values(), *([self.manager] if self.manager else [])]
        for d in daemons:
            with contextlib.suppress(ProcessLookupError):
                d.proc.send_signal(signal.SIGTERM)
        for d in daemons:
            try:
                await asyncio.to_thread(d.proc.wait, 15)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                await asyncio.to_thread(d.proc.wait)
        self.agents.clear()
        self.manager = None
        if self.cluster is not None:
            await self.cluster.teardown()
            self.cluster = None
        if self.docker is not None:
            await self.docker.teardown()
            self.docker = None

    # -- jobs and status ---------------------------------------------------------------------
    async def submit(self, spec: JobSpec, worker: WorkerId) -> ContainerInfo:
        """Start a job on ``worker`` (the initial placement is the caller's, as in the paper)."""
        if self.docker is not None:
            spec = self.docker.containerised(spec)
        return await self.runtime(worker).start(spec)

    async def containers(self) -> list[ContainerInfo]:
        out: list[ContainerInfo] = []
        for w in self.workers:
            out += await self.runtime(w).list_containers()
        return out

    async def status(self) -> Status:
        assert self.manager is not None
        async with (
            aiohttp.ClientSession() as s,
            s.get(
                self.manager.url + protocol.STATUS_PATH,
                headers={protocol.AUTH_HEADER: f"Bearer {self.read_token}"},
                timeout=aiohttp.ClientTimeout(total=10),
                ssl=self.ssl,
            ) as r,
        ):
            return protocol.decode(await r.read(), Status)
