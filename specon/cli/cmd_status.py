"""``specon status``: the manager's status on a terminal, as tables like ``kubectl get``.

One ``GET /v1/status`` (a page of ``--limit`` entries, from ``--after``), shown as a table of
workers and one of jobs (category, step/total, progress, time left, worker, moves); ``--json``
prints the manager's answer as it came; ``--watch`` does either again every few seconds. The
bearer token (the manager's read token) comes from ``--token-file`` or ``$SPECON_TOKEN`` and is
sent over plain HTTP only to a loopback manager unless ``--insecure-http``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from specon.cli.manager_client import Source, StatusError, add_connection_options, source_of
from specon.wire import protocol
from specon.wire.protocol import ProtocolError
from specon.wire.status import ContainerStatus, Status, WorkerStatus

DEFAULT_WATCH = 2.0
EXIT_FAILED, EXIT_USAGE = 1, 2
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="show the manager's workers and jobs as tables (like kubectl get)",
        description="Read the manager's status (GET /v1/status) and print its workers (reachable, "
        "load, jobs) and its jobs (category, step against declared total steps, progress, estimated "
        "time left, worker, migrations and rebalances). Exit status 1 when the manager cannot be "
        "read, 2 for a bad option.",
    )
    add_connection_options(
        p,
        token="its read token (or its shared token); a manager without "
        "--read-token-file serves its status to anyone",
    )
    p.add_argument(
        "--limit",
        type=_positive_int,
        metavar="N",
        help="entries per page (a worker counts once plus once per job it runs; default: the "
        "manager's, 1,000)",
    )
    p.add_argument("--after", metavar="CURSOR", help="start after this cursor (printed under a partial page)")
    p.add_argument(
        "--watch",
        nargs="?",
        type=_positive_float,
        const=DEFAULT_WATCH,
        metavar="SECONDS",
        help=f"show it again every SECONDS (default {DEFAULT_WATCH:g}), clearing the screen, until Ctrl-C",
    )
    p.add_argument(
        "--json", action="store_true", help="print the manager's status JSON as it came (one line per read)"
    )
    p.set_defaults(func=main)


def _positive_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0.1 <= value <= 86_400:
        raise argparse.ArgumentTypeError(f"expected seconds within [0.1, 86400], got {text!r}")
    return value


# --- reading ---------------------------------------------------------------------------------


# --- the tables ------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns left-aligned, three spaces apart, as ``kubectl get`` prints them."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in (header, *rows)]


def age(seconds: float | None) -> str:
    """A duration as kubectl shows ages: 45s, 3m20s, 2h5m, 4d3h; "-" for none."""
    if seconds is None:
        return "-"
    s = max(0, round(seconds))
    if s >= 100 * 365 * 86_400:
        return ">100y"
    for unit, size, sub, sub_size in (("d", 86_400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            rest = (s % size) // sub_size
            return f"{s // size}{unit}" + (f"{rest}{sub}" if rest else "")
    return f"{s}s"


def _worker_row(w: WorkerStatus) -> list[str]:
    ready = ("yes" if w.reachable else "NO") + ("" if w.ready else " (gone)")
    return [w.id, w.address, ready, age(w.heartbeat_age), f"{w.capacity.cpu:g}", f"{100 * w.usage:.0f}%",
            str(len(w.containers))]  # fmt: skip


def _job_row(c: ContainerStatus) -> list[str]:
    total = c.total_steps
    step = "-" if c.step is None else str(c.step)
    progress = "-"
    if total:
        progress = f"{min(100.0, 100 * (c.step or 0) / total):.0f}%"
    eta = "done" if c.phase == "finished" else age(c.eta)
    category = c.category.value + (" (asks to move)" if c.pending_request else "")
    return [c.id, category, c.phase, f"{step}/{total or '-'}", progress, eta, c.worker, str(c.migrations),
            str(c.rebalances)]  # fmt: skip


def render(s: Status, now: Callable[[], float] = time.time) -> str:
    """The status as text: a summary line, the workers, the jobs, and how to read on."""
    when = dt.datetime.fromtimestamp(now(), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    mode = f"{s.mode}{' (dry-run)' if s.dry_run else ''}"
    lines = [
        f"manager mode {mode} · policy generation {s.policy_generation} · {s.total_workers} workers · "
        f"{s.total_containers} jobs · {s.total_migrations} migrations · {when}",
        "",
    ]
    if s.workers:
        lines += table(("WORKER", "AGENT", "REACHABLE", "HEARTBEAT", "CPUS", "LOAD", "JOBS"),
                       [_worker_row(w) for w in s.workers])  # fmt: skip
        lines.append("")
    if s.containers:
        lines += table(
            (
                "JOB",
                "CATEGORY",
                "PHASE",
                "STEP/TOTAL",
                "PROGRESS",
                "ETA",
                "WORKER",
                "MIGRATIONS",
                "REBALANCES",
            ),
            [_job_row(c) for c in s.containers],
        )
        lines.append("")
    if not s.workers and not s.containers:
        lines += ["no workers or jobs on this page", ""]
    if s.next is not None:
        lines.append(f"more: specon status --after {s.next}")
    return "\n".join(lines).rstrip("\n") + "\n"


# --- main ------------------------------------------------------------------------------------


def show_once(src: Source, args: argparse.Namespace) -> str:
    """What one read prints: the JSON as it came, or the tables."""
    body = src.read(args.limit, args.after)
    if args.json:
        return body.decode("utf-8", "replace").strip() + "\n"
    try:
        status = protocol.decode(body, Status)
    except ProtocolError as exc:
        raise StatusError(f"the answer of {src.url} is not a status: {exc}") from None
    return render(status)


def main(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        src = source_of(args)
    except StatusError as exc:
        print(f"specon status: {exc}", file=err)
        return EXIT_USAGE
    if args.watch is None:
        try:
            out.write(show_once(src, args))
        except StatusError as exc:
            print(f"specon status: {exc}", file=err)
            return EXIT_FAILED
        return 0
    header = f"every {args.watch:g}s: specon status --manager {args.manager}\n\n"
    while True:  # until Ctrl-C (the entry point turns it into exit status 130)
        try:
            text = show_once(src, args)
        except StatusError as exc:  # the manager may come back: say so and go on
            text = "" if args.json else f"specon status: {exc}\n"
            if args.json:  # stdout stays JSON lines
                print(f"specon status: {exc}", file=err, flush=True)
        out.write(text if args.json else CLEAR + header + text)
        out.flush()
        time.sleep(args.watch)
