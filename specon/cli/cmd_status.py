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
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from specon.daemon.cli_args import read_token
from specon.daemon.manager_url import InsecureURLError, check_manager_url
from specon.wire import protocol
from specon.wire.protocol import ContainerStatus, ErrorReply, ProtocolError, Status, WorkerStatus

DEFAULT_MANAGER = "http://127.0.0.1:7700"
DEFAULT_WATCH = 2.0
TIMEOUT = 10.0  # seconds for one request
EXIT_FAILED, EXIT_USAGE = 1, 2
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
_TOKEN_HINT = (
    "give its read token (the file specon-manager reads with --read-token-file) with --token-file FILE "
    "or $SPECON_TOKEN"
)


class StatusError(Exception):
    """A status that could not be read; the message says why and what to do."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="show the manager's workers and jobs as tables (like kubectl get)",
        description="Read the manager's status (GET /v1/status) and print its workers (reachable, "
        "load, jobs) and its jobs (category, step against declared total steps, progress, estimated "
        "time left, worker, migrations and rebalances). Exit status 1 when the manager cannot be "
        "read, 2 for a bad option.",
    )
    p.add_argument(
        "--manager",
        default=DEFAULT_MANAGER,
        metavar="URL",
        help=f"the manager's base URL (default {DEFAULT_MANAGER}); https:// for a manager with TLS",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="file holding the manager's read token (or its shared token); default: $SPECON_TOKEN, "
        "else no token (a manager without --read-token-file serves its status to anyone)",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="PEM file of the CA certificate(s) an https:// manager's certificate must chain to "
        "(default: the system trust store)",
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="send the token over plain http:// to a manager that is not on loopback (only on a "
        "network you trust; prefer https)",
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


@dataclass(frozen=True, slots=True)
class Source:
    """Where the status is read and with what credential."""

    url: str  # the manager's base URL
    token: str  # "" for none
    context: ssl.SSLContext | None  # for https

    def read(self, limit: int | None, after: str | None) -> bytes:
        """The raw ``Status`` JSON of one page; ``StatusError`` saying why not."""
        query = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
        url = (
            self.url.rstrip("/")
            + protocol.STATUS_PATH
            + (f"?{urllib.parse.urlencode(query)}" if query else "")
        )
        headers = {"Accept": protocol.CONTENT_TYPE}
        if self.token:
            headers[protocol.AUTH_HEADER] = f"Bearer {self.token}"
        req = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self.context) as resp:
                body: bytes = resp.read()
                return body
        except urllib.error.HTTPError as exc:
            raise StatusError(self._refused(exc.code, exc.read())) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise StatusError(
                    f"the manager at {self.url} has a certificate this host does not trust "
                    f"({reason.verify_message}): --ca-file must name the CA that signed it"
                ) from None
            raise StatusError(
                f"cannot reach the manager at {self.url}: {reason} (is specon-manager running there? "
                "--manager URL)"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise StatusError(f"cannot reach the manager at {self.url}: {exc}") from None

    def _refused(self, code: int, body: bytes) -> str:
        try:
            said = protocol.decode(body, ErrorReply).error
        except ProtocolError:
            said = body[:200].decode("utf-8", "replace").strip() or "no reason given"
        if code == 401:
            what = "a token" if not self.token else "this token"
            return f"the manager at {self.url} needs {what} it accepts (401: {said}): {_TOKEN_HINT}"
        if code == 403:
            return f"the manager at {self.url} refused this token (403: {said}): use its read token"
        return f"the manager at {self.url} answered {code}: {said}"


def source_of(args: argparse.Namespace) -> Source:
    """The source the options name; ``StatusError`` for a URL the token must not go to or a
    token or CA file that cannot be read."""
    try:
        scheme = check_manager_url(args.manager, insecure_http=args.insecure_http)
    except InsecureURLError as exc:
        raise StatusError(str(exc)) from None
    try:
        token = read_token(args.token_file)
    except OSError as exc:
        raise StatusError(f"--token-file: cannot read {args.token_file}: {exc.strerror or exc}") from None
    context = None
    if scheme == "https":
        try:
            context = ssl.create_default_context(cafile=args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise StatusError(f"--ca-file: cannot use {args.ca_file}: {exc}") from None
    return Source(args.manager, token, context)


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
