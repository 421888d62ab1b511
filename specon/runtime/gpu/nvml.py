"""The worker's GPUs as NVML reports them, through ``pynvml`` (the ``specon[gpu]`` extra).

``NvmlReader.read`` blocks (every NVML call is a driver call): the agent runs it in a thread.
``pynvml`` is imported on the first read, not before, so a worker without the extra or
without a GPU pays nothing: the package missing, no driver, or ``nvmlInit`` failing makes the
reader *unavailable* for good, said once (``specon.agent.gpu_unavailable``), and every read
after that returns None at once.

Every other NVML call may raise too (a GPU that fell off the bus, a call the driver does not
support): a failure costs only what it concerns, never the rest of the reading. A device whose
handle, name, UUID or memory cannot be read is left out; one whose utilisation or process
list cannot be read is kept without them. Each failure is counted (``failures``) and logged
once per call, device and error code (``specon.agent.gpu_read_failed``).

Per process: its host PID and GPU memory from ``nvmlDeviceGetComputeRunningProcesses`` (and,
where the driver has it, ``nvmlDeviceGetMPSComputeRunningProcesses``: MPS clients), and its
SM utilisation from ``nvmlDeviceGetProcessUtilization`` since the previous read of that
device (NVML keeps a short buffer of samples; ``NOT_FOUND`` means no process ran a kernel
since then). Under MPS only the MPS server's PID is sampled, so its clients have none.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from specon.wire.gpu import GpuDevice
from specon.wire.limits import MAX_BYTES, MAX_GPU_DEVICES, MAX_SHORT_TEXT

log = structlog.get_logger()

# NVML's return codes that the reader treats apart (nvml.h; pynvml names them alike).
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
# NVML's "value not available" for a 64-bit counter (``usedGpuMemory`` under WDDM, some vGPUs);
# pynvml turns it into None, a raw binding may not.
NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
# The failures logged (call, device, code); beyond this many, only counted.
MAX_LOGGED = 256

State = Literal["unopened", "open", "unavailable", "closed"]


@dataclass(frozen=True, slots=True)
class NvmlProcess:
    """One process holding a context on one GPU, by its host PID."""

    pid: int
    device: int  # GpuDevice.index
    memory: int | None  # bytes it holds on that device; None: NVML could not say
    utilisation: float | None = None  # its SM percent since the previous read; None: no sample


@dataclass(frozen=True, slots=True)
class NvmlReading:
    devices: tuple[GpuDevice, ...] = ()
    processes: tuple[NvmlProcess, ...] = ()


class NvmlReader:
    """Reads the GPUs through NVML; see the module's docstring.

    ``module``: the ``pynvml`` module to use (tests pass a fake, ``specon.testing.fake_nvml``);
    None: ``import pynvml`` at the first read. Reads are serialised: one NVML session, one
    caller at a time.
    """

    def __init__(self, *, module: Any = None) -> None:
        self._module = module
        self._nvml: Any = None
        self.state: State = "unopened"
        self.reason: str | None = None  # why it is unavailable
        self.reads = 0
        self.failures = 0  # NVML calls that raised, counted once each
        self._logged: set[tuple[str, int, object]] = set()
        # Per device: the newest process-utilisation timestamp seen (NVML's µs clock), so a
        # read gets only the samples taken since the previous one.
        self._seen: dict[int, int] = {}
        # Devices whose driver cannot list MPS clients: not asked again.
        self._no_mps: set[int] = set()
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        """True once NVML answered; False before the first read and after it gave up or closed."""
        return self.state == "open"

    def read(self) -> NvmlReading | None:
        """The devices and their processes now; None when NVML is unavailable or the device
        count itself cannot be read (then nothing would be trustworthy). Blocks."""
        with self._lock:
            if self.state == "unopened":
                self._open()
            if self.state != "open":
                return None
            nvml = self._nvml
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except Exception as exc:  # NVMLError or anything a broken binding raises
                self._failed("nvmlDeviceGetCount", -1, exc)
                return None
            devices: list[GpuDevice] = []
            processes: list[NvmlProcess] = []
            for index in range(max(0, min(count, MAX_GPU_DEVICES))):
                got = self._device(nvml, index)
                if got is not None:
                    devices.append(got[0])
                    processes.extend(got[1])
            self.reads += 1
            return NvmlReading(tuple(devices), tuple(processes))

    def close(self) -> None:
        """End the NVML session (``nvmlShutdown``); reads after this return None."""
        with self._lock:
            if self.state == "open":
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:  # shutting down: nothing left to protect
                    log.debug("specon.agent.gpu_shutdown_failed", error=_text(exc))
            self.state = "closed"

    # -- internals ---------------------------------------------------------------------
    def _open(self) -> None:
        try:
            nvml = self._module if self._module is not None else importlib.import_module("pynvml")
        except ImportError:
            self._unavailable("nvidia-ml-py is not installed (pip install 'specon[gpu]')", quiet=True)
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError (no library, no driver) or OSError from ctypes
            code = getattr(exc, "value", None)
            # No NVML library or no driver: a worker without a GPU, the common case.
            quiet = code in _NO_GPU_CODES
            self._unavailable(f"NVML did not start: {_text(exc)}", quiet=quiet)
            return
        self._nvml = nvml
        self.state = "open"
        log.info("specon.agent.gpu_available")

    def _unavailable(self, reason: str, *, quiet: bool) -> None:
        self.state, self.reason = "unavailable", reason
        (log.info if quiet else log.warning)("specon.agent.gpu_unavailable", reason=reason)

    def _failed(self, call: str, index: int, exc: BaseException) -> None:
        self.failures += 1
        key = (call, index, getattr(exc, "value", type(exc).__name__))
        if key not in self._logged and len(self._logged) < MAX_LOGGED:
            self._logged.add(key)
            log.warning("specon.agent.gpu_read_failed", call=call, device=index, error=_text(exc))

    def _device(self, nvml: Any, index: int) -> tuple[GpuDevice, list[NvmlProcess]] | None:
        """Device ``index`` and its processes; None when its identity or memory cannot be read."""
        call = "nvmlDeviceGetHandleByIndex"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            call = "nvmlDeviceGetUUID"
            uuid = _str(nvml.nvmlDeviceGetUUID(handle))
            call = "nvmlDeviceGetName"
            name = _str(nvml.nvmlDeviceGetName(handle))
            call = "nvmlDeviceGetMemoryInfo"
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total, used = _bytes(memory.total), _bytes(memory.used)
        except Exception as exc:
            self._failed(call, index, exc)
            return None
        utilisation: float | None = None
        try:
            utilisation = _percent(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception as exc:
            self._failed("nvmlDeviceGetUtilizationRates", index, exc)
        device = GpuDevice(index, uuid, name, total or 0, min(used or 0, total or 0), utilisation)
        held = self._memory_by_pid(nvml, handle, index)
        sm = self._utilisation_by_pid(nvml, handle, index)
        processes = [NvmlProcess(pid, index, mem, sm.get(pid)) for pid, mem in sorted(held.items())]
        return device, processes

    def _memory_by_pid(self, nvml: Any, handle: Any, index: int) -> dict[int, int | None]:
        """Host PID -> bytes held on the device, compute processes and MPS clients."""
        held: dict[int, int | None] = {}
        try:
            listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except Exception as exc:
            self._failed("nvmlDeviceGetComputeRunningProcesses", index, exc)
            listed = []
        if index not in self._no_mps:
            try:
                listed += list(nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
            except AttributeError:  # an older binding without the call
                self._no_mps.add(index)
            except Exception as exc:
                if getattr(exc, "value", None) in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND):
                    self._no_mps.add(index)
                else:
                    self._failed("nvmlDeviceGetMPSComputeRunningProcesses", index, exc)
        for proc in listed:
            pid = getattr(proc, "pid", None)
            if not isinstance(pid, int) or pid <= 0:
                continue
            mem = _bytes(getattr(proc, "usedGpuMemory", None))
            old = held.get(pid)
            # Listed twice (compute and MPS): the larger figure is the one that holds memory.
            held[pid] = mem if old is None else max(old, mem or 0)
        return held

    def _utilisation_by_pid(self, nvml: Any, handle: Any, index: int) -> dict[int, float]:
        """Host PID -> its newest SM percent since the previous read (none: no sample)."""
        try:
            samples = list(nvml.nvmlDeviceGetProcessUtilization(handle, self._seen.get(index, 0)))
        except Exception as exc:
            if getattr(exc, "value", None) != NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no new sample
                self._failed("nvmlDeviceGetProcessUtilization", index, exc)
            return {}
        newest: dict[int, tuple[int, float]] = {}
        for s in samples:
            pid, stamp = getattr(s, "pid", None), getattr(s, "timeStamp", 0)
            sm = _percent(getattr(s, "smUtil", None))
            if not isinstance(pid, int) or not isinstance(stamp, int) or sm is None:
                continue
            if pid not in newest or stamp >= newest[pid][0]:
                newest[pid] = (stamp, sm)
            self._seen[index] = max(self._seen.get(index, 0), stamp)
        return {pid: sm for pid, (_, sm) in newest.items()}


# nvmlInit's codes on a machine without a usable GPU: DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND.
_NO_GPU_CODES = (9, 12)


def _text(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # pynvml's __str__ calls into the library, which may be what failed
        text = ""
    return f"{type(exc).__name__}: {text}"[:MAX_SHORT_TEXT] if text else type(exc).__name__


def _str(value: object) -> str:
    """A name or UUID as printable text the protocol carries (old bindings return bytes)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return "".join(ch for ch in text if ch.isprintable())[:MAX_SHORT_TEXT]


def _bytes(value: object) -> int | None:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < 0
        or value == NVML_VALUE_NOT_AVAILABLE
    ):
        return None
    return min(value, MAX_BYTES)


def _percent(value: object) -> float | None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 100:
        return None  # NVML reports whole percents; anything else is not a reading
    return float(value)
