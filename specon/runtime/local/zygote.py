"""The warm interpreter: one long-lived Python per worker that has imported the training
stack once and forks each job from there (``python -m specon.runtime.local.zygote SOCKET``).

A cold local job pays its imports on every start: torch and the modules its optimizer
imports lazily are about 2 CPU-seconds here, 4 s of a 0.5-CPU worker's budget, on every
restore of a moved job. The warm interpreter imports what the allowed module needs
(``--preload``; by default the built-in workloads, ``specon.workloads``, and torch with
them) once, then, per request, forks a *launcher* that does what
``specon.runtime.local.launcher`` does for a cold job: its own session (a process group the
runtime signals), the worker's cgroups and CPUs (the ``Entry`` the runtime computed), the
job's output files, working directory and environment; it forks the job, which runs
``python -m MODULE ARGS`` in place with ``runpy`` (its imports already done), waits for it
and appends the exit record. Only the allowed modules run: a request names a module,
never a program.

Protocol: the runtime connects to the unix socket (in a directory only its user can enter),
sends one JSON object and a newline, and reads back ``{"pid": N}`` (the launcher's pid, the
job's process group) once the launcher is in its cgroups with its files open, or
``{"error": "..."}`` (nothing runs then). The server exits when its parent does.

Fork safety: the server is single-threaded (torch starts no thread at import with
``OMP_NUM_THREADS=1``) and never trains, so its children inherit no held lock.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import importlib
import json
import os
import random
import runpy
import shutil
import signal
import socket
import sys
import traceback
from dataclasses import dataclass

from specon import checkpoint as ckpt
from specon.fence import env_generation
from specon.runtime.local.cgroup_entry import Entry, enter
from specon.runtime.local.launcher import (
    fork_job,
    ignore_job_signals,
    wait_and_record,
    warm_comm,
)

# The built-in workloads: the module a request may name, and what to import ahead for it.
WORKLOADS_MODULE = "specon.workloads"
# torch._dynamo: every torch optimizer imports it lazily on creation (1.2 CPU-s here).
WORKLOADS_PRELOAD = ("specon.workloads.runner", "torch._dynamo")
MAX_REQUEST = 1 << 20
_PR_SET_NAME = 15
# Short enough to notice a dead parent soon.
_ACCEPT_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class Request:
    """One job to fork: ``python -m module *args`` as ``run_id`` on ``worker``."""

    module: str
    args: tuple[str, ...]
    cwd: str
    env: dict[str, str]
    stdout: str
    stderr: str
    exits: str
    run_id: str
    worker: str
    entry: Entry

    def encode(self) -> bytes:
        data = {
            "module": self.module,
            "args": list(self.args),
            "cwd": self.cwd,
            "env": self.env,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exits": self.exits,
            "run_id": self.run_id,
            "worker": self.worker,
            "entry": self.entry.to_json(),
        }
        return json.dumps(data).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes) -> Request:
        """Parse one request; ``ValueError`` saying what is wrong."""
        try:
            d = json.loads(raw)
            return cls(
                module=str(d["module"]),
                args=tuple(str(a) for a in d["args"]),
                cwd=str(d["cwd"]),
                env={str(k): str(v) for k, v in d["env"].items()},
                stdout=str(d["stdout"]),
                stderr=str(d["stderr"]),
                exits=str(d["exits"]),
                run_id=str(d["run_id"]),
                worker=str(d["worker"]),
                entry=Entry.from_json(d["entry"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"bad request: {exc!r}") from exc


def set_comm(name: str) -> None:
    """This process's name (``/proc/PID/comm``, 15 bytes kept); silently unchanged where
    ``prctl`` is missing."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def open_append(path: str) -> int:
    """A descriptor appending to the job's output file ``path``."""
    # Never through a symlink or into a FIFO planted in the job's directory (as the runtime).
    return ckpt.open_regular(path, ckpt.APPEND_FLAGS)


