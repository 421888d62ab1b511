"""The GPU parts of the wire protocol (1.4): a worker's devices and one container's use of them.

Apart from ``protocol`` so that the runtimes' NVML reader (``specon.runtime.gpu``) builds these
very values: the runtimes may not import ``protocol``, which imports the coordinator.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specon.model import GpuState
from specon.wire.limits import BYTES, COUNT, MAX_GPU_DEVICES, SHORT_TEXT, Items, Range, limit


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU of a worker, from NVML (protocol 1.4)."""

    index: int = field(metadata=limit(COUNT))
    uuid: str = field(metadata=limit(SHORT_TEXT))
    name: str = field(metadata=limit(SHORT_TEXT))
    memory_total: int = field(metadata=limit(BYTES))
    memory_used: int = field(default=0, metadata=limit(BYTES))
    # SM utilisation over NVML's last sample period, percent (None: NVML could not say).
    utilisation: float | None = field(default=None, metadata=limit(Range(0, 100)))


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One container's GPUs (protocol 1.4): the devices its processes use, the GPU memory they
    hold, their SM utilisation (None: not sampled, e.g. under MPS) and what the agent's GPU
    sharing does with it."""

    devices: tuple[int, ...] = field(default=(), metadata=limit(Items(MAX_GPU_DEVICES)))
    memory: int = field(default=0, metadata=limit(BYTES))
    utilisation: float | None = field(default=None, metadata=limit(Range(0, 100)))
    state: GpuState = "running"
