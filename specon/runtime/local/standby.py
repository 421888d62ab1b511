"""A GPU standby: a primed interpreter, one per GPU, that becomes ONE job in place (started by
``specon.runtime.local.standby_pool`` as ``python -c ... SOCKET --gpu N``).

CUDA does not survive ``fork``, so the warm interpreter (``specon.runtime.local.zygote``),
which forks its jobs, cannot hand a GPU job a ready CUDA context. A restored GPU job started
cold spends 10-16 s before its first step (importing torch, building the model and optimizer,
which imports ``torch._dynamo``, initialising CUDA); one handed to a process that did all of
that beforehand, 0.10-2.99 s (docs/INFRA.md, "GPU").

Two processes in one session, the process group the runtime signals as any local job's:

- the *keeper*, which the pool starts in a session of its own, forks the standby before
  anything heavy is imported (CUDA is initialised only after the fork, in the child, where
  that is safe) and waits. At the hand-over it becomes the job's launcher where it stands
  (``zygote.take_place``: the run's process name, the job's cgroups, files and directory),
  waits for the job and appends its exit record (``launcher.wait_and_record``). A job that
  was never forked has no launcher to wait for it otherwise: the job is the standby itself,
  and its parent is the one process that can learn how it ended. The owner record names the
  keeper, whose pid is the group's.
- the *standby* imports torch and what the allowed module needs (``--preload``), initialises
  CUDA, runs one matmul, convolution and GRU step and one Adam step on the device (on the CPU
  where there is no CUDA: this machine, CI), then serves a unix socket (in a directory only
  this user can enter) for one job. On a request it enters the job's cgroups, hands the keeper
  its part, takes the job's files and directory, answers ``{"pid": KEEPER}`` and runs
  ``python -m MODULE ARGS`` in place (``zygote.run_job``: only the job's environment).

Protocol: the warm interpreter's (``zygote.Request``, one JSON line each way; the modules it
runs are its own arguments, never the request's). A refusal says whether the standby is
``spent``: an unreadable request, a module it does not run or job files it cannot open leave
it serving; a set-up that fails after it entered the job's cgroups spends it (it exits, and
the pool starts a fresh one). An answer that cannot be delivered kills the group: nobody would
record the run.

Lifetimes: before a hand-over the keeper exits (killing the standby and removing the pool's
directory) once the runtime that started it is gone, and the standby once its keeper is;
after it the pair is the job, detached from the agent like any local job.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import select
import shutil
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence

from specon.fence import env_generation
from specon.runtime.local.cgroup_entry import enter
from specon.runtime.local.launcher import fork_job, ignore_job_signals, wait_and_record
from specon.runtime.local.zygote import (
    MAX_REQUEST,
    WORKLOADS_MODULE,
    WORKLOADS_PRELOAD,
    Request,
    listen_ready,
    open_append,
    read_line,
    run_job,
    set_comm,
    take_place,
)

# Short enough to notice a dead parent (runtime or keeper) soon.
_POLL_S = 1.0
_REQUEST_TIMEOUT_S = 10.0
_DEVICE_ENV = "CUDA_VISIBLE_DEVICES"


class _SpentError(Exception):
    """The hand-over failed after the standby entered the job's cgroups: it exits."""


