"""A file-driven stand-in for ``nvidia-ml-py`` (``import pynvml``), for daemons run as processes.

``specon.testing.fake_nvml`` replaces the ``pynvml`` functions inside the test's own process;
an agent started as a process of its own (the embedded cluster's) cannot be patched that way.
This module is put first on that process's ``PYTHONPATH`` instead (its folder, not a package),
so the agent's ``import pynvml`` finds it, and it plays the GPUs described by the JSON file
that ``$SPECON_FAKE_NVML`` names, re-read at each ``nvmlDeviceGetCount`` (the first call of
every read), so a test changes the GPUs by rewriting the file (atomically: write and rename)::

    {"devices": [{"name": "NVIDIA H100 80GB HBM3", "memory_total": 85899345920}],
     "jobs": {"job-a": {"memory": 1073741824, "device": 0, "sm": 90}},
     "pids": {"4242": {"memory": 1073741824, "device": 0}}}

- ``devices``: per device its ``name``, ``memory_total`` (bytes), and optionally ``uuid``
  (default ``GPU-fake-<index>``), ``utilisation`` (the device's SM %) and ``memory_used``
  (default: what its processes hold).
- ``jobs``: job id -> the GPU memory (bytes) its process holds on ``device`` (default 0), and
  optionally ``sm``, its SM % in each sample. The job's processes are found by their
  environment (``SPECON_JOB_ID``, which every backend sets: the job contract), so a job
  restored under a new PID is found again; only processes whose environment names the same
  ``$SPECON_FAKE_NVML`` file (the agent's, which its jobs inherit) count, so two tests on one
  machine whose jobs share an id each see their own. Of a job's process tree, one process holds the
  context, as a training process would: the shallowest below the job's top process (the
  local runtime's launcher), else the top process itself.
- ``pids``: host PID -> the same, for processes listed by PID.

A process that is not running (stopped by a signal, or its cgroup frozen) gets no SM sample,
as on a real GPU, but keeps its memory. Without ``$SPECON_FAKE_NVML`` ``nvmlInit`` fails with
``LIBRARY_NOT_FOUND``, as on a machine without a driver (the agent then runs without GPUs); a
file that cannot be read or parsed fails the read with ``UNKNOWN`` (the agent keeps its last
sample and counts the failure).
"""

from __future__ import annotations

import json
import os
import time
import types
from pathlib import Path
from typing import Any

ENV_FILE = "SPECON_FAKE_NVML"
ENV_JOB_ID = "SPECON_JOB_ID"  # specon.runtime.base.ENV_JOB_ID (this module imports no specon)
PROC = Path("/proc")
CGROUP = Path("/sys/fs/cgroup")

# NVML's return codes (nvml.h), as pynvml names them.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999


class NVMLError(Exception):
    """pynvml's error: ``value`` is NVML's return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value} (fake pynvml)"


class _Fake:
    """The session: the last state read from the file and the sampling clock."""

    def __init__(self) -> None:
        self.initialised = False
        self.state: dict[str, Any] = {"devices": [], "jobs": {}, "pids": {}}
        self.stamp = 1_000_000_000  # NVML's µs clock of the newest process sample

    def load(self) -> None:
        name = os.environ.get(ENV_FILE)
        if not name:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        try:
            raw = json.loads(Path(name).read_text())
            devices = [dict(d) for d in raw.get("devices", [])]
            # Checked here, so a bad file fails the read at its start, not midway.
            devices = [{**d, "memory_total": int(d["memory_total"]), "name": str(d["name"])} for d in devices]
            jobs = {str(k): dict(v) for k, v in raw.get("jobs", {}).items()}
            pids = {int(k): dict(v) for k, v in raw.get("pids", {}).items()}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise NVMLError(NVML_ERROR_UNKNOWN) from exc
        self.state = {"devices": devices, "jobs": jobs, "pids": pids}

    def device(self, handle: object) -> tuple[int, dict[str, Any]]:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        devices = self.state["devices"]
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.index, devices[handle.index]

    def processes(self, index: int) -> list[tuple[int, int, int | None]]:
        """(pid, bytes, SM % or None) of each process holding a context on device ``index``."""
        out: dict[int, tuple[int, int | None]] = {}
        jobs = {j: v for j, v in self.state["jobs"].items() if int(v.get("device", 0)) == index}
        for job, pid in _holders(set(jobs)).items():
            out[pid] = (int(jobs[job]["memory"]), jobs[job].get("sm"))
        for pid, v in self.state["pids"].items():
            if int(v.get("device", 0)) == index and (PROC / str(pid)).exists():
                out[pid] = (int(v["memory"]), v.get("sm"))
        return [(pid, mem, sm) for pid, (mem, sm) in sorted(out.items())]


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


_fake = _Fake()


def _environ_job(pid: int) -> str | None:
    """The job id in ``pid``'s environment, if it also names this GPU's file (this cluster's)."""
    try:
        data = (PROC / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or a kernel thread
        return None
    entries = data.split(b"\0")
    mine = f"{ENV_FILE}={os.environ.get(ENV_FILE, '')}".encode()
    if mine not in entries:
        return None
    for entry in entries:
        if entry.startswith(ENV_JOB_ID.encode() + b"="):
            return entry.split(b"=", 1)[1].decode(errors="replace")
    return None


def _ppid(pid: int) -> int:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])  # after the command's name, which may hold spaces


