"""The pieces of a network host dying that need no host: the process tree, a zombie, a job's
environment in the host-Python image (``kill_host`` itself runs in the recovery tests on
network hosts, tests/integration/test_recovery_hosts.py and test_recovery_docker_hosts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from specon.embedded.host_image import REPO
from specon.model import ContainerId
from specon.runtime.base import JobSpec
from specon.testing.host_kill import descendants, in_image, running


def test_descendants_are_the_roots_and_every_process_below_them() -> None:
    shell = subprocess.Popen(["sh", "-c", "sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert shell.stdout is not None
        grandchild = int(shell.stdout.readline())
        assert {shell.pid, grandchild} <= descendants({shell.pid})
        assert {os.getpid(), shell.pid, grandchild} <= descendants({os.getpid()})
        assert os.getpid() not in descendants({shell.pid})
        os.kill(grandchild, signal.SIGKILL)
    finally:
        shell.kill()
        shell.wait()


def test_a_zombie_or_a_pid_that_is_gone_is_not_running() -> None:
    child = subprocess.Popen(["sleep", "30"])
    assert running(child.pid)
    child.kill()
    deadline = time.monotonic() + 10
    while running(child.pid):  # a zombie until reaped: not running
        assert time.monotonic() < deadline
        time.sleep(0.01)
    child.wait()
    assert not running(child.pid)


def test_in_image_puts_the_repository_the_image_binds_on_the_jobs_path() -> None:
    job = JobSpec(id=ContainerId("j"), command=("python", "train.py"), env=(("A", "1"),))
    assert in_image(job).env == (("A", "1"), ("PYTHONPATH", str(REPO)))
    assert in_image(job).command == job.command
