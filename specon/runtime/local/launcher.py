"""The tiny supervisor every local job runs under: run the job, record how it ended.

A local job is detached from the agent that started it (its own session), so the agent
may be gone when the job ends and could not learn its exit status. This launcher is the
job's parent instead: it forks and execs the job command, waits for it, and appends one
exit record to the job's ``exits.jsonl`` on the persistent volume.

It is run *by path* with ``python -I -S``, so it must import nothing but the standard
library; the two modules of specon it needs, ``cgroup_entry`` and ``specon.fence`` (standard
library only, both), it loads by path (``_load``). The runtime imports :class:`ExitRecord`
from here so the record format has one definition.

Budget: the launcher joins the worker's cgroups and CPUs itself (``--entry``) before it forks
the job, and says so on ``--ready`` (``ok``, or why not). The runtime does not join them in a
``preexec_fn``: a child forked from the threaded agent can deadlock before its exec (the
``subprocess`` documentation's warning), and such a child holds every descriptor of the
agent: its listening socket and the job's ``flock``, so the agent cannot come back and no
host can start the job.

Fencing: it also watches the job's ``generation.json`` beside the exit log (a ``stat`` a
second, ``specon.fence``). Once a newer generation has started (the manager took this host
for lost and restored the job elsewhere), it SIGKILLs the job and its process group and
records the exit as ``fenced``: a stale copy stops within a second even where the job does
not check its generation itself and no agent is left to stop it.

Signals: the runtime signals the whole process group, so the job receives SIGTERM itself.
The launcher only ignores it (a no-op handler, not ``SIG_IGN``, because ``SIG_IGN`` would be
inherited across ``exec`` and make the job deaf to SIGTERM) and never forwards it: a
forwarded copy would reach the job twice.
"""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType, ModuleType

TYPE_CHECKING = False  # not typing's: this file runs by path and should not import typing
if TYPE_CHECKING:
    from specon.fence import Fence

# How an exit record came to be written.
REASON_EXITED = "exited"  # the job ended by itself or after a signal; the launcher saw it
REASON_KILLED = "killed"  # the runtime SIGKILLed the process group (the launcher died too)
REASON_LOST = "lost"  # the runtime found the job dead with no record (e.g. host reboot)
REASON_FENCED = "fenced"  # a newer generation started elsewhere: the launcher killed its job
EXEC_FAILED = 127  # the shell's convention for "command not found / not executable"
FENCE_POLL_S = 1.0
READY = b"ok"  # what a launcher tells on ``--ready`` once it is in the worker's budget


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


def launcher_argv(
    python: str,
    exit_log: os.PathLike[str] | str,
    run_id: str,
    worker: str,
    *,
    entry: Mapping[str, object] | None = None,
    ready: int | None = None,
) -> list[str]:
    """How a runtime starts a job under this launcher (the job's command follows): in the
    cgroups and CPUs of ``entry`` (``Entry.to_json``), telling the outcome on the inherited
    descriptor ``ready``."""
    options = [] if entry is None else ["--entry", json.dumps(entry)]
    options += [] if ready is None else ["--ready", str(ready)]
    return [
        python,
        "-I",
        "-S",
        os.path.abspath(__file__),
        *options,
        os.fspath(exit_log),
        run_id,
        worker,
        "--",
    ]


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


USAGE = "usage: launcher.py [--entry JSON] [--ready FD] EXIT_LOG RUN_ID WORKER -- COMMAND..."


