"""The NVML reader against the fake NVML (``specon.testing.fake_nvml``): no GPU needed.

Each test runs twice: with the fake handed to the reader, and with ``import pynvml``
answered by the fake (on the real ``nvidia-ml-py`` where it is installed, its functions
replaced, so its own ``NVMLError`` classes are what the reader meets).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import structlog

from specon.runtime.gpu.nvml import NvmlProcess, NvmlReader
from specon.testing.fake_nvml import (
    GIB,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNKNOWN,
    NVML_VALUE_NOT_AVAILABLE,
    FakeGpu,
    FakeNvml,
    FakeProcess,
)
from specon.wire.gpu import GpuDevice

Reader = Callable[[FakeNvml], NvmlReader]


@pytest.fixture(params=["injected", "imported"])
def reader_for(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Reader]:
    def make(fake: FakeNvml) -> NvmlReader:
        if request.param == "injected":
            return NvmlReader(module=fake.module)
        fake.install(monkeypatch)
        return NvmlReader()

    yield make


def two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(
                utilisation=97,
                processes=[FakeProcess(101, memory=4 * GIB, sm=80), FakeProcess(102, memory=GIB, sm=20)],
            ),
            FakeGpu(name="NVIDIA A100-SXM4-40GB", memory_total=40 * GIB, uuid="GPU-a100"),
        ]
    )


def test_reads_devices_processes_and_their_utilisation(reader_for: Reader) -> None:
    fake = two_gpus()
    reading = reader_for(fake).read()
    assert reading is not None
    assert reading.devices == (
        GpuDevice(0, "GPU-fake-0", "NVIDIA H100 80GB HBM3", 80 * GIB, 5 * GIB, 97.0),
        GpuDevice(1, "GPU-a100", "NVIDIA A100-SXM4-40GB", 40 * GIB, 0, 0.0),
    )
    assert reading.processes == (NvmlProcess(101, 0, 4 * GIB, 80.0), NvmlProcess(102, 0, GIB, 20.0))


def test_asks_only_for_samples_newer_than_the_last_seen(reader_for: Reader) -> None:
    fake = two_gpus()
    reader = reader_for(fake)
    reader.read()
    reader.read()
    first, second = [since for device, since in fake.since if device == 0]
    assert first == 0
    assert second > 0  # the newest timestamp the first read got


def test_no_sample_is_no_utilisation_not_a_failure(reader_for: Reader) -> None:
    """NVML's NOT_FOUND (nothing ran a kernel since the last read, or an MPS client)."""
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(7, sm=None), FakeProcess(8, mps=True)])])
    reader = reader_for(fake)
    reading = reader.read()
    assert reading is not None
    assert reading.processes == (NvmlProcess(7, 0, GIB, None), NvmlProcess(8, 0, GIB, None))
    assert reader.failures == 0


def test_memory_not_available_is_none(reader_for: Reader) -> None:
    fake = FakeNvml(
        [FakeGpu(processes=[FakeProcess(1, memory=None), FakeProcess(2, memory=NVML_VALUE_NOT_AVAILABLE)])]
    )
    reading = reader_for(fake).read()
    assert reading is not None
    assert [p.memory for p in reading.processes] == [None, None]


def test_a_failing_device_loses_only_itself_and_is_logged_once(reader_for: Reader) -> None:
    fake = two_gpus()
    fake.gpus[0].fail["nvmlDeviceGetMemoryInfo"] = NVML_ERROR_GPU_IS_LOST
    reader = reader_for(fake)
    with structlog.testing.capture_logs() as logs:
        readings = [reader.read(), reader.read()]
    for reading in readings:
        assert reading is not None
        assert [d.index for d in reading.devices] == [1]
        assert reading.processes == ()
    assert reader.failures == 2
    failed = [e for e in logs if e["event"] == "specon.agent.gpu_read_failed"]
    assert len(failed) == 1
    assert failed[0]["call"] == "nvmlDeviceGetMemoryInfo"
    assert failed[0]["device"] == 0


def test_a_failing_process_list_or_utilisation_keeps_the_device(reader_for: Reader) -> None:
    fake = two_gpus()
    fake.gpus[0].fail["nvmlDeviceGetComputeRunningProcesses"] = NVML_ERROR_UNKNOWN
    fake.gpus[0].fail["nvmlDeviceGetUtilizationRates"] = NVML_ERROR_UNKNOWN
    fake.gpus[1].fail["nvmlDeviceGetProcessUtilization"] = NVML_ERROR_UNKNOWN
    fake.gpus[1].processes = [FakeProcess(5, sm=50)]
    reader = reader_for(fake)
    reading = reader.read()
    assert reading is not None
    assert [(d.index, d.utilisation) for d in reading.devices] == [(0, None), (1, 0.0)]
    assert reading.processes == (NvmlProcess(5, 1, GIB, None),)
    assert reader.failures == 3


