"""A Docker job's recorded container config, and the rules a host applies before running one.

The Docker backend re-creates a saved job on another engine from a *recipe*: image, command,
env, read-only binds, labels and CPU limits, recorded when the job was first seen (from
``docker inspect`` of the container a user started, or from a submitted spec). The recipe is
stored by the agent outside every job's directory, but it travels through the shared volume,
so each host checks it against its own :class:`HostRules` before creating anything (SPEC:
nothing received from elsewhere decides what a host executes): no privileged mode, capabilities
or devices are ever recorded; a bind must be read-only and under a prefix this host allows;
network is ``none`` unless this host allows ``host``; the only writable mount is the job's own
directory on the volume, which the backend adds itself.

GPUs are the one device a recipe carries, as the engine's own ``DeviceRequests`` entry in one
normal form: driver ``nvidia``, a ``Count``, capabilities ``[["gpu"]]``, no ``DeviceIDs`` (they
name the source host's devices; the target's engine picks its own) and no options. A host
runs it only where its rule allows that many GPUs per job (``HostRules.gpus``, the agent's
``--docker-allow-gpus``; default 0: every GPU request is refused).

Pure: no Docker import; ``specon.runtime.docker.engine.create_kwargs`` turns a checked recipe
into SDK arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from specon.wire import codec

LABEL_MANAGED = "specon.io/managed"
MANAGED = {"label": f"{LABEL_MANAGED}=true"}  # the list filter of the containers specon manages
LABEL_JOB = "specon.io/job"
# One run of a job (a container): the write-ahead owner record names it before it exists.
LABEL_RUN = "specon.io/run"
# Per-job override of ``migration.mode`` (checkpoint | criu).
LABEL_MIGRATION = "specon.io/migration-mode"
NETWORK_MODES = ("none", "host")
GPU_DRIVER = "nvidia"
GPU_CAPABILITIES: tuple[tuple[str, ...], ...] = (("gpu",),)


@dataclass(frozen=True, slots=True)
class Bind:
    source: str
    target: str


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One entry of the engine's ``HostConfig.DeviceRequests``, under the engine's own keys.

    A recipe carries GPUs only, in the normal form ``from_inspect`` writes (``nvidia``, a
    count, ``[["gpu"]]``); ``problems`` refuses any other, whoever wrote the recipe.
    """

    driver: str = field(default="", metadata={"key": "Driver"})
    # GPUs wanted; -1: all of the host's (the engine's notation, never carried: refused).
    count: int = field(default=0, metadata={"key": "Count"})
    device_ids: tuple[str, ...] = field(default=(), metadata={"key": "DeviceIDs"})
    # An OR list of AND lists of capabilities.
    capabilities: tuple[tuple[str, ...], ...] = field(default=(), metadata={"key": "Capabilities"})


def gpu_request(count: int) -> DeviceRequest:
    """The normal form of a request for ``count`` GPUs (``docker run --gpus <count>``)."""
    return DeviceRequest(driver=GPU_DRIVER, count=count, capabilities=GPU_CAPABILITIES)


