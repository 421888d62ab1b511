"""Record loss-curve traces from the project's own workloads (``specon trace record``).

One recording trains one model in-process (``specon.workloads.registry.build``) on one
torch thread, keeps the raw mini-batch loss of every ``stride``-th step (not an average
over the stride: the simulator's classifier must see the real step-to-step noise) and
measures the CPU time of the whole run (``time.process_time``) to get the per-step cost
on one full core. The result is a :class:`specon.sim.trace.Trace`, written with
``write_trace_file``; this module defines no format of its own.

Imports torch (through ``specon.workloads``): import it only where torch is installed.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from pathlib import Path

import torch

from specon.sim.curves import DEFAULT_STRIDE
from specon.sim.trace import Trace, write_trace_file
from specon.workloads.registry import WORKLOADS, build

# Losses are stored with this many significant digits: far below the mini-batch noise,
# and it keeps the committed traces small.
SIGNIFICANT_DIGITS = 6

# (step, steps, loss) after each recorded step.
ProgressFn = Callable[[int, int, float], None]


def trace_filename(model: str, seed: int) -> str:
    """The file one (model, seed) recording is stored in."""
    return f"{model}-seed{seed}.json"


def machine_facts() -> str:
    """What the step cost was measured on: CPU model, cores, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass  # not Linux: keep platform's answer
    return (
        f"cpu={cpu}; cores={os.cpu_count()}; {platform.system()} {platform.release()}; "
        f"python {platform.python_version()}; torch {torch.__version__}; torch threads 1"
    )


def _round(x: float) -> float:
    return float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def record_trace(
    model: str,
    *,
    seed: int,
    steps: int | None = None,
    stride: int = DEFAULT_STRIDE,
    machine: str = "",
    on_progress: ProgressFn | None = None,
) -> Trace:
    """Train ``model`` for ``steps`` (default: the model's) and return its trace.

    ``ValueError`` for an unknown model, ``stride < 1`` or fewer steps than one stride.
    Sets torch to one thread (the step cost means "on one full core").
    """
    if model not in WORKLOADS:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(WORKLOADS)}")
    spec = WORKLOADS[model]
    steps = spec.steps if steps is None else steps
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if steps < stride:
        raise ValueError(f"steps ({steps}) must be at least one stride ({stride})")
    torch.set_num_threads(1)
    workload = build(model, seed=seed)
    workload.train_step()  # builds the data set and warms torch up; not part of the run
    workload = build(model, seed=seed)  # the same fresh start, so the seed alone fixes the curve
    losses: list[float] = []
    start = time.process_time()
    for step in range(1, steps + 1):
        loss = workload.train_step()
        if step % stride == 0:
            losses.append(_round(loss))
            if on_progress is not None:
                on_progress(step, steps, loss)
    cpu = time.process_time() - start
    source = (
        f"specon trace record: {model} seed {seed}, {steps} steps, batch {spec.batch_size}, "
        f"lr {spec.lr:g}, raw mini-batch loss every {stride} steps; {machine or machine_facts()}"
    )
    return Trace(
        model=model,
        steps=steps,
        step_cost=cpu / steps,
        losses=tuple(losses),
        source=source,
        stride=stride,
    )


def record_to(directory: Path, trace: Trace, *, seed: int) -> Path:
    """Write ``trace`` as ``directory/<model>-seed<seed>.json``; returns the path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / trace_filename(trace.model, seed)
    write_trace_file(path, trace)
    return path
