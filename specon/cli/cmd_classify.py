"""``specon classify``: replay training logs through Algorithm 1 and show what it decides.

Every file is read whole (``specon.progress.read_log``: its format and metric found as the
agent finds them) and replayed on its own (``specon.policy.replay``); records without
timestamps are spaced by ``specon.progress.spacing``. A file that cannot be read, or that
yields no records of the metric (it then says what it had instead), is reported on stderr
and left out of the output; the others are still processed, and the exit status is 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import typing
from dataclasses import dataclass
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
from specon.policy.replay import ReplayResult, replay
from specon.progress import LogRead, ProgressStats, SkipReason, read_log
from specon.progress.filetimes import lifetime
from specon.progress.metric import FALLBACKS, no_records
from specon.progress.spacing import Spacing, spacing_for

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
            "and when it would send a reallocation request. Reads JSON lines, CSV (Keras and "
            "Lightning CSVLogger), text (including the Hugging Face Trainer's console lines), "
            "Hugging Face trainer_state.json and TensorBoard event files (the tensorboard extra), "
            "detected from their content. Without --metric, a log with no 'loss' is read for the "
            f"first of {', '.join(FALLBACKS)} it has (else a name ending in 'loss'), and the output "
            "says which (docs/logs.md). Records with a "
            "timestamp are placed by it (relative to the first record); records without one "
            "follow the previous record after --seconds-per-record, else spread over the time "
            "the file was written (birth to last modification) when that is known, else one per "
            "interval. Each file is replayed alone, so the worker-level request rule is assumed "
            "to hold (the worker has enough other active jobs), and no manager answers: the job "
            "keeps being classified after its request. Settings come from --policy (or the "
            "defaults), then from the options below. A file that cannot be read, or that yields "
            "no records of the metric (the names it has are listed), is reported on stderr and "
            "left out; the others are still processed and the exit status is 2."
        ),
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="progress log (JSON lines, CSV, text, trainer_state.json or a TensorBoard event file)",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy file to take the settings from")
    parser.add_argument(
        "--format",
        choices=typing.get_args(FormatName),
        help=f"line format to read the log as (default: {_PROGRESS.format}: detected; trainer_state.json "
        "and TensorBoard event files are detected only)",
    )
    parser.add_argument(
        "--metric",
        metavar="NAME",
        help=f"metric to read: a column, key or tag name (default: {_PROGRESS.metric}, or by the metric "
        "rule when the log has none: docs/logs.md)",
    )
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
        "--alpha",
        type=float,
        metavar="A",
        help=f"categorisation threshold of classifier specon and of robust's change test (default: "
        f"{_MONITOR.alpha:g}); the robust classifier's doubling test, the default, does not use it",
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
        metavar="S",
        help="time between records without a timestamp (default: spread over the time the file was "
        "written, birth to last modification, when known; else one record per interval)",
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


def alpha_used(cfg: MonitorConfig) -> bool:
    """Whether ``cfg``'s classifier reads alpha: specon's does, and the robust one's change
    test; its doubling test (the default) decides by ``gain``."""
    return cfg.classifier != "robust" or cfg.robust.test == "change"


def classifier_text(cfg: MonitorConfig) -> str:
    """The classifier and the threshold it decides by: ``robust, doubling test, gain 0.11``."""
    if cfg.classifier != "robust":
        return f"{cfg.classifier}, alpha {cfg.alpha:g}"
    if cfg.robust.test == "change":
        return f"robust, change test, alpha {cfg.alpha:g}"
    return f"robust, doubling test, gain {cfg.robust.gain:g}"


@dataclass(frozen=True, slots=True)
class Replayed:
    """One file's replay, with what was read to make it."""

    path: str
    log: LogRead
    spacing: Spacing | None  # None: every record had a timestamp
    result: ReplayResult


def as_json(done: Replayed) -> dict[str, Any]:
    result, spacing = done.result, done.spacing
    return {
        "file": done.path,
        "format": done.log.format,
        "metric": done.log.choice.chosen,
        "records": result.records,
        "skipped": skipped(done.log.stats),
        "spacing": None
        if spacing is None
        else {"untimed": spacing.untimed, "seconds": spacing.seconds, "rule": spacing.rule},
        "transitions": [
            {"t": tr.t, "from": tr.source.value, "to": tr.target.value} for tr in result.transitions
        ],
        "request_at": result.request_at,
        "final": result.final.value,
    }