@dataclass(frozen=True, slots=True)
class Recipe:
    """What ``docker create`` needs to run the job again, minus its own volume mount."""

    image: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    # Read-only binds (the job's writable directory on the volume is added at create time).
    binds: tuple[Bind, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    # Where the shared volume's root appears inside the container (the job contract's paths).
    volume_target: str = "/data"
    nano_cpus: int | None = None
    cpu_shares: int | None = None
    mem_limit: int | None = None
    working_dir: str | None = None
    user: str | None = None
    network_mode: str = "none"
    init: bool = False
    # GPUs, as the engine's device requests in their normal form (such a job cannot move by
    # CRIU). Recipes written before this field carried a bare count, never used: ignored.
    device_requests: tuple[DeviceRequest, ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs the job requests (placement's ``Resources.gpu``); "all" (-1) counts none."""
        return sum(max(0, r.count) for r in self.device_requests)

    def to_json(self) -> str:
        return json.dumps(codec.to_data(self, Recipe), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Recipe:
        """Parse ``to_json`` output; ``ValueError`` naming what is wrong."""
        try:
            return codec.from_data(Recipe, json.loads(text), strict=False)
        except (codec.SchemaError, ValueError) as e:
            detail = codec.explain(e) if isinstance(e, codec.SchemaError) else str(e)
            raise ValueError(f"bad container recipe: {detail}") from None


@dataclass(frozen=True, slots=True)
class HostRules:
    """What this host agrees to run: the volume it mounts and the binds it allows."""

    # The shared volume's root on this host.
    volume: str
    # Host path prefixes that may be bound read-only into a job (e.g. a dataset directory).
    ro_bind_prefixes: tuple[str, ...] = ()
    host_network: bool = False
    # Images a job may use; empty: any image present on the engine.
    images: tuple[str, ...] = field(default=())
    # GPUs one job may request here (``docker run --gpus N``, N at most this), and what this
    # host offers placement; 0: none, every GPU device request is refused. Set by this host's
    # agent (``--docker-allow-gpus``), never by anything received.
    gpus: int = 0

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"host rules: gpus must be >= 0, got {self.gpus}")


def _under(path: str, prefix: str) -> bool:
    p, root = PurePosixPath(path), PurePosixPath(prefix)
    return p == root or root in p.parents


def problems(recipe: Recipe, rules: HostRules) -> list[str]:
    """Every reason this host refuses ``recipe`` (empty: it may run)."""
    out = []
    if not recipe.image:
        out.append("image: empty")
    elif rules.images and recipe.image not in rules.images:
        out.append(f"image: {recipe.image!r} is not among this host's allowed images")
    if not recipe.command or not all(recipe.command):
        out.append("command: must be a non-empty list of non-empty strings")
    if recipe.network_mode not in NETWORK_MODES:
        out.append(f"network_mode: {recipe.network_mode!r} (allowed: none, host)")
    elif recipe.network_mode == "host" and not rules.host_network:
        out.append("network_mode: host is not allowed on this host")
    if not PurePosixPath(recipe.volume_target).is_absolute():
        out.append(f"volume_target: {recipe.volume_target!r} is not an absolute path")
    for i, b in enumerate(recipe.binds):
        src, dst = PurePosixPath(b.source), PurePosixPath(b.target)
        if not src.is_absolute() or not dst.is_absolute() or ".." in src.parts or ".." in dst.parts:
            out.append(f"binds[{i}]: {b.source} -> {b.target}: paths must be absolute, without '..'")
        elif _under(b.source, rules.volume) or _under(rules.volume, b.source):
            out.append(f"binds[{i}]: {b.source} overlaps the shared volume")
        elif not any(_under(b.source, p) for p in rules.ro_bind_prefixes):
            out.append(f"binds[{i}]: {b.source} is not under a read-only bind prefix this host allows")
        if _under(b.target, recipe.volume_target) or _under(recipe.volume_target, b.target):
            out.append(f"binds[{i}]: target {b.target} overlaps the volume's place {recipe.volume_target}")
    for key, value in (("nano_cpus", recipe.nano_cpus), ("cpu_shares", recipe.cpu_shares)):
        if value is not None and value <= 0:
            out.append(f"{key}: must be > 0, got {value}")
    if recipe.mem_limit is not None and recipe.mem_limit < 6 * 1024 * 1024:
        out.append(f"mem_limit: below Docker's 6 MiB minimum ({recipe.mem_limit})")
    return out + _gpu_problems(recipe, rules)


def _gpu_problems(recipe: Recipe, rules: HostRules) -> list[str]:
    out = []
    for i, r in enumerate(recipe.device_requests):
        where = f"device_requests[{i}]"
        if r.driver != GPU_DRIVER:
            out.append(f"{where}: driver {r.driver!r}: only NVIDIA GPUs (driver {GPU_DRIVER!r}) are carried")
        if r.capabilities != GPU_CAPABILITIES:
            caps = [list(c) for c in r.capabilities]
            out.append(
                f"{where}: capabilities {caps}: only [['gpu']] is carried"
                " (NVIDIA driver capabilities go in the job's NVIDIA_DRIVER_CAPABILITIES)"
            )
        if r.device_ids:
            out.append(f"{where}: DeviceIDs {list(r.device_ids)} name another host's GPUs: ask for a Count")
        if r.count == -1:
            out.append(f"{where}: Count -1 (all GPUs) is no number this host can check: ask for a Count")
        elif r.count < 1:
            out.append(f"{where}: Count must be >= 1, got {r.count}")
    wanted = recipe.gpus
    if wanted and rules.gpus == 0:
        out.append(f"GPUs: the job requests {wanted}; this host allows none (agent flag --docker-allow-gpus)")
    elif wanted > rules.gpus:
        out.append(f"GPUs: the job requests {wanted}; this host allows at most {rules.gpus} per job")
    return out


def from_inspect(attrs: dict[str, Any], *, volume: str, all_gpus: int = 0) -> Recipe:
    """The recipe of a container a user started (``docker inspect`` output).

    The mount of the shared volume (``volume`` on the host) becomes ``volume_target``;
    every other bind is kept as a read-only bind, to be judged by ``problems`` like any other.
    Privileged mode, capabilities and devices are not recorded at all, so they never
    reach another host (such a container is reported and refused by the backend). GPU device
    requests become one request in normal form (``gpu_requests``; "all" is ``all_gpus``).
    """
    config = attrs.get("Config") or {}
    host = attrs.get("HostConfig") or {}
    command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    env = []
    for item in config.get("Env") or []:
        key, sep, value = str(item).partition("=")
        if sep and not key.startswith("SPECON_"):
            env.append((key, value))
    volume_target = volume
    binds = []
    for m in attrs.get("Mounts") or []:
        if m.get("Type") != "bind":
            continue
        src, dst = str(m.get("Source", "")), str(m.get("Destination", ""))
        if _under(volume, src) or _under(src, volume):
            # The volume (or a job directory in it) is re-mounted per job at create time;
            # where it appears inside tells where the job contract's paths are.
            if _under(volume, src):
                volume_target = str(PurePosixPath(dst) / PurePosixPath(volume).relative_to(src))
            else:
                rel = PurePosixPath(src).relative_to(volume)
                if PurePosixPath(dst).parts[-len(rel.parts) :] == rel.parts:
                    volume_target = str(PurePosixPath(*PurePosixPath(dst).parts[: -len(rel.parts)]))
            continue
        binds.append(Bind(src, dst))
    return Recipe(
        image=str(config.get("Image", "")),
        command=tuple(str(a) for a in command),
        env=tuple(env),
        binds=tuple(binds),
        labels=tuple(sorted((str(k), str(v)) for k, v in (config.get("Labels") or {}).items())),
        volume_target=volume_target,
        nano_cpus=host.get("NanoCpus") or None,
        cpu_shares=host.get("CpuShares") or None,
        mem_limit=host.get("Memory") or None,
        working_dir=config.get("WorkingDir") or None,
        user=config.get("User") or None,
        network_mode=str(host.get("NetworkMode") or "none"),
        init=bool(host.get("Init")),
        device_requests=gpu_requests(host.get("DeviceRequests") or [], all_gpus=all_gpus),
    )


def is_gpu_request(raw: Any) -> bool:
    """An engine ``DeviceRequests`` entry for NVIDIA GPUs: driver ``nvidia``, or no driver and
    a capability set with ``gpu`` (the engine then picks the driver that has it), no options."""
    if not isinstance(raw, dict) or raw.get("Options"):
        return False
    caps = raw.get("Capabilities") or []
    driver = raw.get("Driver") or ""
    return driver == GPU_DRIVER or (driver == "" and any("gpu" in (group or []) for group in caps))


def gpu_requests(raw: list[Any], *, all_gpus: int = 0) -> tuple[DeviceRequest, ...]:
    """The engine's ``DeviceRequests`` of a container as a recipe carries them.

    GPU requests (``is_gpu_request``) with capabilities ``[["gpu"]]`` merge into one
    normal-form request: its count is ``Count``, or the number of ``DeviceIDs`` (the ids
    themselves name this host's devices and are dropped), and "all" (``Count`` -1) becomes
    ``all_gpus``, this host's allowed count, where that is known (else it stays -1, which
    ``problems`` refuses). Any other request is kept as it is, for ``problems`` to refuse
    with its reason (``unsafe_host_config`` already names it).
    """
    count, everything, others = 0, False, []
    for r in raw:
        if not isinstance(r, dict):
            others.append(DeviceRequest(driver=f"<not a request: {type(r).__name__}>"))
            continue
        caps = tuple(tuple(str(c) for c in group) for group in r.get("Capabilities") or [])
        ids = tuple(str(i) for i in r.get("DeviceIDs") or [])
        n = r.get("Count")
        n = n if isinstance(n, int) and not isinstance(n, bool) else 0
        if not is_gpu_request(r) or caps != GPU_CAPABILITIES:
            others.append(DeviceRequest(str(r.get("Driver") or ""), n, ids, caps))
        elif n == -1:
            everything = True
        else:
            count += len(ids) if ids else max(0, n)
    gpus = []
    if everything:
        gpus.append(gpu_request(all_gpus if all_gpus > 0 else -1))
    elif count:
        gpus.append(gpu_request(count))
    return (*gpus, *others)


def unsafe_host_config(attrs: dict[str, Any]) -> list[str]:
    """What a running container has that a recipe never carries (it would be lost, or worse,
    is a privilege): the backend refuses to manage such a container and says why."""
    host = attrs.get("HostConfig") or {}
    out = []
    if host.get("Privileged"):
        out.append("privileged")
    if host.get("CapAdd"):
        out.append(f"cap_add {host['CapAdd']}")
    if host.get("Devices"):
        out.append("devices")
    for r in host.get("DeviceRequests") or []:
        if not is_gpu_request(r):
            what = r.get("Driver") or r.get("Capabilities") if isinstance(r, dict) else r
            out.append(f"device request {what!r} (only NVIDIA GPU requests are carried)")
    if str(host.get("Runtime") or "") == GPU_DRIVER:
        out.append("runtime nvidia (its GPUs are no device request a recipe can carry: use --gpus)")
    if str(host.get("PidMode") or "") == "host":
        out.append("pid=host")
    return out
