"""Real Docker engines as separate "hosts" on one machine, for the Docker backend's tests.

Each :class:`Engine` is its own ``dockerd`` with a private socket, data root, exec root and
pidfile (INFRA.md "Docker Engine"): no bridge, no iptables, so containers run with
``network_mode="none"`` or ``"host"`` only and nothing leaves 127.0.0.0/8. An engine is ready in
about a second. ``ensure_docker`` installs Debian's ``docker.io`` when ``dockerd`` is missing
(waiting for the dpkg lock), and raises :class:`DockerUnavailable` where that is impossible, so
the tests skip with the reason instead of failing.

Images come from ``tests/rootfs.py``: an empty root filesystem imported with ``docker import``
plus read-only binds of the host's Python (:func:`python_image`, :func:`job_binds`).
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import docker

from tests.rootfs import host_binds, host_rootfs

APT_LOCK_WAIT = "600"
READY_TIMEOUT = 30.0
PYTHON_IMAGE = "specon-test/python:1"


class DockerUnavailable(RuntimeError):  # noqa: N818  (a reason to skip, not a bug)
    """No Docker engine can run on this machine; the message says why."""


@dataclass
class Engine:
    """One running ``dockerd``: a separate Docker "host"."""

    name: str
    base: Path
    process: subprocess.Popen[bytes]
    experimental: bool = False
    clients: list[docker.DockerClient] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.base / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def data_root(self) -> Path:
        return self.base / "data"

    @property
    def exec_root(self) -> Path:
        return self.base / "exec"

    @property
    def log(self) -> Path:
        return self.base / "dockerd.log"

    def client(self) -> docker.DockerClient:
        """A client of this engine (closed by :func:`stop_engine`)."""
        c = docker.DockerClient(base_url=self.url, timeout=60)
        self.clients.append(c)
        return c


def ensure_docker() -> None:
    """``dockerd`` on PATH, installing ``docker.io`` if needed; ``DockerUnavailable`` if impossible."""
    if shutil.which("dockerd"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise DockerUnavailable("dockerd is not installed and apt-get (as root) is not available")
    done = subprocess.run(
        ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_WAIT}", "install", "-y", "docker.io"],
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not shutil.which("dockerd"):
        raise DockerUnavailable(f"apt-get install docker.io failed: {done.stderr[-2000:]}")


def _die_with_parent() -> None:
    """preexec_fn: the engine dies with the test process, never outlives a killed pytest."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_engine(
    name: str,
    base: Path,
    *,
    experimental: bool = False,
    criu_bin: Path | None = None,
    init_path: Path | None = None,
) -> Engine:
    """Start a private ``dockerd`` under ``base`` and wait until it answers.

    ``criu_bin``: a directory put first on the engine's PATH (where a ``criu`` wrapper lives);
    ``init_path``: the engine's ``--init-path`` (CRIU restores ``init=True`` containers only with
    a static tini).
    """
    ensure_docker()
    base.mkdir(parents=True, exist_ok=True)
    sock, log_path = base / "docker.sock", base / "dockerd.log"
    argv = [
        "dockerd",
        "--bridge=none",
        "--iptables=false",
        "--ip6tables=false",
        "--ip-forward=false",
        "--ip-masq=false",
        f"--host=unix://{sock}",
        f"--data-root={base / 'data'}",
        f"--exec-root={base / 'exec'}",
        f"--pidfile={base / 'dockerd.pid'}",
        "--storage-driver=overlay2",
    ]
    if experimental:
        argv.append("--experimental")
    if init_path is not None:
        argv.append(f"--init-path={init_path}")
    env = dict(os.environ)
    if criu_bin is not None:
        env["PATH"] = f"{criu_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,  # noqa: PLW1509  (only prctl: async-signal-safe)
        )
    engine = Engine(name=name, base=base, process=process, experimental=experimental)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        if engine.process.poll() is not None:
            raise DockerUnavailable(f"dockerd {name} exited {engine.process.returncode}: {_tail(engine.log)}")
        with contextlib.suppress(Exception):
            if engine.client().ping():
                return engine
        if time.monotonic() > deadline:
            stop_engine(engine)
            raise DockerUnavailable(f"dockerd {name} not ready in {READY_TIMEOUT:.0f} s: {_tail(engine.log)}")
        time.sleep(0.2)


def remove_managed(engine: Engine) -> None:
    """Force-remove every container of ``engine`` (between tests: the engine stays up)."""
    c = engine.client()
    for container in c.containers.list(all=True):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            container.remove(force=True)


def stop_engine(engine: Engine) -> None:
    """Remove its containers, stop the engine, unmount what it leaves behind."""
    with contextlib.suppress(Exception):
        remove_managed(engine)
    for c in engine.clients:
        with contextlib.suppress(Exception):
            c.close()
    engine.clients.clear()
    proc = engine.process
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    # A stopped engine can leave nsfs and overlay mounts under its roots (INFRA.md).
    for mount in reversed(_mounts_under(engine.base)):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def _mounts_under(base: Path) -> list[str]:
    prefix = str(base.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    return [p for p in points if p.startswith(prefix)]


def _tail(path: Path, size: int = 2000) -> str:
    with contextlib.suppress(OSError):
        return path.read_bytes()[-size:].decode(errors="replace")
    return ""


def python_image(engine: Engine, tag: str = PYTHON_IMAGE) -> str:
    """Import the host-Python image into ``engine`` (once per engine); returns its tag."""
    c = engine.client()
    with contextlib.suppress(docker.errors.ImageNotFound):
        c.images.get(tag)
        return tag
    rootfs = host_rootfs(engine.base / "rootfs")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(rootfs), arcname=".")
    repo, _, version = tag.partition(":")
    c.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version or "latest")
    return tag


def job_binds(volume: Path) -> dict[str, dict[str, str]]:
    """docker SDK ``volumes=``: the host's Python read-only, the shared volume read-write."""
    binds = {host: {"bind": inside, "mode": "ro"} for host, inside in host_binds()}
    binds[str(volume)] = {"bind": str(volume), "mode": "rw"}
    return binds