def main(argv: list[str]) -> int:
    """``launcher.py [--entry JSON] [--ready FD] EXIT_LOG RUN_ID WORKER -- COMMAND...``"""
    options: dict[str, str] = {}
    while len(argv) >= 2 and argv[0] in ("--entry", "--ready"):
        options[argv[0]], argv = argv[1], argv[2:]
    if len(argv) < 5 or argv[3] != "--":
        print(USAGE, file=sys.stderr)
        return 2
    exit_log, run_id, worker, command = argv[0], argv[1], argv[2], argv[4:]
    ready = int(options["--ready"]) if options.get("--ready", "").isdigit() else None
    try:
        if "--entry" in options:
            cgroup_entry = _cgroup_entry()
            cgroup_entry.enter(cgroup_entry.Entry.from_json(json.loads(options["--entry"])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _tell(ready, f"cannot join the worker's budget: {exc}")
        return 1
    _tell(ready, READY.decode())
    # Installed before the fork so there is no window in which a group SIGTERM kills us.
    ignore_job_signals()
    child = fork_job()
    if child == 0:
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            print(f"specon launcher: cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        os._exit(EXEC_FAILED)
    return wait_and_record(child, exit_log, run_id, worker, _fence().env_generation(os.environ))


def _tell(ready: int | None, outcome: str) -> None:
    """Tell the runtime how the set-up went (``ok`` or why not); the job never inherits it."""
    if ready is None:
        if outcome != "ok":
            print(f"specon launcher: {outcome}", file=sys.stderr, flush=True)
        return
    try:
        os.write(ready, outcome.encode())
    except OSError:  # the runtime gave up waiting: it kills this launcher
        pass
    finally:
        os.close(ready)


def read_ready(fd: int, timeout: float) -> bytes | None:
    """What a launcher told on its ``--ready`` descriptor (``READY``, or why it could not set
    up; empty if it ended without a word), or None if it said nothing within ``timeout``."""
    deadline = time.monotonic() + timeout
    told = b""
    while len(told) < 4096:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        told += chunk
    return told


_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str, *parts: str) -> ModuleType:
    """The standard-library-only module of specon at ``parts`` (relative to this file), loaded
    by path once: this file runs without ``specon`` on its path."""
    key = f"specon_launcher_{name}"
    loaded = sys.modules.get(key)
    if loaded is not None:
        return loaded
    path = os.path.normpath(os.path.join(_HERE, *parts))
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None:  # pragma: no cover - a file path always has one
        raise OSError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _cgroup_entry() -> ModuleType:
    return _load("cgroup_entry", "cgroup_entry.py")


def _fence() -> ModuleType:
    return _load("fence", os.pardir, os.pardir, "fence.py")


def wait_and_record(
    child: int, exit_log: str, run_id: str, worker: str, generation: int | None = None
) -> int:
    """Wait for the job ``child``, append its exit record, and return the status this
    launcher exits with (the job's code, or 128 + the signal that ended it). A job fenced
    by a newer generation than ``generation`` (None: the file's now) is killed with its
    group, this launcher included, once recorded."""
    fences = _fence()
    fence = fences.Fence(Path(exit_log).absolute().parent / fences.GENERATION_FILE, generation)
    status, fenced = _wait(child, fence)
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    exit_code = code if code >= 0 else None
    reason = REASON_FENCED if fenced else REASON_EXITED
    append_exit(exit_log, ExitRecord(run_id, worker, os.getpid(), exit_code, sig, reason, time.time()))
    if fenced and os.getpgrp() == os.getpid():  # what the job started goes with it
        os.killpg(os.getpid(), signal.SIGKILL)
    return code if code >= 0 else 128 + (sig or 0)


def _wait(child: int, fence: Fence) -> tuple[int, bool]:
    """The job's wait status, and whether it was fenced (killed for a newer generation than
    ``fence``'s, a ``specon.fence.Fence``; a run started outside a fencing runtime, own
    generation 0, never is)."""
    try:
        pidfd: int | None = os.pidfd_open(child)
    except OSError:  # a kernel before 5.3: look every tenth of a second instead
        pidfd = None
    try:
        while True:
            if pidfd is None:
                time.sleep(0.1)
            else:
                select.select([pidfd], [], [], FENCE_POLL_S)
            pid, status = os.waitpid(child, os.WNOHANG)  # retried on EINTR (PEP 475)
            if pid:
                return status, False
            if fence.own and fence.stale():
                os.kill(child, signal.SIGKILL)
                return os.waitpid(child, 0)[1], True
    finally:
        if pidfd is not None:
            os.close(pidfd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
