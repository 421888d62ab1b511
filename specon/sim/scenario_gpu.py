"""The GPU keys of a scenario file (``specon.sim.scenario_file``): GPU workers and GPU jobs.

A worker: ``gpus`` (devices, default 0), ``gpu_memory`` (GiB per device, required with
gpus), ``gpu_product`` (e.g. ``NVIDIA H100 80GB HBM3``, compared as its node label value:
spaces as ``-``) and ``gpu_share`` (GPU jobs one device may hold, default 1: the device
plugin's time-slicing replicas). A job of an explicit list: ``gpu: 1``, ``gpu_step``
(seconds per step alone on one GPU, required), ``gpu_memory`` (GiB it holds on the GPU),
``gpu_product`` (the product it must run on) and ``checkpoint`` (GiB a save writes). A GPU
job that no worker could ever host (or not the one it names) is a problem of the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specon.model import gpu_product_label
from specon.sim.cluster import WorkerSpec, gpu_fits
from specon.sim.gpu import GIB
from specon.wire import codec

WORKER_GPU_KEYS = ("gpus", "gpu_memory", "gpu_product", "gpu_share")
GPU_JOB_KEYS = ("gpu", "gpu_step", "gpu_memory", "gpu_product", "checkpoint")

Where = tuple[codec.PathPart, ...]


@dataclass(frozen=True, slots=True)
class GpuNeeds:
    """A GPU job's needs as the file gives them (bytes; ``step``: seconds alone on a GPU)."""

    step: float
    memory: int = 0
    product: str | None = None
    checkpoint: int = 0


def _shown(value: object) -> str:
    """A number as written (``-3``), anything else described (``string 'many'``)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return codec.describe(value)


class GpuChecks:
    """The GPU checks of the scenario file's reader, which provides the generic ones."""

    worker_specs: tuple[WorkerSpec, ...] | None = None

    def add(self, path: Where, message: str) -> None:
        raise NotImplementedError

    def number(self, value: object, path: Where, *, low: float, strict: bool = False) -> float | None:
        raise NotImplementedError

    def name(self, value: object, path: Where) -> str | None:
        raise NotImplementedError

    def gpus_of(self, entry: Mapping[str, Any], path: Where) -> tuple[int, int, str | None, int] | None:
        """A worker's (gpus, gpu_memory in bytes, product label, gpu_share)."""
        gpus = self.count(entry.get("gpus", 0), (*path, "gpus"), low=0)
        share = self.count(entry.get("gpu_share", 1), (*path, "gpu_share"), low=1)
        product = self.product(entry, path)
        memory: int | None = 0
        if "gpu_memory" in entry:
            gib = self.number(entry["gpu_memory"], (*path, "gpu_memory"), low=0.0, strict=True)
            memory = None if gib is None else round(gib * GIB)
        elif gpus:
            self.add((*path, "gpu_memory"), "missing: the GiB of memory of each GPU, with gpus")
            memory = None
        if gpus == 0 and any(k in entry for k in ("gpu_memory", "gpu_product", "gpu_share")):
            self.add((*path, "gpus"), "a worker with gpu_memory, gpu_product or gpu_share needs gpus >= 1")
            return None
        if gpus is None or share is None or memory is None or product == "":
            return None
        return gpus, memory, product, share

    def count(self, value: object, path: Where, *, low: int) -> int | None:
        if type(value) is not int or value < low:
            self.add(path, f"must be an integer >= {low}, got {_shown(value)}")
            return None
        return value

    def product(self, entry: Mapping[str, Any], path: Where) -> str | None:
        """A GPU product as its label value (``gpu_product_label``); "" where it is bad."""
        if "gpu_product" not in entry:
            return None
        text = self.name(entry["gpu_product"], (*path, "gpu_product"))
        return "" if text is None else gpu_product_label(text)

    def gpu_job(self, entry: Mapping[str, Any], path: Where) -> tuple[bool, GpuNeeds | None]:
        """Whether a job's GPU keys are usable, and its GPU needs (None: a CPU job)."""
        given = [k for k in GPU_JOB_KEYS if k in entry]
        if not given:
            return True, None
        if "gpu" not in entry:
            self.add((*path, given[0]), "only a GPU job (gpu: 1) has it")
            return False, None
        if entry["gpu"] != 1 or type(entry["gpu"]) is not int:
            got = _shown(entry["gpu"])
            self.add((*path, "gpu"), f"must be 1 (the simulator models one-GPU jobs), got {got}")
            return False, None
        step = None
        if "gpu_step" in entry:
            step = self.number(entry["gpu_step"], (*path, "gpu_step"), low=0.0, strict=True)
        else:
            self.add((*path, "gpu_step"), "missing: seconds per step alone on one GPU")
        sizes = []
        for key in ("gpu_memory", "checkpoint"):
            gib = self.number(entry.get(key, 0.0), (*path, key), low=0.0)
            sizes.append(None if gib is None else round(gib * GIB))
        product = self.product(entry, path)
        memory, checkpoint = sizes
        if step is None or memory is None or checkpoint is None or product == "":
            return False, None
        return True, GpuNeeds(step, memory, product, checkpoint)

    def gpu_host(self, worker: str | None, g: GpuNeeds, path: Where) -> bool:
        """Whether some worker (``worker``, where the job names one) could ever host a GPU job
        needing ``g``."""
        workers = self.worker_specs
        if workers is None:
            return True
        hosts = [w for w in workers if worker in (None, w.id)]
        if any(gpu_fits(w, memory=g.memory, product=g.product) for w in hosts):
            return True
        need = "GPU" + (f" with {g.memory / GIB:g} GiB" if g.memory else "")
        need += "" if g.product is None else f" of product {g.product}"
        where = (*path, "worker") if worker is not None else path
        self.add(where, f"no worker has a {need}" if worker is None else f"worker {worker} has no {need}")
        return False
