"""Container images built offline from this host, for the real-engine tests (no registry here).

An image is a near-empty root filesystem (``host_rootfs``): merged-/usr symlinks, ``/etc``
basics and empty mount points. A container of it sees the host's ``/usr``, the Python install,
the project's venv and the repo through read-only bind mounts at the same paths
(``host_binds``), so the interpreter, torch and specon inside are exactly the host's and the
image costs nothing to build (INFRA.md: "an empty image plus read-only bind mounts", 0.1 s).
The shared volume is bound read-write at its host path, so every path a job's env names is
the same inside and out.

``docker_archive`` writes the ``docker save`` format from such a directory, for engines that
import tarballs (``ctr images import``, ``docker load``) rather than build.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Debian 12 merges /bin, /sbin and /lib* into /usr: the image keeps the links, /usr is bound.
_USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
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
    for d in ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "data", "var/tmp", "run"):
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


def _layer(rootfs: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(rootfs.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(rootfs)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def docker_archive(rootfs: Path, tag: str, out: Path, *, entrypoint: list[str] | None = None) -> Path:
    """Write ``rootfs`` as a one-layer image tagged ``tag`` in the ``docker save`` format."""
    layer = _layer(rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "tests/rootfs.py"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.removeprefix("sha256:") + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [tag], "Layers": [layer_name]}]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w") as tar:
        for name, data in (
            (config_name, config_bytes),
            (layer_name, layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out
