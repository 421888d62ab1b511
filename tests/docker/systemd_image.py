"""A Debian image that boots systemd as PID 1, built offline once per machine (INFRA.md:
"systemd as PID 1 in a container (measured)").

``debootstrap --variant=minbase --include=systemd,systemd-sysv,python3,dbus`` from the Debian
mirror apt already uses (``scripts/debian-mirror.sh``) into a tarball cached under
``${SPECON_CACHE:-~/.cache/specon}/images/`` (about 45 s and 290 MB the first time), then
``docker import`` into an engine. python3 is there for the shared libraries the host's Python
links against; the interpreter, the venv and the repo are bound read-only at their host paths
(``tests.rootfs.host_binds``). Run it with :func:`run_kwargs`: ``--cap-add SYS_ADMIN`` and never
``--privileged`` (which fails here: the bounding set lacks CAP_SYS_RESOURCE).

``python -m tests.docker.systemd_image`` builds the tarball and prints its path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import docker

from specon.embedded.docker_hosts import apt_install
from tests.docker.engines import DockerUnavailable
from tests.rootfs import REPO, host_binds

SUITE = "bookworm"
PACKAGES = "systemd,systemd-sysv,python3,dbus"
TAG = "specon-test/systemd:bookworm"
# Bumped when PACKAGES or the recipe changes, so an old cached tarball is not reused.
RECIPE = "1"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECON_CACHE") or Path.home() / ".cache/specon").expanduser() / "images"


def tarball_path() -> Path:
    return cache_dir() / f"systemd-{SUITE}-r{RECIPE}.tar"


def debian_mirror() -> tuple[str, str | None]:
    """``(URI, keyring or None)`` of the Debian mirror apt already uses for ``SUITE``."""
    script = REPO / "scripts/debian-mirror.sh"
    out = subprocess.run(
        ["bash", "-c", f'. "{script}" && debian_mirror {SUITE}'],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not out:
        raise DockerUnavailable(f"no apt source serving Debian {SUITE} in /etc/apt")
    return out[0], out[1] if len(out) > 1 else None


def _ensure_debootstrap() -> str:
    return apt_install("debootstrap", "debootstrap")


def build_tarball() -> Path:
    """The cached root filesystem tarball, built under a lock the first time (concurrent test
    runs wait for one build instead of racing)."""
    out = tarball_path()
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".systemd-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.is_file():
            return out
        debootstrap = _ensure_debootstrap()
        mirror, keyring = debian_mirror()
        work = Path(tempfile.mkdtemp(prefix="systemd-rootfs.", dir=out.parent))
        try:
            root = work / "root"
            argv = [debootstrap, "--variant=minbase", f"--include={PACKAGES}"]
            if keyring:
                argv.append(f"--keyring={keyring}")
            done = subprocess.run(
                [*argv, SUITE, str(root), mirror], capture_output=True, text=True, check=False
            )
            if done.returncode != 0:
                raise DockerUnavailable(f"debootstrap failed ({done.returncode}): {done.stderr[-2000:]}")
            partial = work / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
            partial.replace(out)  # atomic: a killed build never leaves a half tarball behind
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def ensure_image(client: docker.DockerClient) -> str:
    """``TAG`` in the engine of ``client``, imported from the cached tarball if absent."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(TAG)
        return TAG
    repo, _, tag = TAG.partition(":")
    client.api.import_image_from_file(str(build_tarball()), repository=repo, tag=tag)
    return TAG


def run_kwargs(image: str, name: str) -> dict[str, Any]:
    """``containers.run`` arguments that boot systemd: the measured recipe plus host networking
    (the agent inside reaches a manager on 127.0.0.x) and the host's Python, venv and repo
    read-only at their own paths."""
    volumes: dict[str, dict[str, str]] = {
        host: {"bind": inside, "mode": "ro"} for host, inside in host_binds() if host != "/usr"
    }
    volumes["/sys/fs/cgroup"] = {"bind": "/sys/fs/cgroup", "mode": "ro"}
    return {
        "image": image,
        # systemd makes / a shared mount at boot, except in a container, where it expects the
        # container manager to have done so; Docker leaves every mount private, and then
        # LoadCredential= hands the service an empty credentials directory (the ramfs systemd
        # mounts in a child namespace never propagates back).
        "command": ["sh", "-c", "mount --make-rshared / && exec /sbin/init"],
        "name": name,
        "detach": True,
        "network_mode": "host",
        "cap_add": ["SYS_ADMIN"],
        "tmpfs": {"/run": "", "/run/lock": "", "/tmp": ""},
        "volumes": volumes,
        # systemd wants to know it runs in a container (no udev, no hardware targets).
        "environment": {"container": "docker"},
        "stop_signal": "SIGRTMIN+3",
    }


if __name__ == "__main__":
    print(build_tarball())
    sys.exit(0)
