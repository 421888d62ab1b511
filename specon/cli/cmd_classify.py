"""``specon classify``: replay training logs through Algorithm 1 and show what it decides.

Every file is read whole (``specon.progress.read_file``) and replayed on its own
(``specon.policy.replay``). A file that cannot be read is reported on stderr and left out of the
output; the others are still processed, and the exit status is 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import typing
from pathlib import Path
from typing import Any

from specon.config import (
    Aggregate,
    ClassifierName,
    FormatName,
    MonitorConfig,
    Normalize,
    Policy,
    PolicyError,
    ProgressConfig,
    default_policy,
    load_policy,
    policy_from_dict,
    policy_to_dict,
)
from specon.model import Direction
from specon.policy.replay import DEFAULT_SECONDS_PER_RECORD, ReplayResult, replay
from specon.progress import ProgressStats, SkipReason, read_file

EXIT_FAILED = 2

# Lines that carried no usable value; blank lines, CSV headers and rows a Lightning
# rewrite repeated are structure, not data, so they are not "skipped".
_DATA_SKIPS = (
    SkipReason.UNPARSABLE,
    SkipReason.NONFINITE,
    SkipReason.NO_METRIC,
    SkipReason.TOO_LONG,
    SkipReason.PARTIAL,
)

_PROGRESS, _MONITOR = ProgressConfig(), MonitorConfig()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="replay training logs through the container monitor (Algorithm 1)",
        description=(
            "Replay each progress log through the classifier in ticks of the categorisation "
            "interval and print when it would call the job progressing, watching or converged "
            "and when it would send a reallocation request. Records with a timestamp are placed "
            "by it (relative to the first record); records without one follow the previous "
            "record after --seconds-per-record. Each file is replayed alone, so the worker-level "
            "request rule is assumed to hold (the worker has enough other active jobs), and no "
            "manager answers: the job keeps being classified after its request. Settings come "
            "from --policy (or the defaults), then from the options below. A file that cannot "
            "be read is reported on stderr and left out; the others are still processed and "
            "the exit status is 2."
        ),
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="progress log (JSON lines, CSV or text)")
    parser.add_argument("--policy", metavar="FILE", help="policy file to take the settings from")
    parser.add_argument(
        "--format",
        choices=typing.get_args(FormatName),
        help=f"log format (default: {_PROGRESS.format})",
    )
    parser.add_argument("--metric", metavar="NAME", help=f"metric to read (default: {_PROGRESS.metric})")
    parser.add_argument(
        "--direction",
        choices=[d.value for d in Direction],
        help=f"whether the metric improves downwards or upwards (default: {_PROGRESS.direction.value})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        metavar="S",
        help=f"categorisation interval in seconds (default: {_MONITOR.interval:g})",
    )
    parser.add_argument(
        "--alpha", type=float, metavar="A", help=f"categorisation threshold (default: {_MONITOR.alpha:g})"
    )
    parser.add_argument(
        "--classifier",
        choices=typing.get_args(ClassifierName),
        help=f"classifier (default: {_MONITOR.classifier})",
    )
    parser.add_argument(
        "--aggregate",
        choices=typing.get_args(Aggregate),
        help=f"how one tick's samples make E (default: {_MONITOR.aggregate})",
    )
    parser.add_argument(
        "--normalize",
        choices=typing.get_args(Normalize),
        help=f"how the change of E is normalised (default: {_MONITOR.normalize})",
    )
    parser.add_argument(
        "--seconds-per-record",
        type=_non_negative,
        default=DEFAULT_SECONDS_PER_RECORD,
        metavar="S",
        help=f"time between records without a timestamp (default: {DEFAULT_SECONDS_PER_RECORD:g})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object per file, as a list")
    parser.add_argument("--plot", metavar="OUT.png", help="draw each file's metric and categories to a PNG")
    parser.set_defaults(func=run)


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def settings(args: argparse.Namespace) -> Policy:
    """The policy file (or the defaults) with the command-line options laid over it.

    Options go through the same validation as the file; ``PolicyError`` lists every problem.
    """
    base = load_policy(args.policy) if args.policy else default_policy()
    data = policy_to_dict(base)
    sections = {
        "progress": ("format", "metric", "direction"),
        "monitor": ("interval", "alpha", "classifier", "aggregate", "normalize"),
    }
    for section, names in sections.items():
        for name in names:
            value = getattr(args, name)
            if value is not None:
                data[section][name] = value
    return policy_from_dict(data, source="command line")


def skipped(stats: ProgressStats) -> int:
    return sum(stats.skipped[reason] for reason in _DATA_SKIPS)


def as_json(path: str, result: ReplayResult, stats: ProgressStats) -> dict[str, Any]:
    return {
        "file": path,
        "records": result.records,
        "skipped": skipped(stats),
        "transitions": [
            {"t": tr.t, "from": tr.source.value, "to": tr.target.value} for tr in result.transitions
        ],
        "request_at": result.request_at,
        "final": result.final.value,
    }


def timeline(path: str, result: ReplayResult, stats: ProgressStats, cfg: MonitorConfig) -> str:
    """A readable account of one replay."""
    lines = [
        f"{path}: {result.records} records, {skipped(stats)} skipped; {result.ticks} ticks of "
        f"{cfg.interval:g} s ({cfg.classifier}, alpha {cfg.alpha:g})"
    ]
    reasons = [f"{stats.skipped[r]} {r.value}" for r in _DATA_SKIPS if stats.skipped[r]]
    if reasons:
        lines.append(f"  skipped lines: {', '.join(reasons)}")
    if not result.records:
        lines.append("  no samples of the metric: nothing to classify")
        return "\n".join(lines)
    events = [(0.0, 0, "progressing")]
    events += [(tr.t, 1, f"{tr.source.value} -> {tr.target.value}") for tr in result.transitions]
    if result.request_at is not None:
        events.append((result.request_at, 2, "reallocation request"))
    lines += [f"  {_clock(t):>10}  {what}" for t, _, what in sorted(events)]
    request = (
        f"first request at {_clock(result.request_at)}, {result.requests} in all"
        if result.request_at is not None
        else "no request"
    )
    lines.append(f"  final: {result.final.value} ({request})")
    return "\n".join(lines)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(seconds, 60.0)
    hours, minutes = divmod(int(minutes), 60)
    return f"{hours}:{minutes:02d}:{secs:04.1f}" if hours else f"{minutes}:{secs:04.1f}"


def run(args: argparse.Namespace) -> int:
    try:
        policy = settings(args)
    except PolicyError as e:
        print(f"specon classify: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.plot:
        # Only for --plot: matplotlib (the `plot` extra) is slow to import, and may be missing.
        try:
            from specon.plots import plot_replays  # noqa: PLC0415
        except ImportError as e:
            print(f"specon classify: {e}", file=sys.stderr)
            return EXIT_FAILED
    status = 0
    done: list[tuple[str, ReplayResult, ProgressStats]] = []
    for path in args.files:
        try:
            samples, stats = read_file(path, policy.progress)
            result = replay(
                ((s.ts, s.value) for s in samples),
                policy.monitor,
                direction=policy.progress.direction,
                seconds_per_record=args.seconds_per_record,
            )
        except (OSError, ValueError) as e:
            print(f"specon classify: {path}: {_reason(e)}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        done.append((path, result, stats))

    if args.json:
        print(json.dumps([as_json(path, result, stats) for path, result, stats in done], indent=2))
    elif done:
        print("\n\n".join(timeline(path, result, stats, policy.monitor) for path, result, stats in done))

    if args.plot and done:
        try:
            plot_replays([(p, r) for p, r, _ in done], Path(args.plot), metric=policy.progress.metric)
        except (OSError, ValueError) as e:
            print(f"specon classify: cannot write the plot {args.plot}: {_reason(e)}", file=sys.stderr)
            status = EXIT_FAILED
    return status


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
