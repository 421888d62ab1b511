"""A fake NVML: the ``pynvml`` functions the agent calls, replaced in-process by scripted GPUs.

CI has no GPU. ``FakeNvml`` plays a machine's GPUs and their processes, with failures on
demand: ``init_error`` (nvmlInit fails, e.g. ``LIBRARY_NOT_FOUND``), a call that raises for one
device (``FakeGpu.fail``), a process without a memory figure, no process-utilisation sample
(NVML's ``NOT_FOUND``). Three ways in:

- ``NvmlReader(module=fake.module)``: the reader uses the fake directly;
- ``with fake.patch():`` (or ``fake.install(monkeypatch)``): ``import pynvml`` gets the fake for
  the duration. Where the real ``nvidia-ml-py`` is installed its functions are replaced on the
  real module (so its own ``NVMLError`` classes are raised); elsewhere a stand-in module with
  the same names is put in ``sys.modules``;
- ``FakeNvml.absent()``: ``import pynvml`` fails, as without the extra.

Each device yields a fresh utilisation sample per ``nvmlDeviceGetProcessUtilization`` call
(stamped one second after the previous, on NVML's µs clock) for each process with ``sm``;
asked for samples after the newest, or with no process sampled, it raises ``NOT_FOUND``.
"""

# The fake's methods carry pynvml's own (camelCase) function names, which they stand in for.
# ruff: noqa: N802
from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

# NVML's return codes (nvml.h).
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
GIB = 2**30

# The functions replaced (the ones ``specon.runtime.gpu.nvml`` calls).
FUNCTIONS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetProcessUtilization",
)


class _MonkeyPatch(Protocol):  # what ``install`` needs of pytest's fixture
    def setitem(self, dic: Any, name: Any, value: Any) -> None: ...
    def setattr(self, target: Any, name: str, value: Any, raising: bool = ...) -> None: ...