def test_mps_clients_are_listed_and_mps_unsupported_is_asked_once(reader_for: Reader) -> None:
    fake = FakeNvml([FakeGpu(processes=[FakeProcess(1, sm=90), FakeProcess(2, mps=True, memory=2 * GIB)])])
    reading = reader_for(fake).read()
    assert reading is not None
    assert {p.pid: p.memory for p in reading.processes} == {1: GIB, 2: 2 * GIB}

    fake = two_gpus()
    fake.gpus[0].fail["nvmlDeviceGetMPSComputeRunningProcesses"] = NVML_ERROR_NOT_SUPPORTED
    reader = reader_for(fake)
    reader.read()
    reader.read()
    asked = [c for c in fake.calls if c == ("nvmlDeviceGetMPSComputeRunningProcesses", 0)]
    assert len(asked) == 1
    assert reader.failures == 0


@pytest.mark.parametrize(
    "code", [NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_UNKNOWN]
)
def test_init_failure_makes_it_unavailable_said_once(reader_for: Reader, code: int) -> None:
    fake = FakeNvml([FakeGpu()], init_error=code)
    reader = reader_for(fake)
    with structlog.testing.capture_logs() as logs:
        assert reader.read() is None
        assert reader.read() is None
    assert not reader.available
    assert reader.state == "unavailable"
    assert reader.reason is not None and "NVML did not start" in reader.reason
    said = [e for e in logs if e["event"] == "specon.agent.gpu_unavailable"]
    assert len(said) == 1
    assert said[0]["log_level"] == ("warning" if code == NVML_ERROR_UNKNOWN else "info")
    assert [c for c, _ in fake.calls].count("nvmlInit") == 1  # never tried again


def test_without_the_package_it_is_unavailable() -> None:
    reader = NvmlReader()
    with FakeNvml.absent(), structlog.testing.capture_logs() as logs:
        assert reader.read() is None
    assert reader.reason is not None and "specon[gpu]" in reader.reason
    assert [e["event"] for e in logs] == ["specon.agent.gpu_unavailable"]


def test_an_unreadable_device_count_is_no_reading(reader_for: Reader) -> None:
    fake = two_gpus()
    fake.count_error = NVML_ERROR_UNKNOWN
    reader = reader_for(fake)
    assert reader.read() is None
    assert reader.available  # the next read tries again
    fake.count_error = None
    assert reader.read() is not None


def test_close_shuts_nvml_down_and_ends_reading(reader_for: Reader) -> None:
    fake = two_gpus()
    reader = reader_for(fake)
    assert reader.read() is not None
    reader.close()
    assert fake.shutdowns == 1
    assert reader.read() is None
    reader.close()
    assert fake.shutdowns == 1


def test_odd_values_never_reach_the_protocol() -> None:
    """Bytes names, unprintable characters, a percent out of range: cleaned or dropped."""
    fake = FakeNvml([FakeGpu(name="Tesla\x00 T4", utilisation=250, processes=[FakeProcess(3, sm=-1)])])
    fake.module.nvmlDeviceGetUUID = lambda handle: b"GPU-bytes"
    reading = NvmlReader(module=fake.module).read()
    assert reading is not None
    (device,) = reading.devices
    assert (device.uuid, device.name, device.utilisation) == ("GPU-bytes", "Tesla T4", None)
    assert reading.processes[0].utilisation is None


def test_the_real_nvml_where_there_is_a_gpu() -> None:
    """On a machine with an NVIDIA GPU and ``specon[gpu]``: the reader's view of the real
    devices. CI has neither, and says so."""
    reader = NvmlReader()
    try:
        reading = reader.read()
        if reading is None:
            pytest.skip(f"needs an NVIDIA GPU: NVML is unavailable here ({reader.reason})")
        if not reading.devices:
            pytest.skip("needs an NVIDIA GPU: NVML started but lists no device")
        assert [d.index for d in reading.devices] == sorted({d.index for d in reading.devices})
        for d in reading.devices:
            assert d.uuid.startswith(("GPU-", "MIG-")) and d.name
            assert 0 <= d.memory_used <= d.memory_total and d.memory_total > 0
        assert {p.device for p in reading.processes} <= {d.index for d in reading.devices}
        assert reader.read() is not None  # a second read, with the last seen timestamps
    finally:
        reader.close()
