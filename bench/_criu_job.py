"""The jobs ``bench_criu`` moves: job-contract jobs (``specon.jobkit``), so one job serves both modes.

``python _criu_job.py small``: a Python loop, one progress record every 0.05 s, its state a
counter. ``python _criu_job.py torch``: a single-process PyTorch MLP (one thread) trained on
random batches, a record per step. Both checkpoint on SIGTERM and resume on start (the job
contract); CRIU moves them without either. ``SPECON_PROGRESS_FILE``/``SPECON_CHECKPOINT_DIR``
come from the environment; periodic checkpoints are off so only a move writes one.
"""

from __future__ import annotations

import json
import sys
import time

from specon import jobkit

STEPS = 1_000_000  # never reached: the benchmark removes the job when done


def small() -> None:
    state = {"x": 0.0}

    def save() -> bytes:
        return json.dumps(state).encode()

    def restore(payload: bytes) -> None:
        state.update(json.loads(payload))

    with jobkit.Job(
        steps=STEPS, save=save, restore=restore, checkpoint_every=None, checkpoint_interval=None
    ) as job:
        for step in job.steps():
            state["x"] = 0.9 * state["x"] + 0.1
            job.log(step, 1.0 - state["x"])
            time.sleep(0.05)


def torch_job() -> None:
    import torch  # noqa: PLC0415 - only this job needs it

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    with jobkit.Job(
        steps=STEPS,
        save=lambda: jobkit.torch_payload(model, opt),
        restore=lambda b: jobkit.torch_restore(b, model, opt),
        checkpoint_every=None,
        checkpoint_interval=None,
    ) as job:
        for step in job.steps():
            x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            job.log(step, float(loss))
            time.sleep(0.02)  # leave the shared CPUs some room between steps


if __name__ == "__main__":
    {"small": small, "torch": torch_job}[sys.argv[1]]()
