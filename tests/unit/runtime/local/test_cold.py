"""A cold launch: the launcher joins the worker's budget itself before the job runs, says so,
and a launcher stuck in that set-up holds none of the agent's descriptors and is killed."""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

import pytest

from specon.runtime.local import cold
from specon.runtime.local.cgroup_entry import Entry
from specon.runtime.local.launcher import find_launcher

# The job: what the budget file held when it started (the launcher joined before it).
JOB = "import pathlib, sys; pathlib.Path('ran').write_text(pathlib.Path(sys.argv[1]).read_text())"


async def _launch(tmp_path: Path, entry: Entry, run_id: str = "run-1") -> int:
    return await cold.launch(
        [sys.executable, "-c", JOB, str(tmp_path / "procs")],
        exits=tmp_path / "exits.jsonl",
        run_id=run_id,
        worker="w0",
        entry=entry,
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "")},
        stdout=tmp_path / "stdout",
        stderr=tmp_path / "stderr",
    )


def _wait_for(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


async def test_the_launcher_joins_the_budget_before_the_job_runs(tmp_path: Path) -> None:
    procs = tmp_path / "procs"
    procs.write_text("")
    await _launch(tmp_path, Entry(((str(procs), None),)))
    _wait_for(tmp_path / "ran")
    assert (tmp_path / "ran").read_text() == "0"  # written into before the job read it


async def test_a_budget_it_cannot_join_fails_the_launch_and_runs_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "cgroup.procs"
    with pytest.raises(cold.LaunchError, match="cannot join the worker's budget"):
        await _launch(tmp_path, Entry(((str(missing), None),)))
    await asyncio.sleep(0.5)
    assert not (tmp_path / "ran").exists()


async def test_a_launcher_stuck_joining_holds_no_lock_or_socket_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Opening a FIFO for writing blocks until a reader comes: a set-up that never ends. A
    # child that inherited the agent's descriptors would keep the job's flock and the agent's
    # listening socket for as long (an agent that cannot come back, a job no host can start).
    monkeypatch.setattr(cold, "LAUNCH_TIMEOUT_S", 5.0)
    fifo = tmp_path / "cgroup.procs"
    os.mkfifo(fifo)
    lock = os.open(tmp_path / "owner.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    fcntl.flock(lock, fcntl.LOCK_EX)
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    launch = asyncio.create_task(_launch(tmp_path, Entry(((str(fifo), None),)), run_id="run-stuck"))
    deadline = time.monotonic() + 60
    while (pid := find_launcher("run-stuck")) is None:
        assert time.monotonic() < deadline and not launch.done(), "no launcher started"
        await asyncio.sleep(0.05)
    os.close(lock)
    listening.close()
    again = os.open(tmp_path / "owner.lock", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError if the launcher held it
    finally:
        os.close(again)
    socket.create_server(("127.0.0.1", port)).close()  # EADDRINUSE if the launcher held it
    with pytest.raises(cold.LaunchError, match="did not join the budget within 5 s"):
        await launch
    while os.path.exists(f"/proc/{pid}"):  # SIGKILLed: gone once reaped
        assert time.monotonic() < deadline, "the stuck launcher still runs"
        cold.reap()
        await asyncio.sleep(0.05)
    assert not (tmp_path / "ran").exists()
