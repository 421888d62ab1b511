"""Starting a job in a fresh interpreter: ``launcher.py`` by path, in a session of its own,
which joins the worker's budget itself and says so before the job runs (why not in a
``preexec_fn``: ``specon.runtime.local.launcher``). The children of this OS process are
kept and reaped here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from specon import checkpoint as ckpt
from specon.runtime.local.cgroup_entry import Entry
from specon.runtime.local.launcher import READY, launcher_argv, read_ready

LAUNCH_TIMEOUT_S = 30.0  # a launcher's interpreter start-up, on a loaded host

# Children of *this OS process*, by pid. Reaping is per process, not per runtime: a second
# LocalRuntime in the same process (an agent restart in tests, a LocalCluster) reaps the
# first one's children, and no Popen is garbage-collected while its job still runs.
_children: dict[int, subprocess.Popen[bytes]] = {}


def reap() -> None:
    """Reap the children that ended (an exited child stays a zombie, its /proc entry, until then)."""
    for pid, child in list(_children.items()):
        if child.poll() is not None:
            del _children[pid]


class LaunchError(Exception):
    """Nothing runs: the launcher could not be started, or was SIGKILLed before the job."""


async def launch(
    command: Sequence[str],
    *,
    exits: Path,
    run_id: str,
    worker: str,
    entry: Entry,
    cwd: Path,
    env: Mapping[str, str],
    stdout: Path,
    stderr: Path,
) -> int:
    """Start ``command`` under a launcher recording its exit in ``exits`` as ``run_id`` of
    ``worker``, in ``entry``'s cgroups and CPUs; the launcher's pid once it is in them."""
    ready, tell = os.pipe2(os.O_CLOEXEC)
    try:
        argv = launcher_argv(sys.executable, exits, run_id, worker, entry=entry.to_json(), ready=tell)
        # Never through a symlink or into a FIFO planted in the job's directory.
        with _append(stdout) as out, _append(stderr) as err:
            child = subprocess.Popen(
                [*argv, *command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # survives the agent; a process group to signal
                pass_fds=(tell,),
                close_fds=True,
            )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(ready)
        raise LaunchError(str(exc)) from exc
    finally:
        os.close(tell)
    _children[child.pid] = child
    try:  # a fresh interpreter's start-up: off the event loop
        told = await asyncio.to_thread(read_ready, ready, LAUNCH_TIMEOUT_S)
    finally:
        os.close(ready)
    if told != READY:
        with contextlib.suppress(OSError):  # it has not forked the job: its group is itself
            os.killpg(child.pid, signal.SIGKILL)
        if told is None:
            raise LaunchError(f"its launcher did not join the budget within {LAUNCH_TIMEOUT_S:.0f} s")
        raise LaunchError(told.decode(errors="replace") or "its launcher ended before it joined the budget")
    return child.pid


def _append(path: Path) -> BinaryIO:
    return os.fdopen(ckpt.open_regular(path, ckpt.APPEND_FLAGS), "ab")
