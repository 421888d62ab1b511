"""CPU budgets and accounting against temporary trees that mimic cgroupfs and /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.model import ContainerId
from specon.runtime.cgroups import (
    CLK_TCK,
    CpuBudget,
    CpuGroup,
    Enforcement,
    GroupCpuMeter,
    detect,
    own_cgroups,
    parse_stat,
    pick_cpus,
    process_alive,
    quota_us,
    read_stat,
)


def stat_line(
    pid: int,
    *,
    comm: str = "python",
    state: str = "S",
    pgrp: int = 1,
    utime: int = 0,
    stime: int = 0,
    cutime: int = 0,
    cstime: int = 0,
    start: int = 100,
) -> str:
    fields = [state, "1", str(pgrp), str(pgrp), "0", "-1", "0", "0", "0", "0", "0"]
    fields += [str(utime), str(stime), str(cutime), str(cstime), "20", "0", "1", "0", str(start)]
    fields += ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


def fake_proc(tmp_path: Path, stats: dict[int, str], *, cgroup: str = "1:cpu:/\n2:cpuacct:/\n") -> Path:
    proc = tmp_path / "proc"
    for pid, line in stats.items():
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "stat").write_text(line)
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "self" / "cgroup").write_text(cgroup)
    return proc


def fake_v1(tmp_path: Path) -> Path:
    """A cgroup-v1 root with separate cpu and cpuacct hierarchies, as on the project machines."""
    root = tmp_path / "cgroup"
    (root / "cpu").mkdir(parents=True)
    (root / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (root / "cpuacct").mkdir()
    (root / "cpuacct" / "cpuacct.usage").write_text("0\n")
    return root


# -- /proc ----------------------------------------------------------------------------------
def test_parse_stat_counts_fields_from_the_last_parenthesis() -> None:
    st = parse_stat(
        stat_line(
            42, comm="evil) S 1 2 (name", state="R", pgrp=7, utime=3, stime=4, cutime=5, cstime=6, start=999
        )
    )
    assert (st.pid, st.state, st.pgrp, st.cpu_ticks, st.start_ticks) == (42, "R", 7, 18, 999)


def test_parse_stat_reads_this_process() -> None:
    st = read_stat(os.getpid())
    assert st is not None and st.pid == os.getpid() and not st.zombie


@pytest.mark.parametrize("line", ["", "12 (x)", "garbage", "12 (x) S 1 2"])
def test_malformed_stat_is_a_clear_error(line: str) -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_stat(line)


def test_process_alive_checks_start_time_and_zombies(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {10: stat_line(10, start=500), 11: stat_line(11, state="Z", start=600)})
    assert process_alive(10, 500, proc=proc)
    assert process_alive(10, None, proc=proc)
    assert not process_alive(10, 501, proc=proc)  # the pid was reused by another process
    assert not process_alive(11, 600, proc=proc)  # exited, not yet reaped
    assert not process_alive(12, None, proc=proc)
    assert not process_alive(None, None, proc=proc)


def test_own_cgroups_reads_joint_and_separate_mounts(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, {}, cgroup="4:memory:/a/b\n3:cpu,cpuacct:/slice\n0::/\n")
    assert own_cgroups(proc=proc) == {"memory": "/a/b", "cpu": "/slice", "cpuacct": "/slice"}


def test_group_cpu_meter_is_monotone_when_members_exit(tmp_path: Path) -> None:
    proc = fake_proc(
        tmp_path,
        {
            20: stat_line(20, pgrp=20, utime=100),
            21: stat_line(21, pgrp=20, stime=50),
            30: stat_line(30, pgrp=30, utime=CLK_TCK),
        },
    )
    meter = GroupCpuMeter(proc=proc)
    jobs = {ContainerId("a"): 20, ContainerId("b"): 30}
    first = meter.sample(jobs)
    assert first == {"a": pytest.approx(150 / CLK_TCK), "b": pytest.approx(1.0)}
    (proc / "21" / "stat").unlink()  # a member exits before the group leader reaps it
    assert meter.sample(jobs)[ContainerId("a")] == pytest.approx(150 / CLK_TCK)
    assert meter.sample({ContainerId("b"): 30}) == {"b": pytest.approx(1.0)}
    assert meter.total == pytest.approx(150 / CLK_TCK + 1.0)  # "a" ended but still counts


# -- detection -------------------------------------------------------------------------------
def test_detect_finds_v1_and_nests_under_our_own_groups(tmp_path: Path) -> None:
    root = fake_v1(tmp_path)
    proc = fake_proc(tmp_path, {}, cgroup="1:cpu:/agent\n2:cpuacct:/acct\n")
    det = detect(root=root, proc=proc)
    assert det.available
    assert (det.cpu_base, det.cpuacct_base) == (root / "cpu" / "agent", root / "cpuacct" / "acct")


def test_detect_rejects_cgroup_v2_only(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    det = detect(root=tmp_path)
    assert not det.available and "v2" in det.reason


@pytest.mark.parametrize(
    ("missing", "reason"), [("cpu/cpu.cfs_quota_us", "cpu controller"), ("cpuacct/cpuacct.usage", "cpuacct")]
)
def test_detect_names_the_missing_controller(tmp_path: Path, missing: str, reason: str) -> None:
    root = fake_v1(tmp_path)
    (root / missing).unlink()
    det = detect(root=root)
    assert not det.available and reason in det.reason


def test_detect_reports_unwritable_hierarchies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_v1(tmp_path)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    det = detect(root=root)
    assert not det.available and "not writable" in det.reason


# -- the group ---------------------------------------------------------------------------------
def test_group_create_sets_period_and_quota_and_can_change_it(tmp_path: Path) -> None:
    det = detect(root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {}))
    group = CpuGroup.at(det, "specon", "c1", "w0")
    group.create(0.5)
    assert (group.cpu_dir / "cpu.cfs_period_us").read_text() == "100000"
    assert (group.cpu_dir / "cpu.cfs_quota_us").read_text() == "50000"
    assert group.cpuacct_dir.is_dir() and group.cpuacct_dir != group.cpu_dir
    group.set_cpus(1.5)
    assert (group.cpu_dir / "cpu.cfs_quota_us").read_text() == "150000"
    (group.cpuacct_dir / "cpuacct.usage").write_text("2500000000\n")
    (group.cpu_dir / "cgroup.procs").write_text("7\n9\n")
    assert (group.usage_ns(), group.pids()) == (2_500_000_000, {7, 9})


def test_co_mounted_controllers_are_joined_once(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "cpu,cpuacct").mkdir(parents=True)
    (root / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("-1")
    (root / "cpu,cpuacct" / "cpuacct.usage").write_text("0")
    (root / "cpu").symlink_to("cpu,cpuacct")
    (root / "cpuacct").symlink_to("cpu,cpuacct")
    group = CpuGroup.at(detect(root=root, proc=fake_proc(tmp_path, {})), "specon", "w0")
    assert group.procs_files == (group.cpu_dir / "cgroup.procs",)


def test_remove_stops_at_busy_parents_and_never_touches_the_base(tmp_path: Path) -> None:
    det = detect(root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {}))
    w0, w1 = CpuGroup.at(det, "specon", "c1", "w0"), CpuGroup.at(det, "specon", "c1", "w1")
    for g in (w0, w1):  # bare directories: real cgroupfs control files never block rmdir
        g.cpu_dir.mkdir(parents=True)
        g.cpuacct_dir.mkdir(parents=True)
    assert w0.remove()
    assert not w0.exists() and w1.exists()  # the shared cluster group stays for w1
    assert w1.remove()
    assert not (tmp_path / "cgroup" / "cpu" / "specon").exists()
    assert (tmp_path / "cgroup" / "cpu").is_dir()
    assert w1.remove()  # idempotent


def test_remove_reports_a_group_that_still_has_tasks(tmp_path: Path) -> None:
    det = detect(root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {}))
    group = CpuGroup.at(det, "specon", "w0")
    group.create(1.0)  # the fake control files play the tasks that make rmdir fail
    assert not group.remove()
    assert group.exists()


@pytest.mark.parametrize("part", ["", "a/b", "..", "."])
def test_group_path_components_are_validated(tmp_path: Path, part: str) -> None:
    det = detect(root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {}))
    with pytest.raises(ValueError, match="invalid cgroup path component"):
        CpuGroup.at(det, "specon", part)


@pytest.mark.parametrize(
    ("cpus", "quota"), [(0.5, 50_000), (2, 200_000), (0.001, 1_000), (1.234567, 123_457)]
)
def test_quota(cpus: float, quota: int) -> None:
    assert quota_us(cpus) == quota


@pytest.mark.parametrize("cpus", [0, -1, float("nan"), float("inf")])
def test_quota_rejects_nonsense(cpus: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        quota_us(cpus)


# -- affinity fallback -------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    cpus=st.floats(min_value=0.01, max_value=64),
    pool=st.sets(st.integers(0, 63), min_size=1, max_size=16),
    offset=st.integers(0, 100),
)
def test_pick_cpus_takes_ceil_cpus_from_the_pool(cpus: float, pool: set[int], offset: int) -> None:
    picked = pick_cpus(cpus, sorted(pool), offset=offset)
    assert picked <= pool
    assert len(picked) == min(len(pool), max(1, -(-cpus // 1)))


def test_pick_cpus_rotates_by_offset() -> None:
    assert [pick_cpus(1, [0, 1, 2], offset=i) for i in range(4)] == [{0}, {1}, {2}, {0}]


# -- the budget -------------------------------------------------------------------------------
def test_budget_uses_cgroups_when_available_and_preexec_joins_every_hierarchy(tmp_path: Path) -> None:
    budget = CpuBudget.establish(
        cpus=0.5, path=("specon", "c", "w0"), cgroup_root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {})
    )
    assert budget.enforcement is Enforcement.CGROUP and budget.group is not None
    for procs in budget.group.procs_files:  # cgroupfs provides these; the fake tree must not
        procs.touch()
    budget.preexec()()  # what the forked child runs before exec
    assert [p.read_text() for p in budget.group.procs_files] == ["0", "0"]
    (budget.group.cpuacct_dir / "cpuacct.usage").write_text("3000000000")
    assert budget.cpu_seconds({})[0] == pytest.approx(3.0)


def test_budget_falls_back_with_a_warning_where_cgroups_are_unavailable(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        budget = CpuBudget.establish(cpus=0.5, path=("specon", "w0"), cgroup_root=tmp_path / "nothing")
    expected = Enforcement.AFFINITY if len(os.sched_getaffinity(0)) > 1 else Enforcement.NONE
    assert budget.enforcement is expected and budget.group is None
    [event] = [e for e in logs if e["event"] == "specon.runtime.cgroups_unavailable"]
    assert event["log_level"] == "warning" and "cpu controller" in event["reason"]
    assert event["fallback"] == expected.value


def test_budget_falls_back_when_the_group_cannot_be_created(tmp_path: Path) -> None:
    root = fake_v1(tmp_path)
    (root / "cpu" / "specon").write_text("a file where the group should go")
    with structlog.testing.capture_logs() as logs:
        budget = CpuBudget.establish(
            cpus=8, path=("specon", "w0"), cgroup_root=root, proc=fake_proc(tmp_path, {})
        )
    assert budget.enforcement is Enforcement.NONE  # 8 CPUs: affinity cannot limit anything here
    assert "cannot create" in logs[0]["reason"]


def test_budget_mode_cgroup_refuses_to_fall_back(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cgroup CPU budget unavailable"):
        CpuBudget.establish(cpus=1, path=("w0",), mode="cgroup", cgroup_root=tmp_path)


def test_budget_mode_none_is_silent(tmp_path: Path) -> None:
    with structlog.testing.capture_logs() as logs:
        budget = CpuBudget.establish(cpus=1, path=("w0",), mode="none", cgroup_root=tmp_path)
    assert budget.enforcement is Enforcement.NONE and logs == []
    assert budget.close()