def prime(preload: Sequence[str], *, torch_ops: bool = True) -> str:
    """Import ``preload`` and, with ``torch_ops``, warm torch up on the device as measured
    (CUDA initialised; one matmul, convolution, GRU step and Adam step, which imports
    ``torch._dynamo``); the device primed: ``"cuda"``, ``"cpu"`` (no CUDA) or ``"none"``.

    Torch's global generators are reseeded as a fresh interpreter finds them, so a job starts
    from the same random state here as cold."""
    for module in preload:
        importlib.import_module(module)
    if not torch_ops:
        return "none"
    import torch  # noqa: PLC0415 - the standby's whole point; the keeper never imports it

    importlib.import_module("torch._dynamo")  # every optimizer imports it on creation
    seed = torch.initial_seed()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(device)
    gru = torch.nn.GRU(8, 16, batch_first=True).to(device)
    opt = torch.optim.Adam([*conv.parameters(), *gru.parameters()], lr=1e-3)
    x = torch.randn(64, 64, device=device)
    seq, _ = gru(torch.randn(4, 5, 8, device=device))
    loss = (x @ x).mean() + conv(torch.randn(2, 3, 16, 16, device=device)).mean() + seq.mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    del conv, gru, opt, x, seq, loss
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    torch.manual_seed(seed)  # also every CUDA device's
    return device.type


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pin_threads(cpus: Sequence[int]) -> None:
    """Pin every thread, not only the calling one (``sched_setaffinity`` is per thread): torch
    and CUDA started threads while priming, unlike a fresh process."""
    with contextlib.suppress(OSError):
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), cpus)


def _open_files(req: Request) -> tuple[int, int, int]:
    """The job's stdin (null), stdout and stderr, opened before anything changes."""
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        out = open_append(req.stdout)
        try:
            return null, out, open_append(req.stderr)
        except OSError:
            os.close(out)
            raise
    except OSError:
        os.close(null)
        raise


def _hand_over(req: Request, files: tuple[int, int, int], ctl: int, ack: int) -> None:
    """Become the job's process: its cgroups and CPUs, the keeper as its launcher (which
    answers on ``ack``), its directory and files. ``OSError`` saying what failed."""
    try:
        enter(req.entry)
        if req.entry.affinity:
            _pin_threads(req.entry.affinity)
        os.chdir(req.cwd)
        _write_all(ctl, req.encode())  # the keeper's part last: once it says ok, it records the run
        answer = os.read(ack, 4096)
        if answer != b"ok":
            raise OSError(answer.decode(errors="replace") or "the keeper is gone")
        sys.stdout.flush()  # what priming printed stays in the standby's log
        sys.stderr.flush()
        for target, fd in enumerate(files):
            os.dup2(fd, target)
    finally:
        for fd in files:
            os.close(fd)


def _answer(conn: socket.socket, reply: dict[str, object]) -> bool:
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        return False
    return True


def _serve_one(
    conn: socket.socket, allowed: frozenset[str], keeper: int, ctl: int, ack: int
) -> Request | None:
    """Answer one connection; the request handed over, None when refused (still serving)."""
    with conn:
        conn.settimeout(_REQUEST_TIMEOUT_S)
        try:
            req = Request.decode(read_line(conn))
            if req.module not in allowed:
                raise ValueError(f"module {req.module!r} is not one this standby runs")
            files = _open_files(req)
        except (OSError, ValueError) as exc:
            _answer(conn, {"error": str(exc), "spent": False})
            return None
        try:
            _hand_over(req, files, ctl, ack)
        except OSError as exc:
            _answer(conn, {"error": f"cannot set up the job's process: {exc}", "spent": True})
            raise _SpentError(str(exc)) from exc
        if not _answer(conn, {"pid": keeper}):
            os.killpg(keeper, signal.SIGKILL)  # nobody will record this run: it must not run unrecorded
        return req


def _standby(args: argparse.Namespace, keeper: int, ctl: int, ack: int) -> int:
    """The standby: prime, serve until one job is handed over, then be that job (its
    signals at their defaults since ``fork_job``)."""
    set_comm(f"sp-standby-g{args.gpu}")
    t0 = time.monotonic()
    device = prime(args.preload, torch_ops=args.prime)
    took = time.monotonic() - t0
    print(
        f"specon.standby: GPU {args.gpu} ({_DEVICE_ENV}={os.environ.get(_DEVICE_ENV)}): primed on {device}"
        f" in {took:.2f} s",
        flush=True,
    )
    srv = listen_ready(args.socket, backlog=4, timeout=_POLL_S)
    req = None
    try:
        while req is None and os.getppid() == keeper:
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            req = _serve_one(conn, frozenset(args.module), keeper, ctl, ack)
    except _SpentError:
        return 1
    finally:
        srv.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(args.socket)  # never connected to again: the pool starts a fresh one
    if req is None:
        return 0  # the keeper is gone: nobody would record a job
    os.close(ctl)
    os.close(ack)
    return run_job(req)


