"""The Docker engine as ``DockerRuntime`` talks to it, one call at a time.

Connecting (``connect``), images (``import_image``), what identifies an engine
(``engine_id``, ``engine_labels``), what a container says about itself (``job_of``,
``container_job``, ``started_at``, ``init_pid``, ``cpu_seconds``, ``top_pids``), the live
containers of a listing (``live``) and the SDK's create arguments of a checked recipe
(``create_kwargs``, GPUs as ``docker.types.DeviceRequest``), a standby container's
(``standby_kwargs``) and what a listing reports of a job's container (``container_info``). The
SDK's calls block: callers on the event loop run them in a thread.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from specon.fence import ENV_GENERATION
from specon.model import ContainerId, WorkerId
from specon.runtime.base import (
    ENV_CHECKPOINT_DIR,
    ENV_DONE_FILE,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ENV_WORKER,
    ContainerInfo,
    ContainerState,
    JobSpec,
    valid_job_id,
)
from specon.runtime.docker.recipe import (
    GPU_CAPABILITIES,
    GPU_DRIVER,
    LABEL_JOB,
    LABEL_MANAGED,
    LABEL_MIGRATION,
    LABEL_RUN,
    MANAGED,
    Recipe,
)
from specon.runtime.docker.standby import (
    LABEL_STANDBY,
    SOCKET_DIR_INSIDE,
    StandbyConfig,
    idle_standby,
    server_command,
)
from specon.runtime.volume import JobPaths

__all__ = [
    "connect",
    "container_info",
    "container_job",
    "cpu_seconds",
    "create_kwargs",
    "engine_id",
    "engine_labels",
    "import_image",
    "init_pid",
    "job_of",
    "live",
    "standby_kwargs",
    "started_at",
    "top_pids",
]


def connect(url: str | None = None) -> docker.DockerClient:
    """A client of the engine at ``url`` (default: ``$DOCKER_HOST``, then the local socket)."""
    if url:
        return docker.DockerClient(base_url=url, timeout=60)
    return docker.from_env(timeout=60)


def import_image(client: docker.DockerClient, rootfs: Path, tag: str) -> str:
    """``docker import`` of the directory ``rootfs`` as ``tag``, unless the engine has it."""
    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(tag)
        return tag
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(rootfs), arcname=".")
    repo, _, version = tag.partition(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=version or "latest")
    return tag


def engine_id(info: Mapping[str, Any]) -> str:
    """The engine's identity in owner records, from ``docker info``."""
    # A container id means something only on the engine that issued it. Engines of one
    # machine may share an ID (it comes from /etc/docker/key.json), never a data root.
    return f"docker:{info.get('ID') or info.get('Name')}@{info.get('DockerRootDir')}"


def engine_labels(labels: list[str]) -> dict[str, str]:
    """The engine's ``key=value`` labels (``docker info``) as a mapping."""
    out = {}
    for item in labels:
        key, _, value = str(item).partition("=")
        if key:
            out[key] = value
    return out


def job_of(labels: Mapping[str, str], name: str) -> ContainerId | None:
    """The job id of a managed container (label, else name); None if it is not a valid id or
    the container is an idle standby."""
    if idle_standby(labels, name):
        return None
    with contextlib.suppress(ValueError):
        return valid_job_id(labels.get(LABEL_JOB) or name)
    return None


def container_job(c: Container) -> ContainerId | None:
    return job_of(c.labels or {}, c.name or "")


def started_at(attrs: Mapping[str, Any]) -> float:
    """When the container started (``docker inspect``), in seconds since the epoch; 0 if unknown."""
    raw = str((attrs.get("State") or {}).get("StartedAt") or "")
    with contextlib.suppress(ValueError):
        # Docker writes nanoseconds; fromisoformat takes at most microseconds.
        head, _, frac = raw.rstrip("Z").partition(".")
        return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()
    return 0.0


def init_pid(client: docker.DockerClient, c: Container) -> int | None:
    with contextlib.suppress(docker.errors.APIError, docker.errors.NotFound):
        return int((client.api.inspect_container(c.id).get("State") or {}).get("Pid") or 0) or None
    return None


def live(client: docker.DockerClient, statuses: tuple[str, ...]) -> dict[ContainerId, Container]:
    """The managed containers in one of ``statuses`` by job id, from one list call: the
    engine's summaries carry labels and state, so no container is inspected."""
    found = client.containers.list(sparse=True, filters={**MANAGED, "status": list(statuses)})
    out: dict[ContainerId, Container] = {}
    for c in found:
        job = job_of(c.attrs.get("Labels") or {}, (c.attrs.get("Names") or [""])[0].lstrip("/"))
        if job is not None:
            out[job] = c
    return out


def top_pids(c: Container) -> frozenset[int] | None:
    """Host PIDs of a running (or paused) container's processes, by the engine's ``top`` (it
    runs ``ps`` on the engine's host); None where the engine cannot say."""
    try:
        top = c.top(ps_args="-o pid")
    except (docker.errors.APIError, docker.errors.NotFound):
        return None
    titles = top.get("Titles") or []
    if "PID" not in titles:
        return None
    col = titles.index("PID")
    with contextlib.suppress(ValueError, IndexError, TypeError):
        return frozenset(int(row[col]) for row in top.get("Processes") or [])
    return None