class NVMLError(Exception):
    """The stand-in module's error (the real ``pynvml.NVMLError`` where that is installed)."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


@dataclass
class FakeProcess:
    """A process with a context on a fake GPU. ``memory``: bytes (None, or
    ``NVML_VALUE_NOT_AVAILABLE`` as a raw binding returns it: not available); ``sm``: its SM
    percent in each new sample (None: never sampled, like an MPS client); ``mps``: listed as
    an MPS client rather than a compute process."""

    pid: int
    memory: int | None = GIB
    sm: int | None = None
    mps: bool = False


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    memory_total: int = 80 * GIB
    utilisation: int = 0  # the device's SM percent
    uuid: str = ""  # default: GPU-fake-<index>
    processes: list[FakeProcess] = field(default_factory=list)
    # A function name -> the NVML error code it raises for this device.
    fail: dict[str, int] = field(default_factory=dict)
    # The device's memory in use (default: what its processes hold).
    memory_used: int | None = None


@dataclass(frozen=True)
class _Handle:
    index: int


class FakeNvml:
    """Scripted GPUs behind the ``pynvml`` API; see the module's docstring."""

    def __init__(self, gpus: Sequence[FakeGpu] = (), *, init_error: int | None = None) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.count_error: int | None = None  # nvmlDeviceGetCount raises this code
        self.initialised = False
        self.shutdowns = 0
        self.calls: list[tuple[str, int | None]] = []  # (function, device index)
        self.since: list[tuple[int, int]] = []  # (device, timestamp) each utilisation call asked for
        self._stamp: dict[int, int] = {}  # device -> its newest sample's timestamp (µs)
        self.error_class: type[Exception] = NVMLError
        self.module = self._stand_in()

    # -- ways in -------------------------------------------------------------------------
    @contextlib.contextmanager
    def patch(self) -> Iterator[FakeNvml]:
        """``import pynvml`` answers with this fake until the block ends."""
        real = _real_pynvml()
        if real is None:
            saved = sys.modules.get("pynvml")
            sys.modules["pynvml"] = self.module
            try:
                yield self
            finally:
                if saved is None:
                    sys.modules.pop("pynvml", None)
                else:
                    sys.modules["pynvml"] = saved
            return
        old = {name: getattr(real, name, None) for name in FUNCTIONS}
        self.error_class = real.NVMLError
        for name in FUNCTIONS:
            setattr(real, name, getattr(self.module, name))
        try:
            yield self
        finally:
            for name, fn in old.items():
                if fn is None:
                    delattr(real, name)
                else:
                    setattr(real, name, fn)
            self.error_class = NVMLError

    def install(self, monkeypatch: _MonkeyPatch) -> FakeNvml:
        """As ``patch``, undone by pytest's ``monkeypatch`` at the test's end."""
        real = _real_pynvml()
        if real is None:
            monkeypatch.setitem(sys.modules, "pynvml", self.module)
        else:
            self.error_class = real.NVMLError
            for name in FUNCTIONS:
                monkeypatch.setattr(real, name, getattr(self.module, name), raising=False)
        return self

    @staticmethod
    @contextlib.contextmanager
    def absent() -> Iterator[None]:
        """``import pynvml`` raises ImportError until the block ends (no ``specon[gpu]``)."""
        saved = sys.modules.get("pynvml")
        sys.modules["pynvml"] = None  # type: ignore[assignment]  # the documented way to block an import
        try:
            yield
        finally:
            if saved is None:
                sys.modules.pop("pynvml", None)
            else:
                sys.modules["pynvml"] = saved

    # -- the API -------------------------------------------------------------------------
    def _raise(self, code: int) -> NoReturn:
        raise self.error_class(code)

    def _gpu(self, call: str, handle: object) -> tuple[int, FakeGpu]:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
            self._raise(NVML_ERROR_UNINITIALIZED if not self.initialised else 2)  # 2: INVALID_ARGUMENT
        self.calls.append((call, handle.index))
        if not self.initialised:
            self._raise(NVML_ERROR_UNINITIALIZED)
        gpu = self.gpus[handle.index]
        if call in gpu.fail:
            self._raise(gpu.fail[call])
        return handle.index, gpu

    def _stand_in(self) -> types.ModuleType:
        m = types.ModuleType("pynvml", "specon.testing.fake_nvml's stand-in for nvidia-ml-py")
        m.NVMLError = NVMLError  # type: ignore[attr-defined]
        m.NVML_ERROR_NOT_FOUND = NVML_ERROR_NOT_FOUND  # type: ignore[attr-defined]
        for name in FUNCTIONS:
            setattr(m, name, getattr(self, f"_{name}"))
        return m

    def _nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", None))
        if self.init_error is not None:
            self._raise(self.init_error)
        self.initialised = True

    def _nvmlShutdown(self) -> None:
        self.calls.append(("nvmlShutdown", None))
        self.initialised = False
        self.shutdowns += 1

    def _nvmlDeviceGetCount(self) -> int:
        self.calls.append(("nvmlDeviceGetCount", None))
        if not self.initialised:
            self._raise(NVML_ERROR_UNINITIALIZED)
        if self.count_error is not None:
            self._raise(self.count_error)
        return len(self.gpus)

    def _nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._gpu("nvmlDeviceGetHandleByIndex", _Handle(index))
        return _Handle(index)

    def _nvmlDeviceGetUUID(self, handle: object) -> str:
        index, gpu = self._gpu("nvmlDeviceGetUUID", handle)
        return gpu.uuid or f"GPU-fake-{index}"

    def _nvmlDeviceGetName(self, handle: object) -> str:
        return self._gpu("nvmlDeviceGetName", handle)[1].name

    def _nvmlDeviceGetMemoryInfo(self, handle: object) -> types.SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)[1]
        used = gpu.memory_used
        if used is None:
            used = sum(p.memory for p in gpu.processes if p.memory not in (None, NVML_VALUE_NOT_AVAILABLE))
        return types.SimpleNamespace(total=gpu.memory_total, used=used, free=max(0, gpu.memory_total - used))

    def _nvmlDeviceGetUtilizationRates(self, handle: object) -> types.SimpleNamespace:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)[1]
        return types.SimpleNamespace(gpu=gpu.utilisation, memory=0)

    def _processes(self, call: str, handle: object, *, mps: bool) -> list[types.SimpleNamespace]:
        gpu = self._gpu(call, handle)[1]
        return [
            # pynvml gives None for NVML_VALUE_NOT_AVAILABLE; a raw figure passes as given.
            types.SimpleNamespace(pid=p.pid, usedGpuMemory=p.memory, gpuInstanceId=0, computeInstanceId=0)
            for p in gpu.processes
            if p.mps == mps
        ]

    def _nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[types.SimpleNamespace]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle, mps=False)

    def _nvmlDeviceGetMPSComputeRunningProcesses(self, handle: object) -> list[types.SimpleNamespace]:
        return self._processes("nvmlDeviceGetMPSComputeRunningProcesses", handle, mps=True)

    def _nvmlDeviceGetProcessUtilization(self, handle: object, since: int) -> list[types.SimpleNamespace]:
        index, gpu = self._gpu("nvmlDeviceGetProcessUtilization", handle)
        self.since.append((index, since))
        sampled = [p for p in gpu.processes if p.sm is not None]
        if not sampled:
            self._raise(NVML_ERROR_NOT_FOUND)
        stamp = self._stamp[index] = self._stamp.get(index, 1_000_000_000) + 1_000_000
        if stamp <= since:
            self._raise(NVML_ERROR_NOT_FOUND)
        return [
            types.SimpleNamespace(pid=p.pid, timeStamp=stamp, smUtil=p.sm, memUtil=0, encUtil=0, decUtil=0)
            for p in sampled
        ]


def _real_pynvml() -> Any:
    """The installed ``nvidia-ml-py``'s module, or None."""
    if "pynvml" in sys.modules and not hasattr(sys.modules["pynvml"], "nvmlDeviceGetIndex"):
        return None  # blocked (None) or a stand-in already in place
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None
