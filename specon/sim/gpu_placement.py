"""GPU workers and jobs as the manager sees them, and where a GPU job may start.

A simulated GPU worker advertises what a real agent does (``specon.model``'s NVIDIA labels:
product, memory per device in MiB, device count) and ``gpus * gpu_share`` of
``nvidia.com/gpu`` (``gpu_share``: the jobs one device may hold, the device plugin's
time-slicing replicas); a GPU job requests ``gpu`` of them, its memory per device
(``ContainerSnapshot.gpu_memory``) and, where it names one, its product as a selector pair.
The arrival of a GPU job and the manager's moves check the same rule,
``specon.policy.placement.fits``: a job that fits nowhere yet waits for a free GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from specon.model import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    Category,
    ContainerId,
    ContainerSnapshot,
    Resources,
    WorkerId,
    WorkerSnapshot,
)
from specon.policy.placement import fits
from specon.sim.cluster import JobPlan, WorkerSpec


def capacity(worker: WorkerSpec) -> Resources:
    """What ``worker`` advertises: its cores, and its GPU slots."""
    return Resources(cpu=worker.cpu, gpu=worker.gpus * worker.gpu_share)


def labels(worker: WorkerSpec) -> dict[str, str]:
    """The GPU labels an agent sets from NVML (none on a worker without GPUs)."""
    if not worker.gpus:
        return {}
    out = {GPU_COUNT_LABEL: str(worker.gpus), GPU_MEMORY_LABEL: str(worker.gpu_memory // 2**20)}
    if worker.gpu_product is not None:
        out[GPU_PRODUCT_LABEL] = worker.gpu_product
    return out


def requests(job: JobPlan) -> Resources:
    return Resources(gpu=job.gpu)


def selector(job: JobPlan) -> dict[str, str]:
    """The node selector of a job bound to a GPU product."""
    return {} if job.gpu_product is None else {GPU_PRODUCT_LABEL: job.gpu_product}


def first_fit(
    job: JobPlan, order: Iterable[WorkerSpec], used: Mapping[WorkerId, Resources]
) -> WorkerId | None:
    """The first worker of ``order`` where ``job`` fits beside what is ``used`` there."""
    for worker in order:
        snap = ContainerSnapshot(
            id=ContainerId(job.id),
            worker=worker.id,
            category=Category.PROGRESSING,
            requests=requests(job),
            selector=tuple(sorted(selector(job).items())),
            gpu_memory=job.gpu_memory,
        )
        host = WorkerSnapshot(
            id=worker.id, capacity=capacity(worker), labels=tuple(sorted(labels(worker).items()))
        )
        if fits(snap, host, used.get(worker.id, Resources())):
            return worker.id
    return None