def cpu_seconds(c: Container) -> float | None:
    """Cumulative CPU seconds of a running container, from one stats sample."""
    try:
        stats = c.stats(stream=False, one_shot=True)
    except (docker.errors.APIError, docker.errors.NotFound):
        return None
    total = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    return None if total is None else float(total) / 1e9


def create_kwargs(
    spec: JobSpec,
    recipe: Recipe,
    *,
    run_id: str,
    worker: WorkerId,
    job_dir: Path,
    generation: int | None = None,
) -> dict[str, Any]:
    """``containers.create`` arguments for a run of ``spec``: the recipe, the job's directory
    (``job_dir`` on the volume) as its only writable mount, the job contract's environment,
    and the labels that name the job and the run."""
    inside = PurePosixPath(recipe.volume_target) / "jobs" / spec.id
    env = dict(recipe.env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        {
            ENV_JOB_ID: spec.id,
            ENV_WORKER: worker,
            ENV_PROGRESS_FILE: str(inside / "progress.jsonl"),
            ENV_CHECKPOINT_DIR: str(inside / "checkpoints"),
            ENV_DONE_FILE: str(inside / "done"),
        }
    )
    if generation is not None:  # the run's own (specon.fence): read later, a newer start's could be
        env[ENV_GENERATION] = str(generation)
    volumes = {b.source: {"bind": b.target, "mode": "ro"} for b in recipe.binds}
    volumes[str(job_dir)] = {"bind": str(inside), "mode": "rw"}
    labels = {k: v for k, v in recipe.labels if not k.startswith("specon.io/")}
    labels.update({LABEL_MANAGED: "true", LABEL_JOB: spec.id, LABEL_RUN: run_id})
    migration = dict(recipe.labels).get(LABEL_MIGRATION)
    if migration:
        labels[LABEL_MIGRATION] = migration
    kwargs: dict[str, Any] = {
        "image": recipe.image,
        "command": list(recipe.command),
        "name": f"specon-{spec.id}-{run_id[:8]}",
        "environment": env,
        "volumes": volumes,
        "labels": labels,
        "network_mode": recipe.network_mode,
        "working_dir": recipe.working_dir or str(inside),
        "init": recipe.init or None,
        "detach": True,
    }
    for key in ("nano_cpus", "cpu_shares", "mem_limit", "user"):
        value = getattr(recipe, key)
        if value is not None:
            kwargs[key] = value
    if recipe.device_requests:  # checked by ``problems``: GPUs in normal form, allowed here
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(
                driver=r.driver, count=r.count, capabilities=[list(c) for c in r.capabilities]
            )
            for r in recipe.device_requests
        ]
    return kwargs


def standby_kwargs(
    config: StandbyConfig, image: str, gpu: int, *, name: str, socket_dir: Path
) -> dict[str, Any]:
    """``containers.create`` arguments of a standby for ``gpu`` running ``image``: what every job
    container of that image has (network none, no privileges, the host's read-only binds), its
    one GPU by index where ``config.gpu_devices``, and the agent's socket directory read-only."""
    volumes = {b.source: {"bind": b.target, "mode": "ro"} for b in config.binds}
    volumes[str(socket_dir)] = {"bind": SOCKET_DIR_INSIDE, "mode": "ro"}
    kwargs: dict[str, Any] = {
        "image": image,
        "command": server_command(config, gpu),
        "name": name,
        "environment": {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
        "volumes": volumes,
        "labels": {LABEL_MANAGED: "true", LABEL_STANDBY: str(gpu)},
        "network_mode": "none",
        "detach": True,
    }
    if config.gpu_devices:
        caps = [list(c) for c in GPU_CAPABILITIES]
        kwargs["device_requests"] = [
            docker.types.DeviceRequest(driver=GPU_DRIVER, device_ids=[str(gpu)], capabilities=caps)
        ]
    return kwargs


def container_info(
    job: ContainerId,
    c: Container,
    *,
    worker: WorkerId,
    spec: JobSpec,
    paths: JobPaths,
    busy: ContainerState | None,
    started: float | None = None,
) -> ContainerInfo:
    """What a listing reports of ``job``'s container ``c`` (``busy``: a save or stop of it in
    progress; ``started``: when its run started, if not when the container did)."""
    state_raw = c.attrs.get("State") or {}
    exit_code: int | None = None
    if busy is not None:
        state = busy
    elif c.status in ("running", "restarting", "paused", "created"):
        state = ContainerState.RUNNING
    else:
        exit_code = int(state_raw.get("ExitCode", -1))
        state = ContainerState.EXITED if exit_code == 0 else ContainerState.FAILED
    host = c.attrs.get("HostConfig") or {}
    # A standby's limit is set as a quota (``docker update`` takes no NanoCpus): either counts.
    quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or 0
    nano = host.get("NanoCpus") or (quota * 10**9 // period if quota > 0 and period > 0 else 0)
    return ContainerInfo(
        id=job,
        worker=worker,
        spec=spec,
        state=state,
        progress_path=paths.progress,
        checkpoint_dir=paths.checkpoints,
        started_at=started_at(c.attrs) if started is None else started,
        pid=None,
        handle=c.id,
        exit_code=exit_code,
        finished=state in (ContainerState.EXITED, ContainerState.FAILED) and paths.finished(),
        cpu_limit=nano / 1e9 if nano else None,
    )
