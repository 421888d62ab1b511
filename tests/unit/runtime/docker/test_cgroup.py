"""A container's CPU counter found from its init pid's cgroup (fake /proc and /sys/fs/cgroup)."""

from __future__ import annotations

from pathlib import Path

from specon.runtime.docker.cgroup import ContainerCounters


def tree(tmp: Path, cgroup_lines: str) -> tuple[Path, Path]:
    proc, root = tmp / "proc", tmp / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup_lines)
    return proc, root


def test_v1_reads_cpuacct_usage_and_asks_the_pid_once(tmp_path: Path) -> None:
    proc, root = tree(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n")
    usage = root / "cpuacct/docker/abc/cpuacct.usage"
    usage.parent.mkdir(parents=True)
    usage.write_text("2500000000\n")
    asked: list[int] = []
    counters = ContainerCounters(proc=proc, root=root)

    def pid() -> int:
        asked.append(1)
        return 42

    assert counters.seconds("abc", pid) == 2.5
    usage.write_text("4000000000\n")
    assert counters.seconds("abc", pid) == 4.0
    assert len(asked) == 1


def test_v2_reads_cpu_stat(tmp_path: Path) -> None:
    proc, root = tree(tmp_path, "0::/system.slice/docker-abc.scope\n")
    (root / "system.slice/docker-abc.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "system.slice/docker-abc.scope/cpu.stat").write_text("usage_usec 1500000\nuser_usec 1\n")
    assert ContainerCounters(proc=proc, root=root).seconds("abc", lambda: 42) == 1.5


def test_unreadable_or_gone_is_none_so_the_caller_falls_back(tmp_path: Path) -> None:
    proc, root = tree(tmp_path, "3:cpu,cpuacct:/docker/abc\n")
    counters = ContainerCounters(proc=proc, root=root)
    assert counters.seconds("abc", lambda: None) is None  # no pid (another pid namespace)
    assert counters.seconds("abc", lambda: 42) is None  # no cgroup file readable here
    assert counters.seconds("zzz", lambda: 7) is None  # no such process
