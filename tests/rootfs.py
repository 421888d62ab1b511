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
import tarfile
from pathlib import Path

from specon.embedded.host_image import REPO, host_binds, host_rootfs, python_prefix

__all__ = ["REPO", "docker_archive", "host_binds", "host_rootfs", "python_prefix"]


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
