"""The job ``bench_gpu`` restores at three sizes: a job-contract MLP (``specon.jobkit``) of a
chosen width, trained on random batches on ``--device`` (auto: CUDA where there is one).

``python -m bench._gpu_job --width 640 --steps 200``: ``--layers`` hidden layers of ``--width``
units; its checkpoint (weights and Adam's two moments) is about 12 bytes per parameter, so
widths 640, 3500 and 7000 with two hidden layers give about 10 MB, 300 MB and 1.2 GB. One
progress record per step; it checkpoints on SIGTERM and at the end and resumes from its newest
checkpoint (``SPECON_PROGRESS_FILE``/``SPECON_CHECKPOINT_DIR`` from the environment).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Sequence
from typing import Any

from specon import jobkit

BATCH = 256
INPUTS = 256
CLASSES = 10


def model_of(width: int, layers: int) -> Any:
    """The MLP (on the CPU): ``layers`` hidden layers of ``width`` units."""
    import torch  # noqa: PLC0415 - jobkit's rule: torch only where a job needs it

    sizes = [INPUTS, *([width] * layers)]
    parts: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        parts += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*parts, torch.nn.Linear(sizes[-1], CLASSES))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._gpu_job", description=__doc__)
    parser.add_argument("--width", type=int, default=640, help="units per hidden layer (default 640)")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers (default 2)")
    parser.add_argument("--steps", type=int, required=True, help="training steps")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    args = parser.parse_args(argv)
    import torch  # noqa: PLC0415

    device = jobkit.torch_device(args.device)
    torch.manual_seed(0)
    model = model_of(args.width, args.layers).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    with jobkit.Job(
        steps=args.steps,
        save=lambda: jobkit.torch_payload(model, opt),
        restore=lambda b: jobkit.torch_restore(b, model, opt),
        checkpoint_every=None,
        checkpoint_interval=None,
    ) as job:
        for step in job.steps():
            x = torch.randn(BATCH, INPUTS, device=device)
            y = torch.randint(0, CLASSES, (BATCH,), device=device)
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            job.log(step, float(loss))  # float() waits for the step: the record's time is real
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
