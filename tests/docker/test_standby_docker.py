"""Standby containers against a real private engine, on the CPU (no GPU here: the standbys hold
no device request, ``gpu_devices=False``, and take jobs without GPUs; torch is primed on the
CPU). The job is the built-in workloads' GRU (``python -m specon.workloads``) in the
host-Python image (``tests/rootfs.py``), which has torch through its read-only binds.

The hand-over passes the job's directory as a detached mount (``open_tree``), which needs
CAP_SYS_ADMIN: the engines here run as root, and so does this test (it skips otherwise).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from specon.runtime import ContainerState, JobSpec
from specon.runtime.docker.backend import DockerRuntime
from specon.runtime.docker.recipe import LABEL_JOB, Bind, Recipe
from specon.runtime.docker.standby import LABEL_STANDBY, SOCKET_DIR_INSIDE, StandbyConfig
from specon.runtime.docker.standby_pool import detached_clone
from specon.runtime.volume import JobPaths
from tests.docker import test_runtime_docker as rd
from tests.docker.engines import Engine
from tests.rootfs import host_binds

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

volume = rd.volume  # the fixture: a fresh shared volume per test
BINDS = tuple(Bind(h, c) for h, c in host_binds())


@pytest.fixture(autouse=True)
def _open_tree(tmp_path: Path) -> None:
    try:
        os.close(detached_clone(tmp_path))
    except OSError as exc:
        pytest.skip(f"the hand-over needs open_tree (CAP_SYS_ADMIN, Linux >= 5.2): {exc}")


def config(image: str) -> StandbyConfig:
    return StandbyConfig(images=(image,), gpus=(0,), gpu_devices=False, python=sys.executable, binds=BINDS)


def gru(image: str, volume: Path, *args: str) -> Recipe:
    command = (sys.executable, "-m", "specon.workloads", "--model", "gru", "--device", "cpu", *args)
    return Recipe(image=image, command=command, binds=BINDS, volume_target=str(volume), nano_cpus=int(1e9))


def spec(job: str, r: Recipe) -> JobSpec:
    return JobSpec(id=job, command=r.command, steps=None, template=r.to_json())


def runtime(engine: Engine, volume: Path, image: str) -> DockerRuntime:
    return DockerRuntime(volume, "host-1", engine.client(), rules=rd.rules(volume), standby=config(image))


async def wait_ready(rt: DockerRuntime, timeout: float = 120.0) -> str:
    """The id of the standby container once it is primed and connected."""
    assert rt.standbys is not None
    deadline = time.monotonic() + timeout
    while not all(rt.standbys.ready().values()):
        assert time.monotonic() < deadline, "the standby never became ready"
        await asyncio.sleep(0.2)
    (c,) = [
        c for c in rt.client.containers.list(filters={"label": LABEL_STANDBY}) if c.name.startswith("specon_")
    ]
    return str(c.id)


def loss_steps(volume: Path, job: str) -> list[int]:
    return [int(r["step"]) for r in rd.records(volume, job) if "loss" in r]


async def test_a_job_handed_to_a_standby_runs_as_any_job_and_restores_through_the_next(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    rt = runtime(docker_engine, volume, python_images)
    assert rt.standbys is not None and rt.standbys.off is None
    other = JobPaths(volume, "other-1")
    other.create()
    untouched = sorted(other.dir.rglob("*"))
    first = await wait_ready(rt)
    job = "sb-1"
    s = spec(
        job, gru(python_images, volume, "--steps", "400", "--checkpoint-every", "100000", "--log-every", "10")
    )
    info = await rt.start(s)
    assert rt.standbys.launches == 1 and info.handle == first and info.state is ContainerState.RUNNING
    c = docker_engine.client().containers.get(first)
    assert c.name == job and LABEL_JOB not in c.labels  # renamed: labels cannot change
    # Its only mounts: the read-only binds and the agent's socket directory, read-only. The job
    # directory came as a descriptor; the volume is not mounted at all.
    mounts = {m["Destination"]: m["RW"] for m in c.attrs["Mounts"]}
    assert mounts == {**{b.target: False for b in BINDS}, SOCKET_DIR_INSIDE: False}
    assert info.cpu_limit == 1.0 and info.started_at >= time.time() - 60
    await rd.wait_step(volume, job, 20)
    # Weighted, frozen, thawed and its PIDs found exactly as a job container.
    assert await rt.set_cpu_weight(job, 500)
    c.reload()
    assert c.attrs["HostConfig"]["CpuShares"] == 5120
    assert await rt.freeze(job)
    await asyncio.sleep(0.3)
    frozen_at = loss_steps(volume, job)[-1]
    await asyncio.sleep(1.0)
    assert loss_steps(volume, job)[-1] == frozen_at
    pids = (await rt.pids())[job]
    assert docker_engine.client().api.inspect_container(first)["State"]["Pid"] in pids
    assert await rt.thaw(job)
    await rd.wait_step(volume, job, frozen_at + 20)
    # Saved like any job: SIGTERM reaches it through the keeper, it checkpoints and exits.
    saved = await rt.save(job, grace=30)
    assert not saved.forced and saved.step is not None and saved.step >= 40
    assert await rt.list_containers() == []
    # A fresh standby replaced it; the restore goes through that one and trains on.
    second = await wait_ready(rt)
    assert second != first
    t0 = time.monotonic()
    restored = await rt.start(rt.job_spec(job) or s, checkpoint=saved.checkpoint)
    assert restored.handle == second and rt.standbys.launches == 2
    await rd.wait_finished(rt, job, timeout=180)
    took = time.monotonic() - t0
    steps = loss_steps(volume, job)
    assert steps[-1] == 400 and JobPaths(volume, job).finished()
    after = [st for st in steps if st > saved.step]
    assert after == list(range(saved.step // 10 * 10 + 10, 401, 10)), "steps lost or trained twice"
    starts = [r for r in rd.records(volume, job) if r.get("event") == "started"]
    assert [r["resumed"] for r in starts] == [False, True] and starts[1]["step"] == saved.step
    # Its progress landed in its own directory only.
    assert sorted(p.name for p in (volume / "jobs").iterdir()) == ["other-1", job]
    assert sorted(other.dir.rglob("*")) == untouched
    print(f"restore through a standby to the end of 400 steps: {took:.1f} s")
    rt.close()
    assert docker_engine.client().containers.list(all=True, filters={"label": LABEL_STANDBY}) == [
        docker_engine.client().containers.get(second)
    ]  # the idle one is gone, the job's ended container stays until forgotten


async def test_without_a_ready_standby_or_for_another_job_the_start_is_cold(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    rt = runtime(docker_engine, volume, python_images)
    assert rt.standbys is not None
    # Just created, the standby is still priming: the start is cold, as before.
    cold = await rt.start(spec("cold-1", gru(python_images, volume, "--steps", "30")))
    c = docker_engine.client().containers.get(cold.handle)
    assert rt.standbys.launches == 0 and c.labels[LABEL_JOB] == "cold-1" and LABEL_STANDBY not in c.labels
    await wait_ready(rt)
    # A job of another command (a script) or with a memory limit never uses one.
    script = rd.recipe(python_images, volume, "--steps", "30")
    await rt.start(rd.spec("cold-2", script))
    limited = replace(gru(python_images, volume, "--steps", "30"), mem_limit=2**30)
    await rt.start(spec("cold-3", limited))
    assert rt.standbys.launches == 0
    for job in ("cold-1", "cold-2", "cold-3"):
        await rd.wait_finished(rt, job, timeout=120)
    assert loss_steps(volume, "cold-1")[-1] == 30
    # Stopped like any job, the one handed to the standby.
    await rt.start(spec("sb-2", gru(python_images, volume, "--steps", "100000")))
    assert rt.standbys.launches == 1
    await rd.wait_step(volume, "sb-2", 10)
    stopped = await rt.stop("sb-2", grace=20)
    assert not stopped.alive
    rt.close()
    # A restarted agent removes the idle standbys its predecessor left, and starts its own.
    again = runtime(docker_engine, volume, python_images)
    assert again.standbys is not None
    await wait_ready(again)
    jobs = {i.id for i in await again.list_containers()}
    assert jobs == {"cold-1", "cold-2", "cold-3", "sb-2"} and again.skipped_records == 0
    again.close()
