"""The tiny supervisor every local job runs under: run the job, record how it ended.

A local job is detached from the agent that started it (its own session), so the agent
may be gone when the job ends and could not learn its exit status. This launcher is the
job's parent instead: it forks and execs the job command, waits for it, and appends one
exit record to the job's ``exits.jsonl`` on the persistent volume.

It is run *by path* with ``python -I -S``, so it must import nothing but the standard
library; the runtime imports :class:`ExitRecord` from here so the record format has one
definition.

Signals: the runtime signals the whole process group, so the job receives SIGTERM itself.
The launcher only ignores it (a no-op handler, not ``SIG_IGN``, because ``SIG_IGN`` would be
inherited across ``exec`` and make the job deaf to SIGTERM) and never forwards it: a
forwarded copy would reach the job twice.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from types import FrameType

# How an exit record came to be written.
REASON_EXITED = "exited"  # the job ended by itself or after a signal; the launcher saw it
REASON_KILLED = "killed"  # the runtime SIGKILLed the process group (the launcher died too)
REASON_LOST = "lost"  # the runtime found the job dead with no record (e.g. host reboot)
EXEC_FAILED = 127  # the shell's convention for "command not found / not executable"


@dataclass(frozen=True, slots=True)
class ExitRecord:
    """One line of ``exits.jsonl``: how one run (``run_id``) of a job ended."""

    run_id: str
    worker: str
    pid: int
    # The exit status; None when a signal ended the job or the status is unknown.
    exit_code: int | None
    # The signal that ended the job, if one did.
    signal: int | None
    reason: str
    time: float

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes | str) -> ExitRecord:
        """Parse one line; raise ``ValueError`` saying what is wrong."""
        try:
            raw = json.loads(line)
            return cls(
                run_id=str(raw["run_id"]),
                worker=str(raw["worker"]),
                pid=int(raw["pid"]),
                exit_code=None if raw.get("exit_code") is None else int(raw["exit_code"]),
                signal=None if raw.get("signal") is None else int(raw["signal"]),
                reason=str(raw["reason"]),
                time=float(raw["time"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad exit record {line!r}: {exc}") from exc


def append_exit(path: str | os.PathLike[str], record: ExitRecord) -> None:
    """Append one record with a single O_APPEND write, then fsync: lines never interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        os.write(fd, record.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


# The signals a runtime sends the job's group, which every launcher outlives.
JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    """Outlive the job's SIGTERM so its exit can be recorded."""


def ignore_job_signals() -> None:
    """A launcher's (or keeper's) handlers: no-ops, not ``SIG_IGN``, which the job would inherit."""
    for signum in JOB_SIGNALS:
        signal.signal(signum, _ignore)


def fork_job() -> int:
    """``os.fork`` for the job's process, from a launcher that ignores ``JOB_SIGNALS``. They
    are held across the fork: one arriving between the fork and the exec (or the warm job's
    own set-up) would run the child's copy of the launcher's no-op and never reach the job,
    which would then train on through its save's grace. The child puts the defaults back
    before it lets them through, so one held meanwhile ends it, as it would have the job."""
    signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    pid = -1
    try:
        pid = os.fork()
        if pid == 0:
            for signum in JOB_SIGNALS:
                signal.signal(signum, signal.SIG_DFL)
    finally:  # a mask survives exec: the job must start with these let through
        signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)
    return pid


def launcher_argv(python: str, exit_log: os.PathLike[str] | str, run_id: str, worker: str) -> list[str]:
    """How a runtime starts a job under this launcher (the job's command follows)."""
    return [python, "-I", "-S", os.path.abspath(__file__), os.fspath(exit_log), run_id, worker, "--"]


def warm_comm(run_id: str) -> str:
    """The process name (``/proc/PID/comm``, at most 15 bytes) a launcher forked by the warm
    interpreter (``specon.runtime.local.zygote``) takes for ``run_id``: its argv is the server's."""
    return f"sp-{run_id[:12]}"


def find_launcher(run_id: str, proc: os.PathLike[str] | str = "/proc") -> int | None:
    """The pid of the launcher running ``run_id`` (its argv carries it, or, forked by the
    warm interpreter, its name), if one runs."""
    marker, me, comm = run_id.encode(), os.path.basename(__file__).encode(), warm_comm(run_id).encode()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(os.path.join(proc, name, "cmdline"), "rb") as f:
                argv = f.read().split(b"\0")
            if marker in argv and any(a.endswith(me) for a in argv):
                return int(name)
            with open(os.path.join(proc, name, "comm"), "rb") as f:
                if f.read().strip() == comm:
                    return int(name)
        except OSError:  # gone meanwhile
            continue
    return None


def main(argv: list[str]) -> int:
    """``launcher.py EXIT_LOG RUN_ID WORKER -- COMMAND...``"""
    if len(argv) < 5 or argv[3] != "--":
        print("usage: launcher.py EXIT_LOG RUN_ID WORKER -- COMMAND...", file=sys.stderr)
        return 2
    exit_log, run_id, worker, command = argv[0], argv[1], argv[2], argv[4:]
    # Installed before the fork so there is no window in which a group SIGTERM kills us.
    ignore_job_signals()
    child = fork_job()
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"specon launcher: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXEC_FAILED)
    return wait_and_record(child, exit_log, run_id, worker)


def wait_and_record(child: int, exit_log: str, run_id: str, worker: str) -> int:
    """Wait for the job ``child``, append its exit record, and return the status this
    launcher exits with (the job's code, or 128 + the signal that ended it)."""
    _, status = os.waitpid(child, 0)  # retried on EINTR (PEP 475)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    exit_code = code if code >= 0 else None
    append_exit(
        exit_log,
        ExitRecord(run_id, worker, os.getpid(), exit_code, sig, REASON_EXITED, time.time()),
    )
    return code if code >= 0 else 128 + (sig or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