def _keep(args: argparse.Namespace, standby: int, parent: int, ctl: int, ack: int) -> int:
    """The keeper: wait for the standby's hand-over, then be the job's launcher."""
    with os.fdopen(ctl, "rb") as lines:
        while not select.select([lines], [], [], _POLL_S)[0]:
            if os.getppid() != parent:  # the runtime is gone: nothing may start any more
                os.kill(standby, signal.SIGKILL)
                os.waitpid(standby, 0)
                # The runtime that made our private directory cannot remove it now: we do.
                shutil.rmtree(os.path.dirname(args.socket), ignore_errors=True)
                return 0
        line = lines.readline(MAX_REQUEST + 1)
    if not line:  # the standby ended without a job (it failed to prime, or was spent)
        os.waitpid(standby, 0)
        return 0
    try:
        req = Request.decode(line)
        take_place(req)
    except (OSError, ValueError) as exc:
        with contextlib.suppress(OSError):  # the standby gone meanwhile: it ends either way
            _write_all(ack, f"the keeper cannot become the launcher: {exc}".encode())
        os.waitpid(standby, 0)
        return 1
    with contextlib.suppress(OSError):  # the standby gone meanwhile: its end is recorded below
        _write_all(ack, b"ok")
    os.close(ack)
    return wait_and_record(standby, req.exits, req.run_id, req.worker, env_generation(req.env))


def add_standby_arguments(p: argparse.ArgumentParser) -> None:
    """The options of every standby server (this one, and a Docker standby container's)."""
    p.add_argument("--gpu", type=int, default=0, help="the GPU it stands by for (names and logs only)")
    p.add_argument(
        "--module", action="append", help=f"a module requests may run (default {WORKLOADS_MODULE})"
    )
    p.add_argument("--preload", action="append", help="a module to import ahead (default: the workloads')")
    p.add_argument("--no-prime", dest="prime", action="store_false", help="import only: no torch warm-up")


def with_standby_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with the allowed modules and the preloads defaulted (the built-in workloads')."""
    args.module = tuple(args.module or (WORKLOADS_MODULE,))
    default = WORKLOADS_PRELOAD if args.module == (WORKLOADS_MODULE,) else ()
    args.preload = tuple(args.preload or default)
    return args


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m specon.runtime.local.standby",
        description="A GPU standby: primes torch on one GPU, then becomes the job a local runtime hands it.",
    )
    p.add_argument("socket", help="unix socket to serve (its directory only its user can enter)")
    add_standby_arguments(p)
    p.add_argument("--parent", type=int, help="exit when this process is no longer our parent")
    args = with_standby_defaults(p.parse_args(argv))
    parent = os.getppid() if args.parent is None else args.parent
    ignore_job_signals()  # the keeper outlives the job's SIGTERM to record the exit
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    ctl_r, ctl_w = os.pipe()
    ack_r, ack_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    keeper = os.getpid()
    child = fork_job()
    if child == 0:
        code = 1
        try:
            os.close(ctl_r)
            os.close(ack_w)
            code = _standby(args, keeper, ctl_w, ack_r)
        except BaseException:  # the standby must never return into the keeper's code
            with contextlib.suppress(Exception):
                traceback.print_exc()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    os.close(ctl_w)
    os.close(ack_r)
    set_comm(f"sp-keeper-g{args.gpu}")
    return _keep(args, child, parent, ctl_r, ack_w)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
