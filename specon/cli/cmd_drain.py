"""``specon drain WORKER`` and ``specon uncordon WORKER``: take a worker out of service with its
jobs moved off, each with a fresh checkpoint, and put it back (SPEC §6.6).

``drain`` cordons the worker through the manager's API (``POST /v1/workers/WORKER/drain``, the
operator token): it takes no new jobs, and each of its jobs is saved and restored on another
worker, ahead of other moves. ``--deadline S``: each job is saved within S seconds, or, if its
save cannot finish in time, restored from its newest complete checkpoint (its lost steps are
reported). ``--wait`` follows the drain until the worker runs no job and no move is under way,
printing each move as it ends. ``uncordon`` lets the worker take jobs again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TextIO

from specon.cli.manager_client import OPERATOR_TOKEN, Source, StatusError, add_connection_options, source_of
from specon.wire.operator import DRAIN_PATH, MAX_DEADLINE, UNCORDON_PATH, DrainReply
from specon.wire.status import MigrationStatus

EXIT_FAILED, EXIT_USAGE = 1, 2
POLL = 1.0  # seconds between reads of the drain's progress
# How long --wait waits without a deadline, and past one: a restore may take this long.
WAIT_DEFAULT = 600.0
RESTORE_SLACK = 300.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    d = sub.add_parser(
        "drain",
        help="move every job off a worker (each with a fresh checkpoint) and keep new ones away",
        description="Cordon WORKER (it takes no new jobs) and move each of its jobs to another worker "
        "with a fresh checkpoint, ahead of other moves. Needs the manager's operator token. Exit "
        "status 0 when the drain was accepted (with --wait: when the worker runs no job), 1 when it "
        "failed or --wait timed out, 2 for a bad option.",
    )
    d.add_argument("worker", metavar="WORKER", help="the worker id, as specon status shows it")
    d.add_argument(
        "--deadline",
        type=_seconds,
        metavar="S",
        help="save each job within S seconds; a save that cannot finish in time is cut short and the "
        "job restored from its newest complete checkpoint (its lost steps are reported)",
    )
    d.add_argument(
        "--wait",
        action="store_true",
        help="follow the drain until the worker runs no job and no move is under way",
    )
    d.add_argument(
        "--timeout",
        type=_seconds,
        metavar="S",
        help=f"with --wait, give up after S seconds (default: the deadline plus {RESTORE_SLACK:g} s, "
        f"else {WAIT_DEFAULT:g} s)",
    )
    add_connection_options(d, token="operator token (specon-manager --operator-token-file)")
    d.set_defaults(func=main_drain)
    u = sub.add_parser(
        "uncordon",
        help="let a drained worker take jobs again",
        description="Let WORKER take jobs again (moves already under way go on). Needs the manager's "
        "operator token. Exit status 0 when done, 1 when it failed, 2 for a bad option.",
    )
    u.add_argument("worker", metavar="WORKER", help="the worker id, as specon status shows it")
    add_connection_options(u, token="operator token (specon-manager --operator-token-file)")
    u.set_defaults(func=main_uncordon)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 < value <= MAX_DEADLINE:
        raise argparse.ArgumentTypeError(f"expected seconds within (0, {MAX_DEADLINE:g}], got {text!r}")
    return value


def _reply(src: Source, method: str, path: str, body: bytes | None = None) -> DrainReply:
    raw = src.call(method, path, body, token=OPERATOR_TOKEN)
    try:
        return DrainReply.from_json(raw)
    except ValueError as exc:
        raise StatusError(f"the manager at {src.url} answered what is not a drain: {exc}") from None


def describe(m: MigrationStatus) -> str:
    """One move of the drain, as a line."""
    lost = "" if m.lost_steps is None else f", {m.lost_steps} step(s) lost"
    where = f"{m.source} -> {m.target}"
    if m.state.value == "done":
        down = "" if m.downtime is None else f", down {m.downtime:.1f} s"
        return f"  {m.container}: {where} moved{down}{lost}"
    if m.state.value == "rolled_back":
        return f"  {m.container}: {where} rolled back ({m.error or 'no reason given'}); tried again{lost}"
    return f"  {m.container}: {where} {m.state.value}{lost}"


def main_drain(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        src = source_of(args)
    except StatusError as exc:
        print(f"specon drain: {exc}", file=err)
        return EXIT_USAGE
    path = DRAIN_PATH.format(worker=args.worker)
    body = json.dumps({"deadline": args.deadline}).encode()
    try:
        reply = _reply(src, "POST", path, body)
    except StatusError as exc:
        print(f"specon drain: {exc}", file=err)
        return EXIT_FAILED
    by = "" if args.deadline is None else f", each saved within {args.deadline:g} s"
    print(f"{args.worker} cordoned: {len(reply.jobs)} job(s) to move{by}", file=out, flush=True)
    if not args.wait:
        return 0
    limit = args.timeout or (WAIT_DEFAULT if args.deadline is None else args.deadline + RESTORE_SLACK)
    return _follow(src, path, args.worker, time.monotonic() + limit, out=out, err=err)


def _follow(src: Source, path: str, worker: str, until: float, *, out: TextIO, err: TextIO) -> int:
    told: dict[str, str] = {}
    reply: DrainReply | None = None
    while True:
        try:
            reply = _reply(src, "GET", path)
        except StatusError as exc:  # the manager may come back (a failover): say so and go on
            print(f"specon drain: {exc}", file=err, flush=True)
        else:
            for m in reply.moves:
                line = describe(m)
                if told.get(m.id) != line and m.state.value in ("done", "rolled_back"):
                    told[m.id] = line
                    print(line, file=out, flush=True)
            in_flight = [m for m in reply.moves if m.state.value not in ("done", "rolled_back")]
            if not reply.jobs and not in_flight:
                print(f"{worker} drained: it runs no job", file=out, flush=True)
                return 0
            if not reply.cordoned:
                print(f"specon drain: {worker} was uncordoned meanwhile", file=err)
                return EXIT_FAILED
        if time.monotonic() > until:
            left = ", ".join(reply.jobs) if reply is not None and reply.jobs else "moves under way"
            print(f"specon drain: {worker} still runs {left}: timed out", file=err)
            return EXIT_FAILED
        time.sleep(POLL)


def main_uncordon(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        src = source_of(args)
    except StatusError as exc:
        print(f"specon uncordon: {exc}", file=err)
        return EXIT_USAGE
    try:
        reply = _reply(src, "POST", UNCORDON_PATH.format(worker=args.worker))
    except StatusError as exc:
        print(f"specon uncordon: {exc}", file=err)
        return EXIT_FAILED
    print(f"{reply.worker} uncordoned: it takes jobs again", file=out)
    return 0
