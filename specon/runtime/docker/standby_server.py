"""A standby container's main process: primes torch, then becomes ONE job in place (run by
``specon.runtime.docker.standby_pool`` as the container's command; see ``standby``).

Two processes, as the local standby (``specon.runtime.local.standby``), whose priming it uses:

- the *keeper*, the container's main process, forks the standby before anything heavy is
  imported (CUDA does not survive ``fork``), forwards every signal the engine sends it
  (``docker kill``, ``docker stop``) to the standby's process group, which becomes the job's,
  and exits with the job's status: the container's exit code is the job's, as in a cold
  container. As PID 1 it also reaps orphans.
- the *standby* primes (``prime``: imports, one matmul, convolution, GRU and Adam step, on the
  GPU the container holds, else the CPU), then connects to the agent's socket (its directory
  is bound read-only: nothing there is writable for the job it becomes), says it is ready and
  waits. The one message it gets is a ``HandOver`` carrying the job's directory as a file
  descriptor (a detached mount: ``..`` stays inside); it ``fchdir``s into it, answers its pid
  and runs ``python -m MODULE ARGS`` in place with the standby's environment and the job's
  (``zygote.run_job``). Only its ``--module`` runs: a request names a module, never a program.
  A request it refuses ends it (exit 1), and so does the end of the agent's connection (exit
  0): the agent starts a fresh standby either way, and an idle one never outlives its agent.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import os
import signal
import socket
import stat
import sys
import time
import traceback
from types import FrameType

from specon.runtime.docker.standby import HandOver
from specon.runtime.local.cgroup_entry import Entry
from specon.runtime.local.standby import add_standby_arguments, with_standby_defaults
from specon.runtime.local.zygote import (
    MAX_REQUEST,
    Request,
    run_job,
    set_comm,
)

_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
# The agent's listener exists before the container starts; a few tries cover a slow mount.
_CONNECT_TRIES = 20


class HandOverError(Exception):
    """The request was refused (the standby exits)."""


def _receive(conn: socket.socket) -> tuple[bytes, list[int]]:
    """One newline-ended message and the descriptors that came with it (b"" at EOF)."""
    buf, fds = b"", array.array("i")
    while not buf.endswith(b"\n"):
        data, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(4 * fds.itemsize))
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        if not data:
            break
        buf += data
        if len(buf) > MAX_REQUEST:
            break
    return buf, list(fds)


def _answer(conn: socket.socket, reply: dict[str, object]) -> bool:
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        return False
    return True


def take(raw: bytes, fds: list[int], allowed: frozenset[str]) -> HandOver:
    """Check a request and enter the job's directory; ``HandOverError`` saying why not. The
    descriptors are closed either way."""
    try:
        req = HandOver.decode(raw)
        if req.module not in allowed:
            raise HandOverError(f"module {req.module!r} is not one this standby runs")
        if len(fds) != 1:
            raise HandOverError(f"expected the job's directory as one descriptor, got {len(fds)}")
        if not stat.S_ISDIR(os.fstat(fds[0]).st_mode):
            raise HandOverError("the descriptor is not a directory")
        os.fchdir(fds[0])
        return req
    except (OSError, ValueError) as exc:
        raise HandOverError(str(exc)) from exc
    finally:
        for fd in fds:
            os.close(fd)


def _connect(path: str) -> socket.socket | None:
    for _ in range(_CONNECT_TRIES):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            time.sleep(0.25)
    return None


def _standby(args: argparse.Namespace) -> int:
    """Prime, wait for the agent's one request, then be that job."""
    from specon.runtime.local.standby import prime  # noqa: PLC0415 - after the fork, never in the keeper

    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    set_comm(f"sp-standby-g{args.gpu}")
    base_env = dict(os.environ)
    t0 = time.monotonic()
    device = prime(args.preload, torch_ops=args.prime)
    took = time.monotonic() - t0
    print(f"specon.standby: GPU {args.gpu}: primed on {device} in {took:.2f} s", flush=True)
    conn = _connect(args.socket)
    if conn is None:
        print(f"specon.standby: no agent at {args.socket}: exiting", flush=True)
        return 0
    with conn:
        if not _answer(conn, {"ready": True, "device": device, "primed_s": round(took, 3)}):
            return 0
        raw, fds = _receive(conn)
        if not raw:
            for fd in fds:
                os.close(fd)
            print("specon.standby: the agent is gone: exiting", flush=True)
            return 0
        try:
            req = take(raw, fds, frozenset(args.module))
        except HandOverError as exc:
            _answer(conn, {"error": str(exc)})
            return 1
        if not _answer(conn, {"pid": os.getpid()}):
            return 1  # the agent did not hear it: it removes this container, nothing may run
    env = base_env | req.env
    # sys.path[0] "" (not "."): importlib skips it when the working directory has no path
    # from the root (a detached mount), where "." would fail every later import.
    job = Request(req.module, req.args, "", env, "", "", "", req.run_id, req.worker, Entry())
    return run_job(job)


def _keep(child: int) -> int:
    """Forward signals to the standby's group; its exit status once it ends."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signum)

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # also reaps orphans: we may be PID 1
        except ChildProcessError:
            return 1
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="specon.runtime.docker.standby_server",
        description="A standby container: primes torch, then becomes the job a Docker agent hands it.",
    )
    p.add_argument("socket", help="the agent's unix socket, to connect to once primed")
    add_standby_arguments(p)
    args = with_standby_defaults(p.parse_args(argv))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.setpgid(0, 0)  # the group the keeper signals: the job and what it starts
            code = _standby(args)
        except BaseException:  # the standby must never return into the keeper's code
            with contextlib.suppress(Exception):
                traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    with contextlib.suppress(OSError):  # the child may have done it already
        os.setpgid(child, child)
    set_comm(f"sp-keeper-g{args.gpu}")
    return _keep(child)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
