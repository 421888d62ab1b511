"""The agent's GPU usage: NVML read off the event loop, mapped to containers, and what the
heartbeat says of it (``Heartbeat.gpus``, ``ContainerReport.gpu``, the GPU labels).

The reading (``specon.runtime.gpu``) blocks, so it runs in a thread; the host PIDs of the
containers come from the runtime (``Runtime.pids``), asked only when a GPU has processes. A
failed read keeps the previous sample: a worker's GPUs, its labels and its capacity must not
flicker out of placement for one bad read.
"""

from __future__ import annotations

import asyncio

import structlog

from specon.model import ContainerId, GpuState
from specon.runtime.base import Runtime
from specon.runtime.gpu.nvml import NvmlReader
from specon.runtime.gpu.sample import GpuSample, sample_of
from specon.wire.gpu import GpuDevice, GpuUse
from specon.wire.limits import MAX_BYTES, MAX_GPU_DEVICES

log = structlog.get_logger()


class GpuUsage:
    """The newest ``GpuSample`` of a worker (None: no GPU read yet, or no NVML)."""

    def __init__(self, reader: NvmlReader | None) -> None:
        self.reader = reader
        self.sample: GpuSample | None = None
        self.pid_failures = 0  # ``Runtime.pids`` calls that raised
        self._pid_error_logged = False

    async def refresh(self, runtime: Runtime) -> GpuSample | None:
        """Read the GPUs once more; the sample in effect after it."""
        reader = self.reader
        if reader is None or reader.state in ("unavailable", "closed"):
            self.sample = None
            return None
        at = runtime.now()
        reading = await asyncio.to_thread(reader.read)
        if reading is None:
            return self.sample  # this read failed (counted by the reader): keep the last
        pids = await self._pids(runtime) if reading.processes else {}
        self.sample = sample_of(reading, pids, at=at)
        return self.sample

    async def _pids(self, runtime: Runtime) -> dict[ContainerId, frozenset[int]]:
        try:
            return await runtime.pids()
        except Exception as exc:  # a backend's bug must not stop the monitor loop
            self.pid_failures += 1
            if not self._pid_error_logged:
                self._pid_error_logged = True
                log.warning("specon.agent.gpu_pids_failed", error=f"{type(exc).__name__}: {exc}")
            return {}

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()


def device_reports(sample: GpuSample | None) -> tuple[GpuDevice, ...]:
    """``Heartbeat.gpus``: the reader's devices as they are (it keeps them within the protocol's
    limits), at most as many as a heartbeat carries."""
    return () if sample is None else tuple(sample.devices[:MAX_GPU_DEVICES])


def gpu_use(cid: ContainerId, sample: GpuSample | None, states: dict[ContainerId, GpuState]) -> GpuUse | None:
    """``ContainerReport.gpu``: what NVML saw of the container, in the state the GPU sharing
    has it in (running unless it says otherwise). None for a container with no GPU process
    that the sharing does not hold frozen or suspended."""
    use = None if sample is None else sample.containers.get(cid)
    state = states.get(cid)
    if use is None:
        return None if state in (None, "running") else GpuUse(state=state)
    return GpuUse(
        devices=use.devices[:MAX_GPU_DEVICES],
        memory=min(use.memory, MAX_BYTES),
        utilisation=use.utilisation,
        state=state or use.state,
    )
