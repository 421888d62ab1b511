"""GPUs on Docker hosts against a real private engine: the GPU device request as the engine
stores it, the host rule that refuses it, freezing a job (``docker pause``) and its host PIDs.

There is no GPU here: the engine accepts the create of a container with a GPU device request
(it keeps ``HostConfig.DeviceRequests``), and its *start* fails for want of the NVIDIA driver
(asserted as that clear error; where the NVIDIA container toolkit is installed, the start is
skipped saying so). Freezing and PIDs need no GPU: the job is a CPU process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import docker
import docker.errors
import pytest

from specon.model import GPU_MEMORY_NEED_LABEL, GPU_PRODUCT_LABEL, ContainerId, WorkerId
from specon.runtime import ContainerState, StartFailed
from specon.runtime.base import SaveFailed
from specon.runtime.docker.backend import DockerRuntime
from specon.runtime.docker.engine import create_kwargs, top_pids
from specon.runtime.docker.recipe import from_inspect, gpu_request, problems
from specon.runtime.volume import JobPaths
from tests.docker import test_runtime_docker as rd
from tests.docker.engines import Engine, job_binds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

volume = rd.volume  # the fixture: a fresh shared volume per test
NO_NVIDIA = "could not select device driver"


def gpu_runtime(engine: Engine, volume: Path, gpus: int = 1) -> DockerRuntime:
    rules = replace(rd.rules(volume), gpus=gpus)
    return DockerRuntime(
        volume, WorkerId("host-1"), engine.client(), rules=rules, gpu_product="NVIDIA H100 80GB HBM3"
    )


def nvidia_toolkit() -> str | None:
    for name in ("nvidia-container-runtime-hook", "nvidia-container-cli", "nvidia-ctk"):
        if shutil.which(name):
            return name
    return None


async def test_the_engine_stores_the_gpu_request_exactly_and_reads_back(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    rt = gpu_runtime(docker_engine, volume)
    recipe = replace(rd.recipe(python_images, volume, "--steps", "5"), device_requests=(gpu_request(1),))
    assert problems(recipe, rt.rules) == []
    spec = rd.spec("gpu-1", recipe)
    job_dir = JobPaths(volume, ContainerId("gpu-1")).dir
    kwargs = create_kwargs(spec, recipe, run_id="f" * 32, worker=rt.worker, job_dir=job_dir)
    client = docker_engine.client()
    c = client.containers.create(**kwargs)  # the engine accepts a GPU request it cannot serve yet
    attrs = client.api.inspect_container(c.id)
    (stored,) = attrs["HostConfig"]["DeviceRequests"]
    assert stored["Driver"] == "nvidia" and stored["Count"] == 1
    assert stored["Capabilities"] == [["gpu"]] and not stored.get("DeviceIDs") and not stored.get("Options")
    # Read back, it is the same request (and no more: the engine's ids would not be carried).
    back = from_inspect(attrs, volume=str(volume), all_gpus=1)
    assert back.device_requests == (gpu_request(1),)
    if tool := nvidia_toolkit():
        pytest.skip(f"the NVIDIA container toolkit ({tool}) is here: the start would take a GPU")
    with pytest.raises(docker.errors.APIError, match=NO_NVIDIA):
        c.start()
    c.remove(force=True)


async def test_a_gpu_job_starts_only_where_the_host_allows_gpus(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    recipe = replace(
        rd.recipe(python_images, volume, "--steps", "5"),
        device_requests=(gpu_request(1),),
        labels=((GPU_MEMORY_NEED_LABEL, "16Gi"),),
    )
    spec = rd.spec("gpu-2", recipe)
    no_gpus = gpu_runtime(docker_engine, volume, gpus=0)
    assert no_gpus.capacity.gpu == 0
    with pytest.raises(StartFailed, match="this host allows none"):
        await no_gpus.start(spec)
    assert docker_engine.client().containers.list(all=True) == []  # nothing was created
    allowed = gpu_runtime(docker_engine, volume, gpus=1)
    assert allowed.capacity.gpu == 1
    if tool := nvidia_toolkit():
        pytest.skip(f"the NVIDIA container toolkit ({tool}) is here: the start would take a GPU")
    # Allowed here, the engine itself cannot serve it without the NVIDIA driver: a clear
    # failure, no container and no owner record left behind.
    with pytest.raises(StartFailed, match=NO_NVIDIA):
        await allowed.start(spec)
    assert docker_engine.client().containers.list(all=True) == []
    assert JobPaths(volume, ContainerId("gpu-2")).read_owner() is None
    # What it recorded for placement: one GPU, 16 GiB of it, the product it would run on.
    recorded = allowed.job_spec(ContainerId("gpu-2"))
    assert recorded is not None and recorded.requests.gpu == 1 and recorded.gpu_memory == 16 * 2**30
    assert (GPU_PRODUCT_LABEL, "NVIDIA-H100-80GB-HBM3") in recorded.selector


def steps(volume: Path, job: str) -> int:
    return max((r.get("step", 0) for r in rd.records(volume, job) if "loss" in r), default=0)


async def progress_over(volume: Path, job: str, seconds: float) -> int:
    before = steps(volume, job)
    await asyncio.sleep(seconds)
    return steps(volume, job) - before


async def test_freeze_stops_a_job_where_it_stands_and_thaw_resumes_it(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    rt = gpu_runtime(docker_engine, volume)
    job = ContainerId("frz-1")
    endless = rd.recipe(python_images, volume, "--steps", "100000", "--checkpoint-every", "100000")
    await rt.start(rd.spec(job, endless))
    await rd.wait_step(volume, job, 5)
    assert await progress_over(volume, job, 0.5) > 0
    assert await rt.freeze(job) and await rt.freeze(job)  # idempotent
    await asyncio.sleep(0.2)  # a record written as the freeze landed
    assert await progress_over(volume, job, 1.0) == 0
    (info,) = await rt.list_containers()
    assert info.state is ContainerState.RUNNING  # frozen, still its run
    # Its processes are still there, as this host numbers them (what NVML reports).
    pids = (await rt.pids())[job]
    init = docker_engine.client().api.inspect_container(info.handle)["State"]["Pid"]
    assert init in pids and all(Path(f"/proc/{p}").exists() for p in pids)
    c = docker_engine.client().containers.get(info.handle)
    assert top_pids(c) == pids  # the engine's top, the fallback, agrees with the cgroup
    assert await rt.thaw(job) and await rt.thaw(job)
    assert await progress_over(volume, job, 1.0) > 0
    assert not await rt.freeze(ContainerId("nowhere-1"))  # absent: False, no exception
    await rt.stop(job, grace=5)


async def test_a_frozen_job_is_thawed_to_save_and_resumes_exactly(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    rt1, rt2 = rd.runtimes(docker_engines, volume)
    job = ContainerId("frz-2")
    s = rd.spec(job, rd.recipe(python_images, volume, "--steps", "60", "--checkpoint-every", "1000"))
    await rt1.start(s)
    await rd.wait_step(volume, job, 10)
    assert await rt1.freeze(job)
    # The save thaws it: SIGTERM reaches it and it checkpoints (not killed at the grace).
    saved = await rt1.save(job, grace=20)
    assert not saved.forced and saved.step is not None and saved.step >= 10
    await rt2.start(rt2.job_spec(job) or s, checkpoint=saved.checkpoint)
    await rd.wait_finished(rt2, job)
    rd.assert_exact(volume, job, 60)


async def test_a_frozen_job_stops_and_stop_all_counts_it(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    rt = gpu_runtime(docker_engine, volume)
    for job in ("frz-3", "frz-4"):
        await rt.start(rd.spec(job, rd.recipe(python_images, volume, "--steps", "100000")))
        await rd.wait_step(volume, job, 3)
        assert await rt.freeze(ContainerId(job))
    info = await rt.stop(ContainerId("frz-3"), grace=10)
    assert not info.alive
    assert await rt.stop_all(grace=10) == 1
    assert all(not i.alive for i in await rt.list_containers())


async def test_a_save_this_host_could_not_restore_is_refused_and_the_job_runs_on(
    docker_engine: Engine, python_images: str, volume: Path
) -> None:
    # A user's container this host's rules would refuse to re-create (here: a bind outside
    # the allowed prefixes; with GPUs: a GPU request on a host that allows none).
    env = {"SPECON_PROGRESS_FILE": str(JobPaths(volume, ContainerId("user-9")).progress)}
    JobPaths(volume, ContainerId("user-9")).create()
    binds = job_binds(volume)
    extra = Path(volume.parent / f"{volume.name}-extra")
    extra.mkdir()
    try:
        binds[str(extra)] = {"bind": "/extra", "mode": "ro"}
        docker_engine.client().containers.run(
            python_images,
            [sys.executable, str(rd.CURVE_JOB), "--steps", "100000"],
            name="user-9",
            labels={"specon.io/managed": "true"},
            environment=env,
            volumes=binds,
            network_mode="none",
            detach=True,
        )
        await rd.wait_step(volume, "user-9", 3)
        rt = gpu_runtime(docker_engine, volume)
        with pytest.raises(SaveFailed, match="keeps running: this host refuses its recipe"):
            await rt.save(ContainerId("user-9"), grace=5)
        (info,) = await rt.list_containers()
        assert info.alive
        await rt.stop(ContainerId("user-9"), grace=5)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(extra)
