"""``specon trace record``: record loss-curve traces from the project's own workloads.

Each (model, seed) trains in this process on one torch thread and is written as one JSON
trace (``specon.sim.trace``) into ``--out`` (default: the current directory). The traces
shipped in the package (``DEFAULT_TRACE_DIR``, what the simulator uses by default) are never
written: an ``--out`` there is refused before any training. torch is imported only when the
command runs, so ``specon --help`` works without it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from specon.sim.curves import DEFAULT_STRIDE
from specon.sim.trace import DEFAULT_TRACE_DIR

DEFAULT_SEEDS = (0, 1, 2)
PROGRESS_EVERY = 200  # steps between progress lines


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _int_list(text: str) -> list[int]:
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        seeds = []
    if not seeds:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return seeds


def _name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated model names")
    return names


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "trace",
        help="record loss-curve traces for the simulator",
        description="Work with the loss-curve traces the simulator replays.",
    )
    actions = parser.add_subparsers(dest="trace_action", metavar="ACTION", required=True)
    record = actions.add_parser(
        "record",
        help="train the project's workloads and record their loss curves and step cost",
        description=(
            "Train each model for each seed in this process (one torch thread), recording the raw "
            "mini-batch loss every --stride steps and the CPU time per step, and write one JSON "
            "trace per (model, seed) as MODEL-seedSEED.json into --out. Progress goes to stderr. "
            "Needs torch. The traces shipped with specon are never overwritten: point "
            "`specon sim --traces DIR` at the new ones."
        ),
    )
    record.add_argument(
        "--models",
        type=_name_list,
        help="comma-separated models (default: all of specon.workloads: vae,gru,birnn,rnn,dynrnn)",
    )
    record.add_argument(
        "--seeds",
        type=_int_list,
        default=list(DEFAULT_SEEDS),
        help=f"comma-separated seeds (default: {','.join(map(str, DEFAULT_SEEDS))})",
    )
    record.add_argument("--steps", type=_positive_int, help="training steps (default: each model's own)")
    record.add_argument(
        "--stride",
        type=_positive_int,
        default=DEFAULT_STRIDE,
        help=f"record the loss every N steps (default {DEFAULT_STRIDE})",
    )
    record.add_argument(
        "--out",
        type=Path,
        default=Path("."),
        help="output directory (default: the current directory; not the shipped traces, "
        f"{DEFAULT_TRACE_DIR})",
    )
    record.set_defaults(func=_record)


def shipped(out: Path) -> bool:
    """Whether ``out`` is (inside) the package's shipped traces."""
    return out.resolve().is_relative_to(DEFAULT_TRACE_DIR.resolve())


def _record(args: argparse.Namespace) -> int:
    if shipped(args.out):
        print(
            f"specon trace record: --out {args.out} is the traces shipped with specon "
            f"({DEFAULT_TRACE_DIR}), which are never overwritten; write them elsewhere "
            "and pass that directory to `specon sim --traces`",
            file=sys.stderr,
        )
        return 2
    try:
        from specon.sim import record  # noqa: PLC0415  (imports torch)
        from specon.workloads.registry import WORKLOADS  # noqa: PLC0415
    except ImportError as e:
        print(f"specon trace record needs torch (pip install 'specon[train]'): {e}", file=sys.stderr)
        return 2
    models = args.models or list(WORKLOADS)
    unknown = [m for m in models if m not in WORKLOADS]
    if unknown:
        print(
            f"specon trace record: unknown model(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}",
            file=sys.stderr,
        )
        return 2
    machine = record.machine_facts()
    for model in models:
        for seed in args.seeds:
            label = f"{model} seed {seed}"

            def progress(step: int, steps: int, loss: float, label: str = label) -> None:
                if step % PROGRESS_EVERY == 0 or step == steps:
                    print(f"  {label}: step {step}/{steps} loss {loss:.5g}", file=sys.stderr, flush=True)

            t0 = time.perf_counter()
            try:
                trace = record.record_trace(
                    model,
                    seed=seed,
                    steps=args.steps,
                    stride=args.stride,
                    machine=machine,
                    on_progress=progress,
                )
                path = record.record_to(args.out, trace, seed=seed)
            except (ValueError, OSError) as e:
                print(f"specon trace record: {label}: {e}", file=sys.stderr)
                return 2
            print(
                f"{path}: {trace.steps} steps, {len(trace.losses)} losses, "
                f"{trace.step_cost * 1e3:.2f} ms CPU/step, {path.stat().st_size} bytes "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
    return 0
