"""What a Docker job's GPUs mean to placement: its spec's GPU count, memory and product.

The manager places a job by its spec (``JobSpec.requests.gpu``, ``gpu_memory``, ``selector``),
so a Docker host derives these from what actually runs, the recipe, and the job's labels:

- **count**: the GPUs of the recipe's device requests (``Recipe.gpus``);
- **memory**: the job label ``specon.io/gpu-memory``, the GPU memory it needs on each of its
  GPUs, in bytes or with a Kubernetes quantity suffix (``16Gi``, ``40G``, ``81920Mi``);
- **product**: the job label ``nvidia.com/gpu.product`` (as GPU feature discovery writes it,
  e.g. ``NVIDIA-H100-80GB-HBM3``) becomes a selector pair. Without it a GPU job keeps to the
  product it first ran on: the pair of that host's product is added where it starts (or is
  adopted), so it is in every report before the manager ever chooses a target, and travels
  with the spec from there. ``specon.io/gpu-any-product: "true"`` lets it run on any product.

Pure: no Docker import.
"""

from __future__ import annotations

import re
from dataclasses import replace

from specon.model import GPU_ANY_PRODUCT_LABEL, GPU_MEMORY_NEED_LABEL, GPU_PRODUCT_LABEL, gpu_product_label
from specon.runtime.base import JobSpec
from specon.runtime.docker.recipe import Recipe

__all__ = ["gpu_memory", "with_gpu_needs"]

_UNITS = {
    "": 1,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|[kKMGT]?)$")
# Nothing has this much memory per GPU (1 PiB): a typo, not a need.
_MAX_BYTES = 2**50


def gpu_memory(raw: str) -> int:
    """Bytes from a ``specon.io/gpu-memory`` value: ``17179869184``, ``16Gi``, ``40G``;
    ``ValueError`` naming the label and what is accepted."""
    m = _QUANTITY.match(raw.strip())
    if m is None:
        raise ValueError(
            f"label {GPU_MEMORY_NEED_LABEL}: {raw!r} is not a byte count"
            " (an integer, optionally with k, M, G, T, Ki, Mi, Gi or Ti, e.g. 16Gi)"
        )
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    if value > _MAX_BYTES:
        raise ValueError(f"label {GPU_MEMORY_NEED_LABEL}: {raw!r} is over 1 PiB per GPU")
    return value


def with_gpu_needs(spec: JobSpec, recipe: Recipe, *, product: str | None) -> JobSpec:
    """``spec`` with the GPU needs of what runs: ``requests.gpu`` from the recipe,
    ``gpu_memory`` from the job's label, and its product as a selector pair (the job's label,
    else ``product``, this host's, unless the job allows any product or already has one).

    The job's labels are the recipe's (the container's) and the spec's, the spec's winning.
    ``ValueError`` for a bad ``specon.io/gpu-memory``. A job without GPUs is returned with
    ``requests.gpu`` 0 and nothing else changed.
    """
    gpus = recipe.gpus
    requests = replace(spec.requests, gpu=gpus)
    if not gpus:
        return spec if spec.requests == requests else replace(spec, requests=requests)
    labels = {**dict(recipe.labels), **dict(spec.labels)}
    raw_memory = labels.get(GPU_MEMORY_NEED_LABEL)
    memory = spec.gpu_memory if raw_memory is None else gpu_memory(raw_memory)
    selector = spec.selector
    had = dict(selector).get(GPU_PRODUCT_LABEL)
    if labels.get(GPU_ANY_PRODUCT_LABEL, "").strip().lower() != "true":
        wanted = labels.get(GPU_PRODUCT_LABEL) or had or product
        if wanted and gpu_product_label(wanted) != had:
            pair = (GPU_PRODUCT_LABEL, gpu_product_label(wanted))
            selector = (*((k, v) for k, v in selector if k != GPU_PRODUCT_LABEL), pair)
    return replace(spec, requests=requests, gpu_memory=memory, selector=selector)
