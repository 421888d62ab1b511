"""CPU budgets and accounting against temporary trees that mimic cgroupfs and /proc."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.model import ContainerId
from specon.runtime.base import cpu_shares
from specon.runtime.local.cgroup_entry import enter
from specon.runtime.local.cgroups import (
    CLK_TCK,
    PRUNE_GRACE,
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
from specon.runtime.local.cpuset import format_cpulist, least_loaded, parse_cpulist


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
def test_budget_uses_cgroups_when_available_and_entry_joins_every_hierarchy(tmp_path: Path) -> None:
    budget = CpuBudget.establish(
        cpus=0.5, path=("specon", "c", "w0"), cgroup_root=fake_v1(tmp_path), proc=fake_proc(tmp_path, {})
    )
    assert budget.enforcement is Enforcement.CGROUP and budget.group is not None
    for procs in budget.group.procs_files:  # cgroupfs provides these; the fake tree must not
        procs.touch()
    enter(budget.entry())  # what a new process of the worker runs first
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


# -- CPU weights: each job's group, its shares, and pinning -----------------------------------
def fake_cpuset(root: Path, cpus: str = "0-63", mems: str = "0") -> Path:
    (root / "cpuset").mkdir(parents=True, exist_ok=True)
    (root / "cpuset" / "cpuset.cpus").write_text(cpus + "\n")
    (root / "cpuset" / "cpuset.mems").write_text(mems + "\n")
    return root


@pytest.mark.parametrize(("weight", "shares"), [(1, 10), (50, 512), (100, 1024), (10_000, 102_400)])
def test_cpu_shares_maps_cgroup_v2_weights_to_v1_shares(weight: int, shares: int) -> None:
    assert cpu_shares(weight) == shares


@pytest.mark.parametrize("weight", [0, -5, 10_001])
def test_cpu_shares_refuses_weights_out_of_range(weight: int) -> None:
    with pytest.raises(ValueError, match="CPU weight"):
        cpu_shares(weight)


def weighted_budget(tmp_path: Path, *, cpuset: bool = True) -> CpuBudget:
    root = fake_v1(tmp_path)
    if cpuset:
        fake_cpuset(root)
    budget = CpuBudget.establish(
        cpus=0.5, path=("specon", "c", "w0"), cgroup_root=root, proc=fake_proc(tmp_path, {})
    )
    assert budget.group is not None
    return budget


def test_each_job_joins_a_group_of_its_own_inside_the_worker(tmp_path: Path) -> None:
    budget = weighted_budget(tmp_path)
    job = ContainerId("j1")
    entry = budget.entry(job)  # made by the runtime, before the launch
    own, worker = budget.job_group(job), budget.group
    assert worker is not None and own.cpu_dir == worker.cpu_dir / "job-j1"
    assert own.cpu_dir.is_dir() and own.cpuacct_dir.is_dir()
    for procs in own.procs_files:
        procs.touch()
    enter(entry)
    assert [p.read_text() for p in own.procs_files] == ["0", "0"]
    (own.cpuacct_dir / "cpuacct.usage").write_text("2500000000\n")
    (worker.cpuacct_dir / "cpuacct.usage").write_text("4000000000\n")
    # The job's CPU seconds from its own group, even without the /proc scan (per_job=False).
    assert budget.cpu_seconds({job: 999_999}, per_job=False) == (4.0, {job: 2.5})


def test_a_weight_pins_the_worker_to_a_cpuset_then_sets_the_jobs_shares(tmp_path: Path) -> None:
    budget = weighted_budget(tmp_path)
    job = ContainerId("j1")
    budget.entry(job)
    own = budget.job_group(job)
    (own.cpu_dir / "cgroup.procs").write_text("4242\n4243\n")  # the job's processes now
    with structlog.testing.capture_logs() as logs:
        assert budget.set_weight(job, 10_000)
    assert (own.cpu_dir / "cpu.shares").read_text() == "102400"
    assert budget.cpuset is not None and budget.pinned is not None
    expected = pick_cpus(0.5, sorted(os.sched_getaffinity(0)))
    assert budget.pinned == expected and len(expected) == 1
    worker = tmp_path / "cgroup" / "cpuset" / "specon" / "c" / "w0"
    assert worker == budget.cpuset.dir
    assert (worker / "cpuset.cpus").read_text() == format_cpulist(expected)
    for level in (worker.parent.parent, worker.parent, worker):  # each level before any task
        assert (level / "cpuset.mems").read_text() == "0"
    assert (worker / "cgroup.procs").read_text() == "4243"  # one pid a write (the last one here)
    assert [e["event"] for e in logs] == ["specon.runtime.pinned"] and logs[0]["how"] == "cpuset"
    # A job started from now on joins the cpuset too; a second weight pins nothing again.
    (worker / "cgroup.procs").write_text("")
    for procs in budget.job_group(ContainerId("j2")).procs_files:
        procs.parent.mkdir(exist_ok=True)
        procs.touch()
    enter(budget.entry(ContainerId("j2")))
    assert (worker / "cgroup.procs").read_text() == "0"
    assert budget.set_weight(ContainerId("j2"), 1)
    assert (budget.job_group(ContainerId("j2")).cpu_dir / "cpu.shares").read_text() == "10"


def test_without_a_cpuset_hierarchy_pinning_falls_back_to_affinity(tmp_path: Path) -> None:
    budget = weighted_budget(tmp_path, cpuset=False)
    budget.entry(ContainerId("j1"))
    assert budget.cpuset is None
    with structlog.testing.capture_logs() as logs:
        assert budget.set_weight(ContainerId("j1"), 200)
    assert budget.affinity == budget.pinned  # new jobs get it on entry
    assert logs[0]["how"] == "affinity"


def test_weights_without_cgroups_are_refused_with_one_warning(tmp_path: Path) -> None:
    budget = CpuBudget.establish(cpus=1, path=("w0",), mode="none", cgroup_root=tmp_path)
    with structlog.testing.capture_logs() as logs:
        assert not budget.set_weight(ContainerId("a"), 100)
        assert not budget.set_weight(ContainerId("b"), 5)
    assert [e["event"] for e in logs] == ["specon.runtime.cpu_weight_unavailable"]
    assert budget.pinned is None


def test_a_job_without_a_group_of_its_own_gets_no_weight(tmp_path: Path) -> None:
    budget = weighted_budget(tmp_path)
    with structlog.testing.capture_logs() as logs:
        assert not budget.set_weight(ContainerId("elsewhere"), 100)
        assert not budget.set_weight(ContainerId("elsewhere"), 100)
        assert not budget.set_weight(ContainerId("j1"), 0)  # out of range
    assert len(logs) == 2 and "no cgroup of its own" in logs[0]["error"]
    assert budget.pinned is None  # nothing applied, nothing pinned


def test_groups_of_ended_jobs_are_pruned_and_close_removes_everything(tmp_path: Path) -> None:
    budget = weighted_budget(tmp_path)
    for job in ("gone", "runs", "busy"):
        budget.entry(ContainerId(job))
    (budget.job_group(ContainerId("busy")).cpu_dir / "cgroup.procs").write_text("7\n")  # tasks left
    budget.prune_jobs([ContainerId("runs")])
    assert budget.group is not None
    # Just made: another process may be launching into it.
    assert budget.group.children() == ["job-busy", "job-gone", "job-runs"]
    budget.prune_jobs([ContainerId("runs")], now=time.time() + PRUNE_GRACE + 1)
    assert budget.group.children() == ["job-busy", "job-runs"]
    (budget.job_group(ContainerId("busy")).cpu_dir / "cgroup.procs").unlink()
    budget.set_weight(ContainerId("runs"), 100)  # makes the cpuset
    assert budget.cpuset is not None and budget.cpuset.dir.is_dir()
    trees = (budget.group.cpu_dir, budget.group.cpuacct_dir, tmp_path / "cgroup" / "cpuset" / "specon")
    for d in trees:  # bare directories, as rmdir sees cgroupfs
        for f in d.rglob("*"):
            if f.is_file():
                f.unlink()
    assert budget.close()
    assert not (tmp_path / "cgroup" / "cpu" / "specon").exists()
    assert not (tmp_path / "cgroup" / "cpuset" / "specon").exists()


def test_a_launch_whose_group_was_pruned_meanwhile_joins_the_workers_group(tmp_path: Path) -> None:
    # An agent prunes the group of a job it does not see running yet, between a submission
    # making it and the child joining it: the job still starts, in its worker's budget.
    budget = weighted_budget(tmp_path)
    assert budget.group is not None
    entry = budget.entry(ContainerId("late"))
    own = budget.job_group(ContainerId("late"))
    for d in (own.cpu_dir, own.cpuacct_dir):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    for f in budget.group.procs_files:
        f.write_text("")
    pid = os.fork()
    if pid == 0:  # the child enters as a launcher would, and reports by exit status
        try:
            enter(entry)
        except BaseException:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert all(f.read_text() == "0" for f in budget.group.procs_files)


def test_cpulists_round_trip() -> None:
    assert parse_cpulist("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}
    assert parse_cpulist("") == frozenset()
    assert format_cpulist({3, 1, 2}) == "1,2,3"


def test_least_loaded_cpus_go_first_ties_in_rotated_order() -> None:
    assert least_loaded(1, [0, 1, 2, 3], {}) == {0}
    assert least_loaded(1, [0, 1, 2, 3], {}, offset=2) == {2}
    assert least_loaded(2, [0, 1, 2, 3], {0: 2, 1: 1, 3: 1}) == {2, 1}
    assert least_loaded(9, [0, 1], {}) == {0, 1}


def test_a_worker_pins_to_the_cpus_its_siblings_use_least(tmp_path: Path) -> None:
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        pytest.skip("one CPU: nothing to choose")
    budget = weighted_budget(tmp_path)
    sibling = tmp_path / "cgroup" / "cpuset" / "specon" / "c" / "w1"  # another agent's worker
    sibling.mkdir(parents=True)
    (sibling / "cpuset.cpus").write_text(f"{available[0]}\n")
    budget.entry(ContainerId("j1"))
    assert budget.set_weight(ContainerId("j1"), 100)
    assert budget.pinned == {available[1]}
    # A restarted agent of the same worker keeps the CPUs it had, whatever the siblings do.
    (sibling / "cpuset.cpus").write_text(f"{available[1]}\n")
    again = CpuBudget.establish(
        cpus=0.5, path=("specon", "c", "w0"), cgroup_root=tmp_path / "cgroup", proc=tmp_path / "proc"
    )
    assert again.pin() == {available[1]}


def test_a_group_whose_shared_parent_vanishes_meanwhile_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another runtime closing removes the empty ``specon/<cluster>`` parents; making ours
    right then meets ENOENT once, and the whole path is made again."""
    from specon.runtime.local import cgroup_files  # noqa: PLC0415

    target = tmp_path / "specon" / "c1" / "w0"
    real_mkdir = Path.mkdir
    lost = []

    def racing_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self == target and not lost:
            lost.append(self)
            raise FileNotFoundError(2, "parent removed meanwhile", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    cgroup_files.make_group(target)
    assert lost == [target] and target.is_dir()
