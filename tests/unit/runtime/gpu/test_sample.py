"""A reading mapped onto containers by host PID, and the worker's GPU labels and capacity."""

from __future__ import annotations

from specon.model import (
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    ContainerId,
    Resources,
)
from specon.runtime.gpu.nvml import NvmlProcess, NvmlReading
from specon.runtime.gpu.sample import gpu_capacity, gpu_labels, sample_of
from specon.wire.gpu import GpuDevice, GpuUse

GIB = 2**30
A, B = ContainerId("a"), ContainerId("b")
H100 = GpuDevice(0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, 6 * GIB, 97.0)
A100 = GpuDevice(1, "GPU-1", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, 0.0)


def test_processes_map_to_their_containers() -> None:
    reading = NvmlReading(
        (H100, A100),
        (
            NvmlProcess(10, 0, 4 * GIB, 80.0),  # a's trainer
            NvmlProcess(11, 0, GIB, 15.0),  # a's second process on the same GPU
            NvmlProcess(12, 1, GIB, 50.0),  # a on the other GPU
            NvmlProcess(20, 0, GIB, None),  # b, not sampled
            NvmlProcess(99, 0, GIB, 3.0),  # another tenant's
        ),
    )
    sample = sample_of(reading, {A: frozenset({10, 11, 12}), B: frozenset({20, 21})})
    assert sample.devices == (H100, A100)
    assert sample.containers == {
        A: GpuUse(devices=(0, 1), memory=6 * GIB, utilisation=72.5),  # (95 + 50) / 2
        B: GpuUse(devices=(0,), memory=GIB, utilisation=None),
    }
    assert sample.unmapped == 1


def test_utilisation_of_one_device_is_at_most_100_and_unknown_memory_counts_nothing() -> None:
    reading = NvmlReading((H100,), (NvmlProcess(1, 0, None, 70.0), NvmlProcess(2, 0, GIB, 60.0)))
    sample = sample_of(reading, {A: [1, 2]})
    assert sample.containers[A] == GpuUse(devices=(0,), memory=GIB, utilisation=100.0)


def test_without_pids_every_process_is_unmapped() -> None:
    """A pod agent without the host's PID namespace: devices yes, containers none."""
    reading = NvmlReading((H100,), (NvmlProcess(1, 0, GIB, 70.0),))
    sample = sample_of(reading, {})
    assert sample.devices == (H100,)
    assert sample.containers == {}
    assert sample.unmapped == 1


def test_a_pid_claimed_twice_goes_to_one_container() -> None:
    reading = NvmlReading((H100,), (NvmlProcess(1, 0, GIB, 70.0),))
    assert set(sample_of(reading, {B: [1], A: [1]}).containers) == {A}


def test_labels_name_device_0s_product_and_the_smallest_memory() -> None:
    assert gpu_labels([A100, H100]) == {
        GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3",
        GPU_MEMORY_LABEL: str(40 * 1024),
        GPU_COUNT_LABEL: "2",
    }
    assert gpu_labels([]) == {}
    nameless = GpuDevice(0, "GPU-0", "", GIB)
    assert GPU_PRODUCT_LABEL not in gpu_labels([nameless])


def test_capacity_counts_devices_unless_the_node_said() -> None:
    assert gpu_capacity(Resources(cpu=4), [H100, A100]) == Resources(cpu=4, gpu=2)
    assert gpu_capacity(Resources(cpu=4, gpu=1), [H100, A100]) == Resources(cpu=4, gpu=1)
    assert gpu_capacity(Resources(cpu=4), []) == Resources(cpu=4)
    # A local worker has every GPU NVML finds; a Docker host only those its rule allows
    # (none by default) and a Kubernetes node its allocatable ones, also when that is 0.
    assert gpu_capacity(Resources(cpu=4), [H100], runtime="local") == Resources(cpu=4, gpu=1)
    assert gpu_capacity(Resources(cpu=4), [H100], runtime="docker") == Resources(cpu=4)
    assert gpu_capacity(Resources(cpu=4), [H100], runtime="kubernetes") == Resources(cpu=4)
