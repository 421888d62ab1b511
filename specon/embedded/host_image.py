"""A container image made from this host's own Python, for the demo and the tests (offline).

An image is a near-empty root filesystem (``host_rootfs``): merged-/usr symlinks, ``/etc``
basics and empty mount points. A container of it sees the host's ``/usr``, the Python install,
the project's venv and its source through read-only bind mounts at the same paths
(``host_binds``), so the interpreter, torch and specon inside are exactly the host's and the
image costs nothing to build (INFRA.md: "an empty image plus read-only bind mounts", 0.1 s).
It ties a container to this machine's paths: right for the embedded demo and the tests, where
every "host" is this machine; a real cluster builds its training image (``Dockerfile``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The source tree specon runs from (editable install: the repo).
REPO = Path(__file__).resolve().parents[2]

# Debian 12 merges /bin and /lib* into /usr: the image keeps the links, /usr is bound. /sbin
# stays a directory: Docker mounts its init at /sbin/docker-init, which a link would put on the
# read-only /usr (every init=True container would fail to start).
_USR_LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"}
_PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nnogroup:x:65534:\n"


def python_prefix() -> Path:
    """The Python install the venv's interpreter belongs to (outside /usr under pyenv)."""
    return Path(sys.base_prefix).resolve()


def host_binds() -> list[tuple[str, str]]:
    """``(host path, container path)`` pairs to bind read-only: what a job's Python needs."""
    paths = ["/usr", str(python_prefix()), str(Path(sys.prefix).resolve()), str(REPO)]
    unique: list[str] = []
    for p in paths:
        # A path under another bound path comes with it (e.g. a venv inside the repo).
        if not any(p == u or p.startswith(u.rstrip("/") + "/") for u in unique):
            unique = [u for u in unique if not u.startswith(p.rstrip("/") + "/")] + [p]
    return [(p, p) for p in unique]


def host_rootfs(dest: Path) -> Path:
    """Write the image's root filesystem skeleton into ``dest`` (created; idempotent)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name, target in _USR_LINKS.items():
        link = dest / name
        if not link.is_symlink():
            link.symlink_to(target)
    for d in ("usr", "sbin", "etc", "tmp", "proc", "sys", "dev", "root", "data", "var/tmp", "run"):
        (dest / d).mkdir(parents=True, exist_ok=True)
    os.chmod(dest / "tmp", 0o1777)
    os.chmod(dest / "var/tmp", 0o1777)
    # Mount points of the binds, so read-only binds need no directory created at run time.
    for _host, inside in host_binds():
        (dest / inside.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (dest / "etc/passwd").write_text(_PASSWD)
    (dest / "etc/group").write_text(_GROUP)
    (dest / "etc/hosts").write_text("127.0.0.1 localhost\n")
    return dest
