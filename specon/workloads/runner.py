"""Run one workload as a migratable job: ``python -m specon.workloads --model vae``.

The job follows the contract of ``specon.jobkit`` (progress records to
``$SPECON_PROGRESS_FILE``, checkpoints in ``$SPECON_CHECKPOINT_DIR``, checkpoint and exit
with ``jobkit.EXIT_CHECKPOINTED`` on SIGTERM, resume on start, ``done.json`` when finished).
Each progress record's ``loss`` is the mean mini-batch loss since the previous record.
``--device auto|cpu|cuda`` picks where it trains; its checkpoints load on any device.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Sequence
from pathlib import Path

import torch

from specon import jobkit
from specon.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from specon.workloads.registry import WORKLOADS, build

DEFAULT_LOG_EVERY = 10  # ~4 records/s at the models' ~40 steps/s on one thread


def build_parser() -> argparse.ArgumentParser:
    models = "\n".join(
        f"  {s.name:<7} {s.title} ({s.loss} loss): {s.steps} steps, batch {s.batch_size}, lr {s.lr:g}"
        for s in WORKLOADS.values()
    )
    parser = argparse.ArgumentParser(
        prog="python -m specon.workloads",
        description="Train one of SpeCon's five models as a migratable job (specon.jobkit contract).",
        epilog=f"models and their defaults:\n{models}\n\nenvironment: {jobkit.ENV_PROGRESS_FILE}, "
        f"{jobkit.ENV_CHECKPOINT_DIR}, {jobkit.ENV_JOB_ID}.\nexit codes: 0 finished, "
        f"{jobkit.EXIT_CHECKPOINTED} checkpointed on SIGTERM/SIGINT (resume by starting it again).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, choices=sorted(WORKLOADS), help="which model to train")
    parser.add_argument("--steps", type=non_negative_int, help="training steps (default: the model's)")
    parser.add_argument("--batch-size", type=positive_int, help="mini-batch size (default: the model's)")
    parser.add_argument("--lr", type=positive_float, help="Adam learning rate (default: the model's)")
    parser.add_argument("--seed", type=int, default=0, help="initialisation and mini-batch seed (default 0)")
    parser.add_argument(
        "--log-every",
        type=positive_int,
        default=DEFAULT_LOG_EVERY,
        help=f"steps per progress record (default {DEFAULT_LOG_EVERY})",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=non_negative_int,
        default=jobkit.DEFAULT_CHECKPOINT_EVERY,
        help=f"periodic checkpoint every K steps, 0 = never (default {jobkit.DEFAULT_CHECKPOINT_EVERY})",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=non_negative_float,
        default=jobkit.DEFAULT_CHECKPOINT_INTERVAL,
        help=f"... or every S seconds, 0 = never (default {jobkit.DEFAULT_CHECKPOINT_INTERVAL:g})",
    )
    parser.add_argument("--progress-file", type=Path, help=f"default ${jobkit.ENV_PROGRESS_FILE}")
    parser.add_argument("--checkpoint-dir", type=Path, help=f"default ${jobkit.ENV_CHECKPOINT_DIR}")
    parser.add_argument("--job-id", help=f"default ${jobkit.ENV_JOB_ID}")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--device",
        default="auto",
        metavar="{auto,cpu,cuda,cuda:N}",
        help="where to train: auto = cuda where torch sees a GPU, else cpu (default auto); a checkpoint"
        " resumes on any device",
    )
    return parser


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    # Settable only before the first inter-op parallel work; harmless when too late.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    """Train the job; returns 0 when finished (a stop request exits with EXIT_CHECKPOINTED)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device = jobkit.torch_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))  # exits 2 saying why: before any step, nothing is lost
    _set_threads(args.threads)
    spec = WORKLOADS[args.model]
    steps = spec.steps if args.steps is None else args.steps
    workload = build(args.model, seed=args.seed, batch_size=args.batch_size, lr=args.lr, device=device)
    job = jobkit.Job(
        steps=steps,
        save=workload.state,
        restore=workload.load,
        checkpoint_dir=args.checkpoint_dir,
        progress=args.progress_file,
        job_id=args.job_id,
        checkpoint_every=args.checkpoint_every or None,
        checkpoint_interval=args.checkpoint_interval or None,
    )
    with job:
        window: list[float] = []
        for step in job.steps():
            window.append(workload.train_step())
            if step % args.log_every == 0 or step == steps:
                job.log(step, sum(window) / len(window))
                window.clear()
    return 0
