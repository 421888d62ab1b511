"""Freezing a Docker job and its host PIDs, against a fake engine (the real one:
tests/docker/test_gpu_docker.py), and the cgroup reads under them (fake /proc and cgroup trees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker.errors
import pytest
import structlog
from docker.models.containers import Container

from specon.model import ContainerId
from specon.runtime.base import ContainerState
from specon.runtime.docker.cgroup import ContainerCounters, CpuTotals
from specon.runtime.docker.freezer import PAUSE_ATTEMPTS, Freezer

J = ContainerId("j-1")


class FakeApi:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.calls: list[str] = []

    def pause(self, cid: str) -> None:
        if self.engine.stuck > 0:
            self.engine.stuck -= 1
            self.calls.append("stuck")
            raise docker.errors.APIError(
                f"Cannot pause container {cid}: OCI runtime pause failed: unable to freeze: unknown"
            )
        self._set(cid, "paused", "running")

    def unpause(self, cid: str) -> None:
        self._set(cid, "running", "paused")

    def _set(self, cid: str, to: str, needs: str) -> None:
        self.calls.append(to)
        if self.engine.race is not None:  # someone else got there first, or the run ended
            self.engine.state[cid] = self.engine.race
            raise docker.errors.APIError(f"container {cid} is not {needs}")
        if self.engine.state.get(cid) != needs:
            raise docker.errors.APIError(f"container {cid} is not {needs}")
        self.engine.state[cid] = to

    def inspect_container(self, cid: str) -> dict[str, Any]:
        return {"State": {"Pid": 4242}}

    def top(self, cid: str, ps_args: str | None = None) -> dict[str, Any]:
        assert ps_args == "-o pid"
        return {"Titles": ["PID"], "Processes": [["4242"], ["4243"]]}


class FakeContainers:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def list(self, *, sparse: bool, filters: dict[str, Any]) -> list[Container]:
        assert sparse and filters["label"] == "specon.io/managed=true"
        return [
            Container(
                attrs={"Id": cid, "Names": [f"/{cid}"], "Labels": {"specon.io/job": cid}, "State": st},
                client=self.engine,
            )
            for cid, st in self.engine.state.items()
            if st in filters["status"]
        ]


class FakeEngine:
    """What the Freezer uses of a ``docker.DockerClient``."""

    def __init__(self, **state: str) -> None:
        self.state = dict(state)
        self.race: str | None = None
        self.stuck = 0  # pauses that runc gives up on before one succeeds
        self.api = FakeApi(self)
        self.containers = FakeContainers(self)


async def test_freeze_and_thaw_are_idempotent() -> None:
    engine = FakeEngine(**{J: "running"})
    f = Freezer(engine, {})
    assert await f.set(J, frozen=True) and engine.state[J] == "paused"
    assert await f.set(J, frozen=True)  # already frozen: nothing sent
    assert await f.set(J, frozen=False) and engine.state[J] == "running"
    assert await f.set(J, frozen=False)
    assert engine.api.calls == ["paused", "running"]


async def test_an_absent_container_is_false_and_logged_once() -> None:
    f = Freezer(FakeEngine(), {})
    with structlog.testing.capture_logs() as logs:
        assert not await f.set(J, frozen=True)
        assert not await f.set(J, frozen=True)
        assert not await f.set(J, frozen=False)
    assert [e["event"] for e in logs] == ["specon.docker.freeze_skipped"]
    assert logs[0]["reason"] == "not running here"


async def test_a_job_being_saved_or_stopped_is_left_alone() -> None:
    engine = FakeEngine(**{J: "running"})
    f = Freezer(engine, {J: ContainerState.SAVING})
    assert not await f.set(J, frozen=True)
    assert engine.state[J] == "running" and engine.api.calls == []


@pytest.mark.parametrize(("race", "result"), [("paused", True), ("exited", False)])
async def test_a_lost_race_reports_what_is_true_now(race: str, result: bool) -> None:
    engine = FakeEngine(**{J: "running"})
    engine.race = race
    f = Freezer(engine, {})
    assert await f.set(J, frozen=True) is result


async def test_a_pause_runc_gave_up_on_is_tried_again() -> None:
    engine = FakeEngine(**{J: "running"})
    engine.stuck = PAUSE_ATTEMPTS - 1
    assert await Freezer(engine, {}).set(J, frozen=True)
    assert engine.state[J] == "paused" and engine.api.calls == ["stuck"] * (PAUSE_ATTEMPTS - 1) + ["paused"]


async def test_a_pause_that_never_settles_is_false_and_logged() -> None:
    engine = FakeEngine(**{J: "running"})
    engine.stuck = PAUSE_ATTEMPTS
    with structlog.testing.capture_logs() as logs:
        assert not await Freezer(engine, {}).set(J, frozen=True)
    assert engine.state[J] == "running" and engine.api.calls == ["stuck"] * PAUSE_ATTEMPTS
    assert [e["event"] for e in logs] == ["specon.docker.freeze_failed"]
    assert "unable to freeze" in logs[0]["error"]


async def test_pids_fall_back_to_the_engines_top(tmp_path: Path) -> None:
    engine = FakeEngine(**{J: "paused", "j-2": "running", "j-3": "exited"})
    f = Freezer(engine, {})
    # No /proc/4242 of this host's (the agent in another pid namespace): the engine's top.
    f._procs = ContainerCounters(proc=tmp_path / "proc", root=tmp_path / "cgroup")
    expected = frozenset({4242, 4243})
    assert await f.pids() == {J: expected, ContainerId("j-2"): expected}


def tree(tmp: Path, cgroup_lines: str) -> tuple[Path, Path]:
    proc, root = tmp / "proc", tmp / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(cgroup_lines)
    return proc, root


def test_procs_come_from_the_containers_cgroup_v1_and_v2(tmp_path: Path) -> None:
    proc, root = tree(tmp_path / "v1", "3:cpu,cpuacct:/docker/abc\n")
    (root / "cpuacct/docker/abc").mkdir(parents=True)
    (root / "cpuacct/docker/abc/cgroup.procs").write_text("42\n57\n")
    counters = ContainerCounters(proc=proc, root=root)
    assert counters.procs("abc", lambda: 42) == frozenset({42, 57})
    (root / "cpuacct/docker/abc/cgroup.procs").write_text("")  # it ended
    assert counters.procs("abc", lambda: None) is None

    proc, root = tree(tmp_path / "v2", "0::/system.slice/docker-abc.scope\n")
    (root / "system.slice/docker-abc.scope").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "system.slice/docker-abc.scope/cgroup.procs").write_text("42\n")
    assert ContainerCounters(proc=proc, root=root).procs("abc", lambda: 42) == frozenset({42})


def test_cpu_totals_sum_increments_per_container_never_negative() -> None:
    t = CpuTotals()
    assert t.add({"a": 5.0}, now=100.0) == (0.0, 0.0)  # the first sample is the baseline
    assert t.add({"a": 6.0, "b": 2.0}, now=101.0) == (3.0, 1.0)  # b is new: all of it counts
    assert t.add({"a": 1.0}, now=103.0) == (0.0, 2.0)  # a restarted: no negative increment
    assert t.add({"a": 1.5}, now=104.0) == (0.5, 1.0)
    assert t.cumulative == 3.5
