"""The cgroup-v2 CPU budget against a fake unified tree: detection, delegation, the files
written and their values, usage from ``cpu.stat``, and clear reasons where it cannot be.

``FakeV2`` plays the kernel's part the tests rely on: a group's ``cgroup.procs`` moves a pid
out of every other group, and ``cgroup.subtree_control`` refuses (EBUSY) a controller in a
non-root group that holds processes, as cgroup v2's "no internal processes" rule does.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from specon.model import ContainerId
from specon.runtime.local import cgroup_v2
from specon.runtime.local.cgroup_files import write_value
from specon.runtime.local.cgroup_v2 import (
    AGENT_LEAF,
    WORKER_LEAF,
    UnifiedDetection,
    UnifiedGroup,
    delegate,
    detect_unified,
    resolve_own,
)
from specon.runtime.local.cgroups import CpuBudget, Enforcement

PID = 4242


class FakeV2:
    """A cgroup2 tree in a temp dir, with this 'process' (``PID``) in ``own``."""

    def __init__(
        self, tmp_path: Path, own: str = "/agent", controllers: str = "cpu cpuset io memory"
    ) -> None:
        self.root = tmp_path / "cgroup"
        self.proc = tmp_path / "proc"
        self.writes: list[tuple[str, str]] = []
        self.refuse: dict[str, int] = {}  # file name -> errno to fail with
        parts = [p for p in own.split("/") if p]
        for i in range(len(parts) + 1):
            self.group(self.root.joinpath(*parts[:i]), controllers)
        self.own = self.root.joinpath(*parts)
        (self.own / "cgroup.procs").write_text(f"{PID}\n")
        (self.proc / "self").mkdir(parents=True)
        (self.proc / "self" / "cgroup").write_text(f"0::{own}\n")

    @staticmethod
    def group(d: Path, controllers: str = "") -> None:
        d.mkdir(parents=True, exist_ok=True)
        files = {"cgroup.controllers": controllers, "cgroup.subtree_control": "", "cgroup.procs": ""}
        for name, text in {**files, "cpuset.cpus.effective": "0-7"}.items():
            if not (d / name).exists():
                (d / name).write_text(text)

    def write(self, path: Path, value: object) -> None:
        text = str(value)
        self.writes.append((str(path.relative_to(self.root)), text))
        if path.name in self.refuse:
            raise OSError(self.refuse[path.name], os.strerror(self.refuse[path.name]), str(path))
        group = path.parent
        FakeV2.group(group)  # cgroupfs makes a new group's core files with it
        if path.name == "cgroup.subtree_control":
            if group != self.root and (group / "cgroup.procs").read_text().split():
                raise OSError(errno.EBUSY, "Device or resource busy", str(path))
            words = set((group / path.name).read_text().split()) | {text.lstrip("+")}
            (group / path.name).write_text(" ".join(sorted(words)))
            return
        if path.name == "cgroup.procs":
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_text(" ".join(p for p in procs.read_text().split() if p != text))
            (group / path.name).write_text(((group / path.name).read_text() + f" {text}").strip())
            return
        path.write_text(text)

    def subtree(self, *parts: str) -> set[str]:
        return set((self.root.joinpath(*parts) / "cgroup.subtree_control").read_text().split())


@pytest.fixture
def v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeV2]:
    fake = FakeV2(tmp_path)
    for module in ("specon.runtime.local.cgroup_v2", "specon.runtime.local.cpuset"):
        monkeypatch.setattr(f"{module}.{'write_value' if 'v2' in module else '_write'}", fake.write)
    monkeypatch.setattr(os, "getpid", lambda: PID)
    yield fake


def budget(fake: FakeV2, cpus: float = 0.5) -> CpuBudget:
    return CpuBudget.establish(cpus=cpus, path=("specon", "c", "w0"), cgroup_root=fake.root, proc=fake.proc)


# -- detection -----------------------------------------------------------------------------
def test_detect_finds_the_unified_mount_and_our_group(v2: FakeV2) -> None:
    det = detect_unified(root=v2.root, proc=v2.proc)
    assert det.available and det.own == v2.own and det.root == v2.root


def test_detect_finds_our_group_when_the_mount_is_a_subtree(tmp_path: Path) -> None:
    # The GPU machine: /proc/self/cgroup names /process_api/<id>, which is not under the mount;
    # the mount's root is the group that lists this process.
    fake = FakeV2(tmp_path, own="/")
    (fake.proc / "self" / "cgroup").write_text("0::/process_api/abc\n")
    (fake.root / "cgroup.procs").write_text(f"{PID}\n")
    assert resolve_own(fake.root, "/process_api/abc", PID) == fake.root
    assert detect_unified(root=fake.root, proc=fake.proc, pid=PID).own == fake.root


def test_an_agent_started_from_the_leaf_nests_beside_it(v2: FakeV2) -> None:
    leaf = v2.own / AGENT_LEAF
    FakeV2.group(leaf)
    v2.write(leaf / "cgroup.procs", PID)
    (v2.proc / "self" / "cgroup").write_text(f"0::/agent/{AGENT_LEAF}\n")
    assert detect_unified(root=v2.root, proc=v2.proc).own == v2.own


def test_an_own_group_found_nowhere_nests_under_a_writable_root(tmp_path: Path) -> None:
    fake = FakeV2(tmp_path)
    (fake.own / "cgroup.procs").write_text("")
    (fake.proc / "self" / "cgroup").write_text("0::/process_api/abc\n")
    assert detect_unified(root=fake.root, proc=fake.proc, pid=PID).own == fake.root


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda f: (f.root / "cgroup.controllers").unlink(), "not a cgroup v2 (unified) mount"),
        (lambda f: (f.proc / "self" / "cgroup").write_text("4:memory:/x\n"), "no cgroup v2 line"),
        (lambda f: (f.proc / "self" / "cgroup").write_text("0::/elsewhere\n"), "is not under"),
    ],
)
def test_detect_says_why_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setup: object, reason: str
) -> None:
    fake = FakeV2(tmp_path)
    (fake.own / "cgroup.procs").write_text("")  # nobody lists us: the named path must exist
    assert callable(setup)
    setup(fake)
    monkeypatch.setattr(os, "access", lambda p, *_a, **_k: Path(p) != fake.root)  # a read-only root
    det = detect_unified(root=fake.root, proc=fake.proc, pid=PID)
    assert not det.available and reason in det.reason


def test_detect_reports_a_read_only_or_undelegated_group(v2: FakeV2, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda *_a, **_k: False)
    det = detect_unified(root=v2.root, proc=v2.proc)
    assert not det.available and "not writable" in det.reason and "Delegate=yes" in det.reason


# -- delegation ----------------------------------------------------------------------------
def test_delegate_enables_cpu_and_cpuset_down_to_our_group_handing_our_processes_down(v2: FakeV2) -> None:
    got = delegate(detect_unified(root=v2.root, proc=v2.proc))
    assert got == {"cpu", "cpuset"}
    assert v2.subtree() >= {"cpu", "cpuset"} and v2.subtree("agent") >= {"cpu", "cpuset"}
    # Our group held this process: it moved into the leaf first (no internal processes).
    assert (v2.own / "cgroup.procs").read_text().split() == []
    assert (v2.own / AGENT_LEAF / "cgroup.procs").read_text().split() == [str(PID)]


def test_delegate_without_handing_down_says_what_is_in_the_way(v2: FakeV2) -> None:
    with pytest.raises(OSError, match=r"agent/cgroup.subtree_control: .*holds processes.*Delegate=yes"):
        delegate(detect_unified(root=v2.root, proc=v2.proc), hand_down=False)


def test_an_ancestor_with_processes_is_reported_never_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeV2(tmp_path, own="/user/session/agent")
    monkeypatch.setattr(cgroup_v2, "write_value", fake.write)
    (fake.root / "user" / "session" / "cgroup.procs").write_text("77")
    with pytest.raises(
        OSError, match=r"cpu controller in .*session/cgroup.subtree_control: .*holds processes"
    ):
        delegate(detect_unified(root=fake.root, proc=fake.proc, pid=PID))
    assert (fake.root / "user" / "session" / "cgroup.procs").read_text() == "77"


def test_a_cpu_controller_bound_elsewhere_is_named(tmp_path: Path) -> None:
    fake = FakeV2(tmp_path, controllers="io memory pids")
    with pytest.raises(
        OSError, match=r"cpu controller is not offered by .*cgroup.controllers \(io memory pids\)"
    ):
        delegate(detect_unified(root=fake.root, proc=fake.proc, pid=PID))


def test_a_refused_cpuset_is_dropped_a_refused_cpu_is_an_error(v2: FakeV2) -> None:
    det = detect_unified(root=v2.root, proc=v2.proc)
    real = v2.write

    def no_cpuset(path: Path, value: object) -> None:
        if str(value) == "+cpuset":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        real(path, value)

    cgroup_v2.write_value = no_cpuset  # type: ignore[assignment]  # undone by the fixture's monkeypatch
    assert delegate(det) == {"cpu"}
    v2.refuse["cgroup.subtree_control"] = errno.EACCES
    cgroup_v2.write_value = v2.write  # type: ignore[assignment]
    (v2.root / "cgroup.subtree_control").write_text("")
    with pytest.raises(OSError, match=r"cannot enable the cpu controller in .*Permission denied.*delegated"):
        delegate(det)


def test_delegate_needs_a_detected_group() -> None:
    with pytest.raises(OSError, match="no cgroup v2 group: nope"):
        delegate(UnifiedDetection(False, "nope"))


# -- the budget ----------------------------------------------------------------------------
def test_budget_on_v2_writes_cpu_max_and_nests_under_our_group(v2: FakeV2) -> None:
    b = budget(v2, 0.5)
    worker = v2.own / "specon" / "c" / "w0"
    assert b.enforcement is Enforcement.CGROUP and b.version == 2
    assert isinstance(b.group, UnifiedGroup) and b.group.dir == worker
    assert (worker / "cpu.max").read_text() == "50000 100000"
    for parts in (("agent",), ("agent", "specon"), ("agent", "specon", "c"), ("agent", "specon", "c", "w0")):
        assert v2.subtree(*parts) >= {"cpu", "cpuset"}, parts
    assert (worker / WORKER_LEAF).is_dir()  # processes without a job group of their own
    b.set_cpus(1.5)
    assert (worker / "cpu.max").read_text() == "150000 100000"


def test_v2_jobs_join_their_own_group_else_the_workers_leaf(v2: FakeV2) -> None:
    b = budget(v2)
    worker = v2.own / "specon" / "c" / "w0"
    entry = b.entry(ContainerId("j1"))
    assert entry.files == (
        (str(worker / "job-j1" / "cgroup.procs"), str(worker / WORKER_LEAF / "cgroup.procs")),
    )
    # Never the worker's own cgroup.procs: a v2 group with controllers holds no process.
    assert b.entry().files == ((str(worker / WORKER_LEAF / "cgroup.procs"), None),)


def test_v2_weights_are_written_as_they_are_no_shares_conversion(v2: FakeV2) -> None:
    b = budget(v2)
    worker = v2.own / "specon" / "c" / "w0"
    for job in ("heavy", "light"):
        b.entry(ContainerId(job))
    assert b.set_weight(ContainerId("heavy"), 10_000) and b.set_weight(ContainerId("light"), 1)
    assert (worker / "job-heavy" / "cpu.weight").read_text() == "10000"
    assert (worker / "job-light" / "cpu.weight").read_text() == "1"
    # Pinned through the worker's own v2 cpuset: one CPU within the parent's effective set.
    assert b.pinned is not None and len(b.pinned) == 1
    assert (worker / "cpuset.cpus").read_text() == ",".join(str(c) for c in sorted(b.pinned))
    assert not b.set_weight(ContainerId("heavy"), 10_001)


def test_v2_usage_comes_from_cpu_stat(v2: FakeV2) -> None:
    b = budget(v2)
    worker = v2.own / "specon" / "c" / "w0"
    b.entry(ContainerId("j1"))
    (worker / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (worker / "job-j1" / "cpu.stat").write_text("usage_usec 1250000\nuser_usec 1\n")
    total, per_job = b.cpu_seconds({ContainerId("j1"): 999_999})
    assert total == pytest.approx(2.5) and per_job == {ContainerId("j1"): pytest.approx(1.25)}
    (worker / "cpu.stat").write_text("user_usec 1\n")
    with pytest.raises(ValueError, match="no usage_usec"):
        b.group.usage_ns()  # type: ignore[union-attr]


def test_v2_close_removes_every_group_it_made_and_nothing_above(v2: FakeV2) -> None:
    b = budget(v2)
    b.entry(ContainerId("j1"))
    for d in sorted((v2.own / "specon").rglob("*"), reverse=True):  # cgroupfs files vanish with rmdir
        if d.is_file():
            d.unlink()
    assert b.close()
    assert not (v2.own / "specon").exists() and v2.own.is_dir()


def test_without_a_delegated_cpu_controller_the_warning_says_what_is_missing(tmp_path: Path) -> None:
    fake = FakeV2(tmp_path, controllers="io memory")
    with structlog.testing.capture_logs() as logs:
        b = CpuBudget.establish(cpus=0.5, path=("specon", "w0"), cgroup_root=fake.root, proc=fake.proc)
    assert b.enforcement is not Enforcement.CGROUP and b.group is None
    (event,) = [e for e in logs if e["event"] == "specon.runtime.cgroups_unavailable"]
    assert "cpu controller is not offered" in event["reason"] and "io memory" in event["reason"]
    with pytest.raises(OSError, match="cgroup CPU budget unavailable: the cpu controller"):
        CpuBudget.establish(cpus=0.5, path=("w0",), mode="cgroup", cgroup_root=fake.root, proc=fake.proc)


def test_a_refused_group_falls_back_naming_the_group(v2: FakeV2) -> None:
    v2.refuse["cpu.max"] = errno.EACCES
    with structlog.testing.capture_logs() as logs:
        b = budget(v2)
    assert b.group is None
    (event,) = [e for e in logs if e["event"] == "specon.runtime.cgroups_unavailable"]
    assert "specon/c/w0" in event["reason"] and "Permission denied" in event["reason"]


def test_unified_group_paths_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid cgroup path component"):
        UnifiedGroup.at(tmp_path, "specon", "..")
    with pytest.raises(ValueError, match="invalid cgroup path component"):
        UnifiedGroup.at(tmp_path, "w").child("a/b")


def test_write_value_is_one_write(tmp_path: Path) -> None:
    write_value(tmp_path / "f", 12)
    assert (tmp_path / "f").read_text() == "12"
