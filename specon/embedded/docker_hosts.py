"""Docker "hosts" on one machine: a private ``dockerd`` per worker, for the demo and the tests.

Each :class:`DockerHost` is its own engine with a private socket, data root, exec root and
pidfile (INFRA.md "Docker Engine"): no bridge and no iptables, so its containers run with
``network_mode`` ``none`` or ``host`` only and nothing leaves 127.0.0.0/8. With ``cpus`` the
engine's containers share one CPU budget, like a machine of that size: the engine puts them
under ``--cgroup-parent``, a cgroup-v1 group whose CFS quota is the budget.

Given a network host (``wrap``, e.g. ``specon.testing.net_hosts.NetHost``), the engine runs in
that host's network namespace, as on a machine of its own: its socket is still a file the
driver and the host's agent reach, and what it starts (containerd, shims, ``network_mode``
``host`` containers) is in that host's network too. The host must leave it this process's
mount namespace (``NetHost.wrap`` does; ``ip netns exec`` would remount ``/sys``, hiding the
cgroup hierarchies, and keep the engine's mounts out of ``stop_host``'s reach).

Standard library only (the ``docker`` SDK stays in ``specon.runtime.docker``): the engine is
asked ``/_ping`` over its unix socket directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from specon.embedded.network_host import Host
from specon.runtime.local.cgroups import CGROUP_ROOT, CpuGroup, detect

log = structlog.get_logger()

READY_TIMEOUT = 30.0
APT_LOCK_WAIT = "600"


class DockerUnavailable(RuntimeError):  # noqa: N818  (a reason to skip, not a bug)
    """No Docker engine can run on this machine; the message says why."""


@dataclass
class DockerHost:
    """One running ``dockerd``: a separate Docker "host"."""

    name: str
    base: Path
    process: subprocess.Popen[bytes]
    group: CpuGroup | None = None

    @property
    def socket(self) -> Path:
        return self.base / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.base / "dockerd.log"


def apt_install(package: str, command: str) -> str:
    """The path of ``command``, installing Debian's ``package`` first if it is missing
    (waiting for a dpkg lock another apt holds); ``DockerUnavailable`` where that is impossible."""
    found = shutil.which(command)
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise DockerUnavailable(f"{command} is not installed and apt-get (as root) is not available")
    done = subprocess.run(
        ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}", "install", "-y", "-q", package],
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        capture_output=True,
        text=True,
        check=False,
    )
    found = shutil.which(command)
    if done.returncode != 0 or not found:
        raise DockerUnavailable(f"apt-get install {package} failed: {done.stderr[-2000:]}")
    return found


def ensure_dockerd() -> None:
    """``dockerd`` on PATH, from Debian's ``docker.io`` if it is missing."""
    apt_install("docker.io", "dockerd")


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=2)
        self._path = str(path)

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(2)
        s.connect(self._path)
        self.sock = s


def ping(sock: Path) -> bool:
    """The engine at ``sock`` answers ``/_ping``."""
    conn = _UnixConnection(sock)
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _die_with_parent() -> None:
    """preexec_fn: the engine gets SIGTERM when its starter dies (never an orphaned engine)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_host(
    name: str,
    base: Path,
    *,
    cpus: float | None = None,
    cgroup: tuple[str, ...] = (),
    experimental: bool = False,
    criu_bin: Path | None = None,
    init_path: Path | None = None,
    network: Host | None = None,
) -> DockerHost:
    """Start a private ``dockerd`` under ``base`` (keep it short: socket paths are limited to
    108 bytes) and wait until it answers.

    ``cpus``: the budget its containers share, in the cgroup ``cgroup`` (path parts below this
    process's own cpu group); ``criu_bin``: a directory put first on the engine's PATH (where a
    ``criu`` wrapper lives); ``init_path``: its ``--init-path`` (a static tini, which CRIU needs
    to restore ``init=True`` containers); ``network``: the network host it runs in (default: this
    process's network).
    """
    ensure_dockerd()
    base.mkdir(parents=True, exist_ok=True)
    argv = [
        "dockerd",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        f"--host=unix://{base / 'docker.sock'}",
        f"--data-root={base / 'data'}",
        f"--exec-root={base / 'exec'}",
        f"--pidfile={base / 'dockerd.pid'}",
        "--storage-driver=overlay2",
    ]
    group = None
    if cpus is not None:
        detection = detect()
        if not detection.available:
            raise DockerUnavailable(f"no CPU budget for {name}: {detection.reason}")
        group = CpuGroup.at(detection, *(cgroup or ("specon-docker", name)))
        group.create(cpus)
        # dockerd takes the parent as a path from the root of every hierarchy.
        argv.append(f"--cgroup-parent=/{group.cpu_dir.relative_to(CGROUP_ROOT / 'cpu')}")
    if experimental:
        argv.append("--experimental")
    if init_path is not None:
        argv.append(f"--init-path={init_path}")
    env = dict(os.environ)
    if criu_bin is not None:
        env["PATH"] = f"{criu_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    if network is not None:
        argv = network.wrap(argv)
    with (base / "dockerd.log").open("ab") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  (only prctl: async-signal-safe)
        )
    host = DockerHost(name=name, base=base, process=process, group=group)
    deadline = time.monotonic() + READY_TIMEOUT
    while not ping(host.socket):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_host(host)
            raise DockerUnavailable(f"dockerd {name} did not come up: {_tail(host.log)}")
        time.sleep(0.1)
    log.info(
        "specon.docker_hosts.started",
        host=name,
        socket=str(host.socket),
        cpus=cpus,
        own_network=network is not None,
    )
    return host


def stop_host(host: DockerHost, *, timeout: float = 30.0) -> None:
    """Stop the engine (it stops its containers), unmount what it leaves, drop its cgroup."""
    proc = host.process
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    # A stopped engine can leave nsfs and overlay mounts under its roots (INFRA.md).
    for mount in reversed(_mounts_under(host.base)):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
    if host.group is not None:
        for d in sorted({host.group.cpu_dir, host.group.cpuacct_dir}, key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                for child in sorted(d.rglob("*"), key=lambda p: -len(p.parts)):
                    if child.is_dir():
                        child.rmdir()
                d.rmdir()


def _mounts_under(base: Path) -> list[str]:
    prefix = str(base.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(prefix)]


def _tail(path: Path, size: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-size:].decode(errors="replace")
    return ""
