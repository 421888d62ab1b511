"""An NVML reading mapped onto a worker's containers, and the worker's GPU labels. Pure.

A GPU process belongs to the container whose processes include its host PID
(``Runtime.pids``); one in no container of this worker (another tenant's, the MPS server's,
or every process where the agent cannot see host PIDs: a pod agent without ``hostPID``) is
left out and counted in ``GpuSample.unmapped``.

A container's use: the devices its processes hold a context on, the GPU memory they hold
(summed over its processes and devices), and its SM utilisation: per device the sum of its
processes' newest samples (at most 100), averaged over the devices where one of them was
sampled. None where none was: no kernel of it ran since the previous read (a frozen job,
an idle one) or it runs under MPS, where NVML samples only the MPS server's PID.

Its values are the wire's own (``specon.wire.gpu``): a heartbeat carries them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from specon.model import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    ContainerId,
    Resources,
    gpu_product_label,
)
from specon.runtime.gpu.nvml import NvmlReading
from specon.wire.gpu import GpuDevice, GpuUse

MIB = 2**20


@dataclass(frozen=True, slots=True)
class GpuSample:
    """The worker's GPUs and each container's use of them, at one read."""

    devices: tuple[GpuDevice, ...] = ()
    # Only containers with a process on a GPU: the others use none (as far as NVML sees).
    containers: Mapping[ContainerId, GpuUse] = field(default_factory=dict)
    # GPU processes in no container of this worker.
    unmapped: int = 0
    # The runtime's clock as the read began (None: not known). What a read says of a job is
    # no news of anything that happened to it after: a job saved away meanwhile still shows.
    at: float | None = None


def sample_of(
    reading: NvmlReading, pids: Mapping[ContainerId, Iterable[int]], *, at: float | None = None
) -> GpuSample:
    """``reading`` (begun at ``at``) mapped onto the containers whose host PIDs ``pids`` lists."""
    owner: dict[int, ContainerId] = {}
    for claimant in sorted(pids):  # a PID claimed twice (a bug elsewhere) goes to one, always the same
        for pid in pids[claimant]:
            owner.setdefault(pid, claimant)
    devices: dict[ContainerId, set[int]] = {}
    memory: dict[ContainerId, int] = {}
    sm: dict[ContainerId, dict[int, float]] = {}  # container -> device -> summed SM %
    unmapped = 0
    for proc in reading.processes:
        cid = owner.get(proc.pid)
        if cid is None:
            unmapped += 1
            continue
        devices.setdefault(cid, set()).add(proc.device)
        memory[cid] = memory.get(cid, 0) + (proc.memory or 0)
        if proc.utilisation is not None:
            per_device = sm.setdefault(cid, {})
            per_device[proc.device] = min(100.0, per_device.get(proc.device, 0.0) + proc.utilisation)
    containers: dict[ContainerId, GpuUse] = {}
    for cid in sorted(devices):
        sampled = sm.get(cid)
        containers[cid] = GpuUse(
            devices=tuple(sorted(devices[cid])),
            memory=memory[cid],
            utilisation=round(sum(sampled.values()) / len(sampled), 1) if sampled else None,
        )
    return GpuSample(devices=reading.devices, containers=containers, unmapped=unmapped, at=at)


def gpu_labels(devices: Sequence[GpuDevice]) -> dict[str, str]:
    """The placement labels of a worker with these GPUs (none without GPUs).

    ``GPU_PRODUCT_LABEL``: the product of its first device (NVML's lowest index): a worker
    mixing products is labelled by one, as GPU feature discovery labels a node, so a job that
    selects a product lands where at least device 0 is one; ``GPU_MEMORY_LABEL``: the smallest
    device's memory in MiB, the most any job can count on per device; ``GPU_COUNT_LABEL``.
    """
    if not devices:
        return {}
    first = min(devices, key=lambda d: d.index)
    labels = {
        GPU_MEMORY_LABEL: str(min(d.memory_total for d in devices) // MIB),
        GPU_COUNT_LABEL: str(len(devices)),
    }
    if product := gpu_product_label(first.name):
        labels[GPU_PRODUCT_LABEL] = product
    return labels


# The backends whose own count of GPUs jobs may use stands even at 0: a Docker host's rule
# (``--docker-allow-gpus``: none unless allowed) and a Kubernetes node's allocatable
# ``nvidia.com/gpu`` (the device plugin decides). A local worker has every GPU NVML finds.
GPU_COUNTING_RUNTIMES = frozenset({"docker", "kubernetes"})


def gpu_capacity(
    capacity: Resources, devices: Sequence[GpuDevice], *, runtime: str | None = None
) -> Resources:
    """``capacity`` counting the GPUs NVML found, where the runtime gave no count of its own
    and is not one that counts them itself (``GPU_COUNTING_RUNTIMES``; ``runtime``: its
    ``specon.model.RUNTIME_LABEL``)."""
    if capacity.gpu or not devices or runtime in GPU_COUNTING_RUNTIMES:
        return capacity
    return replace(capacity, gpu=len(devices))