def run_job(req: Request) -> int:
    """In the job's process: ``python -m module args`` with the imports already done (here
    after a fork, in the GPU standby in place); the exit status."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    set_comm(os.path.basename(sys.executable)[:15])
    os.environ.clear()
    os.environ.update(req.env)
    random.seed()  # a fresh interpreter's generators are seeded from the OS, not shared
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    sys.path[0] = req.cwd  # what ``python -m`` puts first
    sys.argv = [req.module, *req.args]
    try:
        runpy.run_module(req.module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        c = exc.code
        code = c if isinstance(c, int) else (0 if c is None else 1)
        if not isinstance(c, int) and c is not None:
            print(c, file=sys.stderr)
    except BaseException:  # the job's own failure: report it as Python would
        traceback.print_exc()
        code = 1
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # what the interpreter's exit would run (the job's handlers)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _setup(req: Request) -> None:
    """The launcher's set-up, which a cold launch does with ``Popen`` and ``launcher.main``:
    its own session and group, the worker's cgroups and CPUs, the job's files and directory."""
    os.setsid()
    ignore_job_signals()  # it outlives the job's SIGTERM to record the exit, as the cold one
    take_place(req)


def take_place(req: Request) -> None:
    """Become ``req``'s launcher where it stands: the run's name (``warm_comm``, which
    ``find_launcher`` looks for), the worker's cgroups and CPUs, the job's files and
    directory (also the GPU standby's keeper, ``specon.runtime.local.standby``)."""
    set_comm(warm_comm(req.run_id))
    enter(req.entry)
    null = os.open(os.devnull, os.O_RDONLY)
    out, err = open_append(req.stdout), open_append(req.stderr)
    os.chdir(req.cwd)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    for fd in (null, out, err):
        os.close(fd)


def _launcher(req: Request, ready: int) -> int:
    """In the forked launcher: set up (reporting the outcome on ``ready``), fork the job,
    wait for it, record its exit."""
    try:
        _setup(req)
    except BaseException as exc:  # reported to the runtime, which then starts nothing
        os.write(ready, f"cannot set up the job's process: {exc}".encode())
        return 1
    os.write(ready, b"ok")
    os.closerange(3, 1 << 16)  # the server's socket, the pipe: nothing leaks into the job
    child = fork_job()
    if child == 0:
        os._exit(run_job(req))
    return wait_and_record(child, req.exits, req.run_id, req.worker, env_generation(req.env))


def _fork(req: Request) -> int:
    """Fork a launcher for ``req``; its pid once it is set up (``OSError`` saying why not,
    the launcher gone)."""
    sys.stdout.flush()
    sys.stderr.flush()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            code = _launcher(req, w)
        except BaseException:  # a launcher must never return into the server's loop
            with contextlib.suppress(Exception):
                traceback.print_exc()
        os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        outcome = f.read(4096)
    if outcome != b"ok":
        os.waitpid(pid, 0)
        raise OSError(outcome.decode(errors="replace") or "the launcher died while setting up")
    return pid


def read_line(conn: socket.socket) -> bytes:
    """One newline-ended message (either side of the protocol); ``ValueError`` past 1 MiB."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ValueError(f"request over {MAX_REQUEST} bytes")
    return buf


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _serve_one(conn: socket.socket, modules: frozenset[str]) -> None:
    with conn:
        conn.settimeout(10.0)
        pid = None
        try:
            req = Request.decode(read_line(conn))
            if req.module not in modules:
                raise ValueError(f"module {req.module!r} is not one this interpreter runs")
            pid = _fork(req)
            reply: dict[str, object] = {"pid": pid}
        except (OSError, ValueError) as exc:
            reply = {"error": str(exc)}
        try:
            conn.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            if pid is not None:  # nobody will record this run: it must not run unrecorded
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)


def listen_ready(path: str, *, backlog: int, timeout: float) -> socket.socket:
    """Listen on ``path``, which appears only once it accepts: a socket that exists is ready
    (bound in place, it refused connections until ``listen``, and a launch went cold)."""
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(tmp)
    os.chmod(tmp, 0o600)
    srv.listen(backlog)
    os.replace(tmp, path)
    srv.settimeout(timeout)
    return srv


def serve(path: str, modules: tuple[str, ...], preload: tuple[str, ...], parent: int | None = None) -> int:
    """Serve until the parent (``parent``, else whoever started us) is gone."""
    parent = os.getppid() if parent is None else parent
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    for m in preload:  # the point of it all: the imports every job would pay, paid once
        importlib.import_module(m)
    srv = listen_ready(path, backlog=16, timeout=_ACCEPT_TIMEOUT_S)
    allowed = frozenset(modules)
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        _serve_one(conn, allowed)
    srv.close()
    # The runtime that made our private directory is gone and cannot remove it: we do.
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specon.runtime.local.zygote",
        description="A warm interpreter: imports once, forks each job a local runtime asks for.",
    )
    p.add_argument("socket", help="unix socket to serve (its directory only its user can enter)")
    p.add_argument(
        "--module", action="append", help=f"a module requests may run (default {WORKLOADS_MODULE})"
    )
    p.add_argument("--preload", action="append", help="a module to import ahead (default: the workloads')")
    p.add_argument("--parent", type=int, help="exit when this process is no longer our parent")
    args = p.parse_args(argv)
    modules = tuple(args.module or (WORKLOADS_MODULE,))
    preload = tuple(args.preload or (WORKLOADS_PRELOAD if modules == (WORKLOADS_MODULE,) else ()))
    return serve(args.socket, modules, preload, args.parent)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
