"""``specon learn``: train the learned priority rule (``dl2``) in the simulator.

Imitates the default policy's order on the training workloads, then refines it by
actor-critic reinforcement learning with exploration and experience replay
(``specon.sim.dl2.train``), prints the learning curve and writes a weights file that the
policy file's ``priority.dl2.weights`` names (the shipped weights were made by this command
with its defaults). Seeded: the same options give the same weights. Bad input is reported
on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from specon.policy.dl2.network import read
from specon.sim.dl2.train import LearnConfig, Learned, header, learn
from specon.sim.scenario_file import ScenarioFileError
from specon.sim.trace import DEFAULT_TRACE_DIR, TraceError, load_traces

EXIT_BAD_INPUT = 2
DEFAULTS = LearnConfig()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "learn",
        help="train the learned priority rule (dl2): imitate the default, then actor-critic RL",
        description="Train the dl2 priority rule in the simulator: imitate the default policy's "
        "order of jobs on each worker, then refine it with actor-critic reinforcement learning "
        "(exploration, experience replay), and write its weights (numpy .npz) for the policy "
        "file's priority.dl2.weights.",
    )
    p.add_argument(
        "--scenario",
        action="append",
        metavar="NAME|FILE",
        help="training scenario, repeatable: A1..A5 or a scenario file "
        f"(default {' '.join(DEFAULTS.scenarios)})",
    )
    p.add_argument(
        "--train-seeds",
        type=int,
        default=len(DEFAULTS.train_seeds),
        metavar="N",
        help=f"workloads per scenario to train on, seeds 100.. (default {len(DEFAULTS.train_seeds)})",
    )
    p.add_argument(
        "--validation-seeds",
        type=int,
        default=len(DEFAULTS.validation_seeds),
        metavar="N",
        help="workloads per scenario to pick the weights on, seeds 200.. "
        f"(default {len(DEFAULTS.validation_seeds)})",
    )
    p.add_argument(
        "--seed", type=int, default=DEFAULTS.seed, help=f"the generators' seed (default {DEFAULTS.seed})"
    )
    p.add_argument(
        "--imitation-epochs",
        type=int,
        default=DEFAULTS.imitation_epochs,
        metavar="N",
        help=f"passes over the teacher's decisions (default {DEFAULTS.imitation_epochs})",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=DEFAULTS.iterations,
        metavar="N",
        help=f"actor-critic iterations (default {DEFAULTS.iterations}; 0: imitation only)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=DEFAULTS.episodes,
        metavar="N",
        help=f"sampled episodes per iteration (default {DEFAULTS.episodes})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("dl2-weights.npz"),
        metavar="FILE",
        help="weights file to write (default dl2-weights.npz)",
    )
    p.add_argument("--plot", type=Path, metavar="PNG", help="write the learning curve as a PNG here")
    p.add_argument(
        "--json", dest="json_path", type=Path, metavar="FILE", help="write the learning curve as JSON here"
    )
    p.add_argument("--traces", type=Path, help=f"directory of trace JSON files (default {DEFAULT_TRACE_DIR})")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def _fail(message: str) -> int:
    print(f"specon learn: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def config(args: argparse.Namespace) -> LearnConfig:
    """The training configuration the options give (``ValueError`` for a bad one)."""
    for name in ("train_seeds", "validation_seeds", "imitation_epochs", "episodes"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.iterations < 0:
        raise ValueError(f"--iterations must be >= 0, got {args.iterations}")
    return replace(
        DEFAULTS,
        scenarios=tuple(args.scenario) if args.scenario else DEFAULTS.scenarios,
        train_seeds=tuple(range(100, 100 + args.train_seeds)),
        validation_seeds=tuple(range(200, 200 + args.validation_seeds)),
        seed=args.seed,
        imitation_epochs=args.imitation_epochs,
        iterations=args.iterations,
        episodes=args.episodes,
    )


def curve_table(learned: Learned) -> str:
    rows = [
        "| phase | step | loss | agreement | episodes vs DS | validation vs DS | slowest |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]

    def pct(v: float | None) -> str:
        return "" if v is None else f"{100 * v:+.1f} %"

    for p in learned.curve:
        rows.append(
            f"| {p.phase} | {p.step} | {'' if p.loss is None else f'{p.loss:.3f}'} | "
            f"{'' if p.agreement is None else f'{100 * p.agreement:.1f} %'} | {pct(p.train)} | "
            f"{pct(p.validation)} | {'' if p.worst is None else f'x{p.worst:.2f}'} |"
        )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> int:
    if args.plot is not None:
        try:
            plots = importlib.import_module("specon.plots")
        except ImportError as exc:
            return _fail(str(exc))
    try:
        cfg = config(args)
        traces = load_traces(args.traces)
    except (ValueError, TraceError) as exc:
        return _fail(str(exc))
    if not any(traces.values()):
        return _fail(
            f"no traces under {args.traces or DEFAULT_TRACE_DIR}; record some with `specon trace record`"
        )
    started = time.monotonic()

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"{time.monotonic() - started:7.1f}s {msg}", file=sys.stderr, flush=True)

    try:
        learned = learn(cfg, traces, progress)
    except (ValueError, ScenarioFileError) as exc:
        return _fail(str(exc))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    learned.net.save(args.out, **header(cfg, learned))
    read(args.out)  # what was written reads back
    print(curve_table(learned))
    print()
    print(
        f"kept: {learned.kept}; validation average JCT {100 * learned.validation:+.1f} % vs DS, "
        f"the teacher's {100 * learned.teacher:+.1f} %, slowest job x{learned.worst:.2f} its DS JCT"
    )
    print(f"weights: {args.out} (policy file: priority: {{rule: dl2, dl2: {{weights: {args.out}}}}})")
    if args.json_path is not None:
        args.json_path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"header": header(cfg, learned), "curve": [asdict(p) for p in learned.curve]}
        args.json_path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        imit = [(p.step, p.loss or 0.0, p.agreement or 0.0) for p in learned.curve if p.phase == "imitation"]
        rl = [(p.step, p.train, p.validation) for p in learned.curve if p.phase == "rl"]
        plots.plot_learning_curve(imit, rl, learned.teacher, args.plot)
        print(f"learning curve: {args.plot}")
    return 0