def _holders(jobs: set[str]) -> dict[str, int]:
    """Job id -> the PID of its process that holds the GPU context (the module's docstring)."""
    if not jobs:
        return {}
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (job := _environ_job(int(entry.name))) in jobs:
            found[int(entry.name)] = job
    best: dict[str, tuple[int, int]] = {}  # job -> (depth rank, pid)
    for pid, job in found.items():
        depth, up = 0, _ppid(pid)
        while found.get(up) == job and depth < 64:
            depth, up = depth + 1, _ppid(up)
        rank = (0 if depth == 1 else 1 if depth == 0 else depth, pid)
        if job not in best or rank < best[job]:
            best[job] = rank
    return {job: pid for job, (_, pid) in best.items()}


def _runs(pid: int) -> bool:
    """False for a stopped process or one in a frozen cgroup (v1 freezer or v2)."""
    try:
        state = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        groups = (PROC / str(pid) / "cgroup").read_text().splitlines()
    except (OSError, IndexError):
        return False
    if state in ("T", "t"):
        return False
    for line in groups:
        _, controllers, path = line.split(":", 2)
        try:
            if controllers == "freezer":
                if (CGROUP / "freezer" / path.lstrip("/") / "freezer.state").read_text().strip() != "THAWED":
                    return False
            elif (
                controllers == "" and (CGROUP / path.lstrip("/") / "cgroup.freeze").read_text().strip() == "1"
            ):
                return False
        except OSError:
            continue  # no such file there: that hierarchy does not freeze it
    return True


# -- the API (the calls specon.runtime.gpu.nvml makes) -----------------------------------------
def nvmlInit() -> None:
    _fake.load()
    _fake.initialised = True


def nvmlShutdown() -> None:
    _fake.initialised = False


def nvmlDeviceGetCount() -> int:
    if not _fake.initialised:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    _fake.load()
    return len(_fake.state["devices"])


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    handle = _Handle(index)
    _fake.device(handle)
    return handle


def nvmlDeviceGetUUID(handle: object) -> str:
    index, d = _fake.device(handle)
    return str(d.get("uuid") or f"GPU-fake-{index}")


def nvmlDeviceGetName(handle: object) -> str:
    return str(_fake.device(handle)[1]["name"])


def nvmlDeviceGetMemoryInfo(handle: object) -> types.SimpleNamespace:
    index, d = _fake.device(handle)
    total = int(d["memory_total"])
    used = d.get("memory_used")
    used = sum(mem for _, mem, _ in _fake.processes(index)) if used is None else int(used)
    return types.SimpleNamespace(total=total, used=used, free=max(0, total - used))


def nvmlDeviceGetUtilizationRates(handle: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(gpu=int(_fake.device(handle)[1].get("utilisation", 0)), memory=0)


def nvmlDeviceGetComputeRunningProcesses(handle: object) -> list[types.SimpleNamespace]:
    index, _ = _fake.device(handle)
    return [
        types.SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0, computeInstanceId=0)
        for pid, mem, _ in _fake.processes(index)
    ]


def nvmlDeviceGetMPSComputeRunningProcesses(handle: object) -> list[types.SimpleNamespace]:
    _fake.device(handle)
    return []  # no MPS server here


def nvmlDeviceGetProcessUtilization(handle: object, since: int) -> list[types.SimpleNamespace]:
    """A sample for each running process with an ``sm`` figure, stamped now; NOT_FOUND when
    none (no kernel ran since ``since``), as NVML says it."""
    index, _ = _fake.device(handle)
    _fake.stamp = max(_fake.stamp + 1, time.time_ns() // 1000)
    sampled = [(pid, sm) for pid, _, sm in _fake.processes(index) if sm is not None and _runs(pid)]
    if not sampled or _fake.stamp <= since:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return [
        types.SimpleNamespace(pid=pid, timeStamp=_fake.stamp, smUtil=int(sm), memUtil=0, encUtil=0, decUtil=0)
        for pid, sm in sampled
    ]
