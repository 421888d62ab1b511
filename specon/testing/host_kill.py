"""A network host of the embedded cluster dying, for tests and benchmarks: everything it runs
SIGKILLed at once, as a machine that dies takes it, with no save and no goodbye.

``kill_host(c, worker, host)`` kills every process in ``host``'s network namespace
(``specon.testing.net_hosts``) and every process below them, again until none is left: on the
local runtime the worker's agent, its launchers and its jobs; on a Docker host also its
engine, containerd, the shims and the containers' processes (which have a network namespace of
their own, ``network_mode: none``, but descend from the host's shims). It reaps the agent and
the engine it killed. ``in_image`` makes a job of the host-Python image import specon from the
repository the image binds, as a job on such a host's engine must.

Shared by ``tests/integration/test_recovery_hosts.py``, ``test_recovery_docker_hosts.py`` and
``bench/bench_recovery.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import replace

from specon.embedded.cluster import EmbeddedCluster
from specon.embedded.host_image import REPO
from specon.model import WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.local.procfs import all_stats, process_alive
from specon.testing.net_hosts import NetHost

KILL_TIMEOUT = 10.0  # every process of a host gone within this, or the kill failed


def pids_in(host: NetHost) -> list[int]:
    """The processes in ``host``'s network namespace (``ip netns pids``)."""
    out = subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def descendants(roots: set[int]) -> set[int]:
    """``roots`` and every live process below them, from /proc."""
    parent = {st.pid: st.ppid for st in all_stats()}
    out, grew = set(roots), True
    while grew:
        below = {pid for pid, ppid in parent.items() if ppid in out} - out
        out |= below
        grew = bool(below)
    return out


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    return process_alive(pid, None)


def kill_host(c: EmbeddedCluster, worker: WorkerId, host: NetHost) -> set[int]:
    """SIGKILL everything ``worker``'s host (``host``) runs, again until nothing is left: the
    processes in its network namespace and what they started; reap its agent and, on the
    Docker runtime, its engine. The pids killed; ``RuntimeError`` if some outlive
    ``KILL_TIMEOUT``."""
    killed: set[int] = set()
    deadline = time.monotonic() + KILL_TIMEOUT
    while alive := {p for p in descendants(set(pids_in(host))) | killed if running(p)}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes left of {worker}'s host: {sorted(alive)}")
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= alive
        time.sleep(0.05)
    c.agents[worker].proc.wait(timeout=KILL_TIMEOUT)
    if c.docker is not None:
        c.docker.hosts[worker].process.wait(timeout=KILL_TIMEOUT)
    return killed


def in_image(job: JobSpec) -> JobSpec:
    """``job`` importing specon from the repository the host-Python image binds (``REPO``):
    the virtual environment's editable install may name another checkout, which a container
    does not see (a worktree's tests run with the main checkout's environment)."""
    return replace(job, env=(*job.env, ("PYTHONPATH", str(REPO))))
