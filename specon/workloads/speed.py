"""How fast this machine trains each built-in workload: seconds per training step on one
thread, from a few steps of each model after a warm-up (``specon demo`` sizes its jobs by it).

``python -m specon.workloads.speed --models gru,vae [--steps 20]`` prints a JSON object,
model -> seconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: the jobs train on one thread

import torch

from specon.argtypes import positive_int
from specon.workloads.registry import WORKLOADS, build

WARM_UP = 3  # steps not timed: the first ones pay for allocations and caches


def seconds_per_step(models: Sequence[str], *, steps: int = 20) -> dict[str, float]:
    """Each model's wall-clock seconds per step, one thread, ``steps`` steps after ``WARM_UP``."""
    torch.set_num_threads(1)
    out: dict[str, float] = {}
    for name in models:
        work = build(name, seed=0)
        for _ in range(WARM_UP):
            work.train_step()
        start = time.perf_counter()
        for _ in range(steps):
            work.train_step()
        out[name] = (time.perf_counter() - start) / steps
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specon.workloads.speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(WORKLOADS), help="comma-separated (default: all)")
    p.add_argument("--steps", type=positive_int, default=20, help="timed steps per model (default 20)")
    args = p.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in WORKLOADS]
    if unknown or not models:
        p.error(f"unknown model(s): {', '.join(unknown)}" if unknown else "no model")
    print(json.dumps(seconds_per_step(models, steps=args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
