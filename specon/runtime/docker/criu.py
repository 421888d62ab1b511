"""Transparent migration of a Docker container with CRIU (``migration.mode: criu``).

Docker's checkpoint API (experimental engines only) freezes a running container's processes
into image files and restores them in a container created elsewhere, so a job moves without
its cooperation: no SIGTERM handler, no restart from its last checkpoint. The flow across two
engines (INFRA.md "CRIU"):

1. ``checkpoint`` on the source: ``POST /containers/{id}/checkpoints`` with ``Exit`` true:
   the container stops (``Exited (137)``) and its images land in ``<dir>/<name>``;
2. on the target, create the container from the same recipe (not started), then ``restore``:
   copy ``<dir>/<name>`` into ``<data root>/containers/<id>/checkpoints/<name>`` and
   ``POST /containers/{id}/start?checkpoint=<name>`` (``start --checkpoint-dir`` is refused).

The engine runs ``criu`` from its PATH (``scripts/install-criu.sh`` installs a working 4.1
wrapper); a container started with ``init=True`` restores only under a *static* tini given as
a real file to ``dockerd --init-path``. :func:`criu_refusal` says beforehand why a container
cannot move this way (GPUs, engine not experimental, ...); the job contract's checkpoint is
then the way to move it. A failed checkpoint leaves the container running (CRIU thaws it).

The calls take the docker SDK's low-level client (``DockerClient.api``) and use its own
request helpers, as its methods do; this module does not import ``docker`` (``backend``,
``engine`` and ``criu_store`` do), so errors are recognised by their shape. Where a job's
images are kept between a save and the next start is ``criu_store``'s.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import structlog

from specon.runtime.base import SaveFailed, StartFailed

log = structlog.get_logger()

# Docker's checkpoint names: at least 2 characters (a one-character name is refused).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]+$")
# CRIU's own log, named in the engine's error: "... path= /.../criu-dump.log: unknown".
_LOG_PATH = re.compile(r"(?:path=|log file:)\s*(/\S+?\.log)")
# What the engine says when CRIU itself cannot work there (not this container's fault).
_ENGINE_PROBLEMS = (
    "experimental feature is disabled",
    "executable file not found",
    "kerndat",
    "vdso",
    "criu version",
    "cannot find criu",
)
# Restores occasionally fail once with this (containerd's content store) and pass on retry.
_RETRY_RESTORE = re.compile(r"content .*already exists")
CHECKPOINT_TIMEOUT = 300.0


class CheckpointApi(Protocol):
    """The part of ``docker.APIClient`` used here."""

    def _url(self, pathfmt: str, *args: str, **kwargs: Any) -> str: ...

    def _post(self, url: str, **kwargs: Any) -> Any: ...

    def _post_json(self, url: str, data: Any, **kwargs: Any) -> Any: ...

    def _raise_for_status(self, response: Any) -> None: ...

    def info(self) -> dict[str, Any]: ...

    def inspect_container(self, container: str) -> dict[str, Any]: ...


class CriuUnavailable(SaveFailed):
    """CRIU cannot work on this engine at all (not experimental, criu missing or refused by the
    kernel): a caller stops trying CRIU there and moves jobs by the job contract."""


def criu_refusal(
    container_attrs: Mapping[str, Any],
    engine_info: Mapping[str, Any],
    target_info: Mapping[str, Any] | None = None,
) -> str | None:
    """Why this container cannot be moved with CRIU (``None``: it may be tried).

    ``container_attrs``: ``docker inspect`` of the container; ``engine_info``: ``docker info``
    of its engine; ``target_info``: that of the engine it would be restored on, if known.
    Only what can be told without trying; CRIU being absent or broken on an experimental
    engine shows as :class:`CriuUnavailable` from :func:`checkpoint`.
    """
    gpu = _gpu(container_attrs)
    if gpu:
        return f"CRIU cannot checkpoint GPU containers ({gpu})"
    state = container_attrs.get("State") or {}
    if not state.get("Running") or state.get("Paused"):
        return f"container is {state.get('Status') or 'not running'}"
    for role, info in (("source", engine_info), ("target", target_info)):
        if info is None:
            continue
        if info.get("ExperimentalBuild") is not True:
            return f"{role} engine runs without --experimental (Docker's checkpoint API is off)"
        host = container_attrs.get("HostConfig") or {}
        init = str(info.get("InitBinary") or "")
        if role == "target" and host.get("Init") and init and os.path.islink(init):
            return (
                f"target engine's --init-path {init} is a symlink (an init=True container would not restore)"
            )
    return None


def _gpu(attrs: Mapping[str, Any]) -> str:
    host = attrs.get("HostConfig") or {}
    for req in host.get("DeviceRequests") or []:
        caps = {c for group in req.get("Capabilities") or [] for c in group}
        if req.get("Driver") == "nvidia" or "gpu" in caps:
            return "device request for GPUs"
    for dev in host.get("Devices") or []:
        path = str(dev.get("PathOnHost", ""))
        if path.startswith(("/dev/nvidia", "/dev/dri")):
            return f"device {path}"
    if host.get("Runtime") == "nvidia":
        return "runtime nvidia"
    for item in (attrs.get("Config") or {}).get("Env") or []:
        key, _, value = str(item).partition("=")
        if key == "NVIDIA_VISIBLE_DEVICES" and value not in ("", "void", "none"):
            return f"NVIDIA_VISIBLE_DEVICES={value}"
    return ""


def checkpoint(
    api: CheckpointApi,
    container_id: str,
    name: str,
    checkpoint_dir: Path,
    *,
    timeout: float = CHECKPOINT_TIMEOUT,
) -> float:
    """Checkpoint the running container into ``checkpoint_dir/name`` and stop it; seconds taken.

    ``SaveFailed`` (``CriuUnavailable`` when CRIU cannot work on this engine) with the engine's
    reason and CRIU's own error lines; the container then still runs.
    """
    _check_name(container_id, name)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if (checkpoint_dir / name).exists():
        raise SaveFailed(container_id, f"checkpoint {checkpoint_dir / name} exists already; still running")
    t0 = time.perf_counter()
    url = api._url("/containers/{0}/checkpoints", container_id)
    data = {"CheckpointID": name, "CheckpointDir": str(checkpoint_dir), "Exit": True}
    try:
        api._raise_for_status(api._post_json(url, data=data, timeout=timeout))
    except Exception as exc:
        reason = _reason(exc)
        running = _running(api, container_id)
        cls = CriuUnavailable if _engine_problem(reason) else SaveFailed
        log.warning(
            "specon.runtime.criu.checkpoint_failed", container=container_id, reason=reason, running=running
        )
        # A half-written image directory must not be restored later.
        shutil.rmtree(checkpoint_dir / name, ignore_errors=True)
        state = "still running" if running else "not running"
        raise cls(container_id, f"CRIU checkpoint failed ({state}): {reason}") from exc
    seconds = time.perf_counter() - t0
    if not (checkpoint_dir / name / "inventory.img").is_file():
        raise SaveFailed(
            container_id, f"checkpoint reported done but {checkpoint_dir / name} has no CRIU images"
        )
    log.info(
        "specon.runtime.criu.checkpointed", container=container_id, checkpoint=name, seconds=round(seconds, 3)
    )
    return seconds


def restore(
    api: CheckpointApi,
    container_id: str,
    name: str,
    checkpoint_dir: Path,
    data_root: Path | None = None,
    *,
    timeout: float = CHECKPOINT_TIMEOUT,
) -> float:
    """Start the created (never started) container from ``checkpoint_dir/name``; seconds taken.

    ``data_root``: the engine's ``DockerRootDir`` (asked when ``None``); the engine must share
    this machine's file system (the agent runs beside its engine). ``StartFailed`` with the
    engine's reason.
    """
    _check_name(container_id, name)
    source = checkpoint_dir / name
    if not (source / "inventory.img").is_file():
        raise StartFailed(container_id, f"no CRIU checkpoint at {source}")
    t0 = time.perf_counter()
    try:
        full_id = str(api.inspect_container(container_id)["Id"])
        root = data_root if data_root is not None else Path(str(api.info()["DockerRootDir"]))
    except Exception as exc:
        raise StartFailed(container_id, f"cannot restore: {_reason(exc)}") from exc
    dest = root / "containers" / full_id / "checkpoints" / name
    url = api._url("/containers/{0}/start", full_id)
    for attempt in (1, 2):
        try:
            _copy_tree(source, dest)
            api._raise_for_status(api._post(url, params={"checkpoint": name}, timeout=timeout))
            break
        except Exception as exc:
            reason = _reason(exc)
            if attempt == 1 and _RETRY_RESTORE.search(reason):
                log.info("specon.runtime.criu.restore_retry", container=container_id, reason=reason)
                continue
            log.warning("specon.runtime.criu.restore_failed", container=container_id, reason=reason)
            raise StartFailed(container_id, f"CRIU restore failed: {reason}") from exc
    seconds = time.perf_counter() - t0
    log.info(
        "specon.runtime.criu.restored", container=container_id, checkpoint=name, seconds=round(seconds, 3)
    )
    return seconds


def _check_name(container_id: str, name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"{container_id}: bad checkpoint name {name!r} (2+ characters of [A-Za-z0-9_.-])")


def _copy_tree(source: Path, dest: Path) -> None:
    """Hard links where source and destination share a file system (CRIU only reads the
    images on restore), else copies; replaces what an earlier attempt left."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)

    def link_or_copy(src: str, dst: str) -> object:
        try:
            os.link(src, dst)
        except OSError:
            return shutil.copy2(src, dst)
        return dst

    shutil.copytree(source, dest, copy_function=link_or_copy)


def _running(api: CheckpointApi, container_id: str) -> bool | None:
    with contextlib.suppress(Exception):
        return bool(api.inspect_container(container_id)["State"]["Running"])
    return None


def _engine_problem(reason: str) -> bool:
    low = reason.lower()
    return any(p in low for p in _ENGINE_PROBLEMS)


def _reason(exc: BaseException) -> str:
    """The engine's message (``APIError.explanation``), plus CRIU's error lines from the log it
    names when that log is still there."""
    text = str(getattr(exc, "explanation", None) or exc).strip()
    match = _LOG_PATH.search(text)
    if match:
        errors = _criu_errors(Path(match.group(1)))
        if errors:
            text = f"{text} | criu: {errors}"
    return text


def _criu_errors(path: Path, keep: int = 3) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.split(") ", 1)[-1] for line in lines if "Error (" in line]
    return "; ".join(errors[-keep:])
