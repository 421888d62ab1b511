"""Process helpers for the daemon benchmarks: CPU time and RSS from /proc, pinning, leftovers,
quiet logs."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import structlog

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the preexec hook only calls it


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (None if it is gone)."""
    try:
        # The command name (field 2) may hold spaces: split after its closing parenthesis.
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` (None if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pinned_child(cpu: int | None) -> Callable[[], None]:
    """A ``preexec_fn``: pin the child to ``cpu`` (if given) and SIGTERM it when we die.

    The parent-death signal is what cleans up after a benchmark killed with SIGKILL, when
    no ``finally`` runs.
    """

    def setup() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    return setup


def processes_mentioning(text: str) -> list[int]:
    """Pids of processes (other than ours) whose command line contains ``text``."""
    needle = text.encode()
    found = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if needle in Path(f"/proc/{name}/cmdline").read_bytes():
                    found.append(int(name))
    return found


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """Only errors from this process's own runtime (a line per job started and stopped otherwise)."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    try:
        yield
    finally:
        structlog.configure(**old)