def timeline(done: Replayed, cfg: MonitorConfig) -> str:
    """A readable account of one replay."""
    result, stats, log = done.result, done.log.stats, done.log
    lines = [
        f"{done.path}: {log.format}, metric {log.choice.describe()}; {result.records} records, "
        f"{skipped(stats)} skipped; {result.ticks} ticks of {cfg.interval:g} s ({classifier_text(cfg)})"
    ]
    reasons = [f"{stats.skipped[r]} {r.value}" for r in _DATA_SKIPS if stats.skipped[r]]
    if reasons:
        lines.append(f"  skipped lines: {', '.join(reasons)}")
    if done.spacing is not None:
        lines.append(f"  {done.spacing.describe()}")
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


def nothing_read(log: LogRead) -> str | None:
    """Why ``log`` gives nothing to replay, or None if it has records."""
    stats = log.stats
    if log.samples:
        return None
    if stats.bytes_read == 0:
        return "empty file: no records to classify"
    reasons = ", ".join(f"{n} {r.value}" for r, n in stats.skipped.items() if n)
    what = f"{log.format or 'unrecognised'} log, {stats.lines} lines ({reasons or 'none complete'})"
    return f"no records of the metric in this {what}: {no_records(log.choice, kind=log.names)}"


def replay_file(path: str, policy: Policy, seconds_per_record: float | None) -> Replayed:
    """Read and replay one file; ``OSError``/``ValueError`` if it cannot be, or has no records."""
    log = read_log(path, policy.progress)
    problem = nothing_read(log)
    if problem is not None:
        raise ValueError(problem)
    untimed = sum(1 for s in log.samples if s.ts is None)
    spacing = None
    if untimed:
        spacing = spacing_for(
            untimed,
            given=seconds_per_record,
            lifetime=lifetime(os.path.realpath(path)),
            interval=policy.monitor.interval,
        )
    result = replay(
        ((s.ts, s.value) for s in log.samples),
        policy.monitor,
        direction=policy.progress.direction,
        seconds_per_record=0.0 if spacing is None else spacing.seconds,
    )
    return Replayed(path, log, spacing, result)


def run(args: argparse.Namespace) -> int:
    try:
        policy = settings(args)
    except PolicyError as e:
        print(f"specon classify: {e}", file=sys.stderr)
        return EXIT_FAILED
    if args.alpha is not None and not alpha_used(policy.monitor):
        print(
            f"specon classify: --alpha {args.alpha:g} is ignored: the robust classifier's doubling test "
            f"decides by gain ({policy.monitor.robust.gain:g}); alpha applies to --classifier specon "
            "and to the robust classifier's change test (monitor.robust.test: change)",
            file=sys.stderr,
        )
    if args.plot:
        # Only for --plot: matplotlib (the `plot` extra) is slow to import, and may be missing.
        try:
            from specon.plots import plot_replays  # noqa: PLC0415
        except ImportError as e:
            print(f"specon classify: {e}", file=sys.stderr)
            return EXIT_FAILED
    status = 0
    done: list[Replayed] = []
    for path in args.files:
        try:
            done.append(replay_file(path, policy, args.seconds_per_record))
        except (OSError, ValueError) as e:
            print(f"specon classify: {path}: {_reason(e)}", file=sys.stderr)
            status = EXIT_FAILED

    if args.json:
        print(json.dumps([as_json(d) for d in done], indent=2))
    elif done:
        print("\n\n".join(timeline(d, policy.monitor) for d in done))

    if args.plot and done:
        metric = ", ".join(dict.fromkeys(d.log.choice.metric for d in done))
        try:
            plot_replays([(d.path, d.result) for d in done], Path(args.plot), metric=metric)
        except (OSError, ValueError) as e:
            print(f"specon classify: cannot write the plot {args.plot}: {_reason(e)}", file=sys.stderr)
            status = EXIT_FAILED
    return status


def _reason(e: Exception) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e)
