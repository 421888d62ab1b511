"""``specon-agent --taints-file``: the taints a host announces, re-read when the file changes,
bad lines skipped and counted, and reported in every heartbeat."""

from __future__ import annotations

import os
from pathlib import Path

from specon_agent.core import Agent
from specon_agent.taints_file import TaintsFile

from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume
from tests.unit.manager_fakes import policy

NOTICE = "specon.io/evacuate:NoSchedule"


def test_taints_are_read_when_the_file_changes_and_bad_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "taints"
    f = TaintsFile(path)
    assert f.taints() == ()  # no file: no taint
    path.write_text(f"# a spot notice\n{NOTICE}\n\nnot a taint\ngpu=a100:Sometimes\n")
    assert f.taints() == (NOTICE,) and f.skipped == 2
    assert f.taints() == (NOTICE,) and f.skipped == 2  # unchanged: not read again
    path.write_text("cloud.google.com/impending-node-termination=true:NoSchedule\n")
    os.utime(path, ns=(1, 1))  # a rewrite within the clock's tick still changes the stamp
    assert f.taints() == ("cloud.google.com/impending-node-termination=true:NoSchedule",)
    path.unlink()
    assert f.taints() == ()


async def test_the_heartbeat_carries_the_hosts_own_taints(tmp_path: Path) -> None:
    clock = FakeClock()
    runtime = FakeRuntime("w0", FakeVolume(clock, root=tmp_path / "vol"))
    path = tmp_path / "taints"
    agent = Agent(runtime=runtime, policy=policy(), taints_file=path)
    assert agent.heartbeat(clock.now()).taints == ()
    path.write_text(NOTICE + "\n")
    assert agent.heartbeat(clock.now()).taints == (NOTICE,)
