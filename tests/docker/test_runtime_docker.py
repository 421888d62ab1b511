"""The Docker backend against real engines: two ``dockerd`` as two hosts, one shared volume.

The job is ``tests/integration/jobs/curve_job.py`` (jobkit: checkpoints on SIGTERM, resumes
from its newest checkpoint, records ``trained`` = the steps its restored state has counted),
run in the host-Python image (``tests/rootfs.py``). "Nothing lost" is checked the same way
everywhere: the job finishes, and its last record has ``trained == steps``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from specon_agent.core import Agent

from specon.config import Policy
from specon.fence import EXIT_FENCED
from specon.model import ContainerId
from specon.runtime import AlreadyRunning, ContainerState, JobSpec, StartFailed
from specon.runtime.docker.backend import DockerRuntime
from specon.runtime.docker.engine import cpu_seconds
from specon.runtime.docker.recipe import LABEL_JOB, LABEL_MANAGED, Bind, HostRules, Recipe
from specon.runtime.volume import JobPaths
from specon.testing.held_jobs import finished_steps, release, release_file
from specon.testing.progress_log import job_records
from specon.wire.protocol import Action, Command
from tests.docker.engines import Engine, job_binds, python_image, start_engine, stop_engine
from tests.rootfs import REPO, host_binds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CURVE_JOB = REPO / "tests/integration/jobs/curve_job.py"


def rules(volume: Path) -> HostRules:
    return HostRules(volume=str(volume), ro_bind_prefixes=tuple(h for h, _ in host_binds()))


def recipe(image: str, volume: Path, *args: str) -> Recipe:
    return Recipe(
        image=image,
        command=(sys.executable, str(CURVE_JOB), *args),
        binds=tuple(Bind(h, c) for h, c in host_binds()),
        volume_target=str(volume),
        nano_cpus=int(0.5e9),
    )


def spec(job: str, r: Recipe) -> JobSpec:
    return JobSpec(id=job, command=r.command, steps=None, template=r.to_json())


def records(volume: Path, job: str) -> list[dict[str, Any]]:
    return job_records(volume, job)


async def wait_step(volume: Path, job: str, step: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r.get("step", 0) >= step and "loss" in r for r in records(volume, job)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} never reached step {step}: {records(volume, job)[-3:]}")


async def wait_finished(rt: DockerRuntime, job: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        infos = {i.id: i for i in await rt.list_containers()}
        if job in infos and not infos[job].alive:
            assert infos[job].state is ContainerState.EXITED, infos[job]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{job} did not finish on {rt.worker}")


def assert_exact(volume: Path, job: str, steps: int) -> None:
    trained = [r for r in records(volume, job) if "trained" in r]
    assert trained[-1]["step"] == steps
    assert trained[-1]["trained"] == steps, "progress was lost or counted twice"
    assert JobPaths(volume, job).finished()


# A job the test must act on while it runs (save it, kill its agent, stop its engine) is
# started held: it trains its steps and then goes on training until the test releases it
# (curve_job's ``--until-released``), so no loaded machine can let it complete first.


def held(volume: Path, job: str) -> tuple[str, str]:
    """The curve job's arguments holding ``job`` until :func:`release`: a file on the shared
    volume, which its container sees at the same path."""
    return ("--until-released", str(release_file(volume, job)))


def assert_exact_released(volume: Path, job: str, steps: int) -> None:
    """:func:`assert_exact` for a held job: at least its ``steps``, exactly the total it
    finished with."""
    total = finished_steps(volume, job)
    assert total >= steps
    assert_exact(volume, job, total)


@pytest.fixture
def volume() -> Any:
    with tempfile.TemporaryDirectory(prefix="sd-vol-") as d:
        yield Path(d)


def runtimes(engines: tuple[Engine, Engine], volume: Path) -> tuple[DockerRuntime, DockerRuntime]:
    e1, e2 = engines
    return (
        DockerRuntime(volume, "host-1", e1.client(), rules=rules(volume)),
        DockerRuntime(volume, "host-2", e2.client(), rules=rules(volume)),
    )


async def test_a_job_moved_between_engines_finishes_exactly_its_steps(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    rt1, rt2 = runtimes(docker_engines, volume)
    args = ("--steps", "120", "--checkpoint-every", "1000", *held(volume, "move-1"))
    s = spec("move-1", recipe(python_images, volume, *args))
    info = await rt1.start(s)
    assert info.state is ContainerState.RUNNING and info.cpu_limit == 0.5
    await wait_step(volume, "move-1", 30)
    with pytest.raises(AlreadyRunning):  # never twice: the other engine refuses
        await rt2.start(s)
    saved = await rt1.save("move-1", grace=20)
    assert not saved.forced and not saved.rolled_back and saved.step is not None and saved.step >= 30
    assert await rt1.list_containers() == []  # the source's container is gone after a save
    release(release_file(volume, "move-1"))  # saved: the restored job may finish
    moved = await rt2.start(rt2.job_spec("move-1") or s, checkpoint=saved.checkpoint)
    assert moved.worker == "host-2"
    await wait_finished(rt2, "move-1")
    assert_exact_released(volume, "move-1", 120)
    workers = {r.get("worker") for r in records(volume, "move-1") if "worker" in r}
    assert workers <= {"host-1", "host-2"}


async def test_a_restarted_agent_readopts_its_containers_and_weights_them(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    rt1, _ = runtimes(docker_engines, volume)
    # Held (never released: it is stopped): it must run while its usage is read.
    s = spec("adopt-1", recipe(python_images, volume, "--steps", "400", *held(volume, "adopt-1")))
    await rt1.start(s)
    again = DockerRuntime(volume, "host-1", docker_engines[0].client(), rules=rules(volume))
    (info,) = await again.list_containers()
    assert info.id == "adopt-1" and info.state is ContainerState.RUNNING
    assert await again.set_cpu_weight("adopt-1", 500)
    c = docker_engines[0].client().containers.get(info.handle)
    assert c.attrs["HostConfig"]["CpuShares"] == 5120
    await wait_step(volume, "adopt-1", 5)
    await again.usage()
    await asyncio.sleep(1.0)
    usage = await again.usage()
    assert usage.enforcement == "docker" and dict(usage.per_container)["adopt-1"] > 0
    # Read from the container's cgroup: the counter the engine's own stats report.
    engine_says = cpu_seconds(c)
    assert engine_says is not None and abs(dict(usage.per_container)["adopt-1"] - engine_says) < 1.0
    assert 0 < usage.cpu_utilisation <= 1
    await again.stop("adopt-1", grace=10)
    await again.forget("adopt-1")
    assert await again.list_containers() == []


async def test_a_container_a_user_started_is_adopted_and_moved(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    e1, _ = docker_engines
    paths = JobPaths(volume, "user-1")
    paths.create()
    env = {
        "SPECON_PROGRESS_FILE": str(paths.progress),
        "SPECON_CHECKPOINT_DIR": str(paths.checkpoints),
        "SPECON_DONE_FILE": str(paths.done),
        "SPECON_WORKER": "host-1",
    }
    command = [sys.executable, str(CURVE_JOB), "--steps", "100", "--checkpoint-every", "1000"]
    e1.client().containers.run(
        python_images,
        [*command, *held(volume, "user-1")],  # held: still training when it is saved
        name="user-1",
        labels={LABEL_MANAGED: "true", LABEL_JOB: "user-1"},
        environment=env,
        volumes=job_binds(volume),
        network_mode="none",
        detach=True,
    )
    await wait_step(volume, "user-1", 10)
    rt1, rt2 = runtimes(docker_engines, volume)
    (info,) = await rt1.list_containers()
    assert info.id == "user-1" and info.alive
    saved = await rt1.save("user-1", grace=20)
    release(release_file(volume, "user-1"))  # saved: the restored job may finish
    recorded = rt2.job_spec("user-1")
    assert recorded is not None and recorded.template is not None
    assert Recipe.from_json(recorded.template).volume_target == str(volume)
    await rt2.start(recorded, checkpoint=saved.checkpoint)
    await wait_finished(rt2, "user-1")
    assert_exact_released(volume, "user-1", 100)


async def test_a_job_deaf_to_sigterm_is_killed_at_the_grace_period_and_resumes(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    rt1, rt2 = runtimes(docker_engines, volume)
    s = spec(
        "deaf-1",
        recipe(
            python_images,
            volume,
            *("--steps", "80", "--checkpoint-every", "10", "--ignore-sigterm"),
            *held(volume, "deaf-1"),  # still training when the engine kills it
        ),
    )
    await rt1.start(s)
    await wait_step(volume, "deaf-1", 25)
    saved = await rt1.save("deaf-1", grace=1.0)
    # Killed at the grace period: what it resumes from is its last periodic checkpoint.
    assert saved.forced and saved.step is not None and saved.step % 10 == 0
    release(release_file(volume, "deaf-1"))  # killed: the restored job may finish
    await rt2.start(s, checkpoint=saved.checkpoint)
    await wait_finished(rt2, "deaf-1")
    assert_exact_released(volume, "deaf-1", 80)


async def test_this_host_refuses_a_recipe_it_does_not_allow(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    rt1, _ = runtimes(docker_engines, volume)
    base = recipe(python_images, volume, "--steps", "10")
    for bad in (
        replace(base, binds=(Bind("/etc", "/etc"),)),
        replace(base, network_mode="bridge"),
        replace(base, binds=(Bind(str(volume), "/elsewhere"),)),
    ):
        with pytest.raises(StartFailed, match="refuses"):
            await rt1.start(spec("bad-1", bad))
    assert await rt1.list_containers() == []
    # A privileged container is never adopted: its privilege would travel with its recipe.
    docker_engines[0].client().containers.run(
        python_images,
        ["sleep", "30"],
        name="priv-1",
        labels={LABEL_MANAGED: "true"},
        cap_add=["SYS_ADMIN"],
        network_mode="none",
        volumes=job_binds(volume),
        detach=True,
    )
    again = DockerRuntime(volume, "host-1", docker_engines[0].client(), rules=rules(volume))
    assert await again.list_containers() == []


SAVE_IN_A_PROCESS = r"""
import asyncio, sys
from pathlib import Path
import docker
from specon.runtime.docker.backend import DockerRuntime
from specon.runtime.docker.recipe import HostRules
volume, url, prefixes = Path(sys.argv[1]), sys.argv[2], tuple(sys.argv[3:])
rt = DockerRuntime(volume, "host-1", docker.DockerClient(base_url=url),
                   rules=HostRules(volume=str(volume), ro_bind_prefixes=prefixes))
print("saving", flush=True)
asyncio.run(rt.save("kill-1", grace=30))
"""


async def test_a_copy_that_dies_at_start_fails_its_start_and_the_source_may_run_the_job(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    # The target's agent launches the restored copy, which crashes loading its checkpoint.
    # Its start is reported failed (not done with the job running nowhere), and the dead
    # container is forgotten: a record of another engine would count as running for ever,
    # so the source's engine could never start the job again.
    rt1, rt2 = runtimes(docker_engines, volume)
    crash = JobPaths(volume, ContainerId("die-1")).dir / "crash-on-restore"
    args = ("--steps", "80", "--crash-on-restore", str(crash), *held(volume, "die-1"))
    s = spec("die-1", recipe(python_images, volume, *args))
    await rt1.start(s)
    await wait_step(volume, "die-1", 20)
    saved = await rt1.save("die-1", grace=20)
    assert saved.checkpoint is not None
    crash.touch()  # the next checkpoint load crashes

    target = Agent(runtime=rt2, policy=Policy(), address="host-2:7701")
    start = Command(id="m1:start:host-2:0", action=Action.START, container=ContainerId("die-1"),
                    deadline=time.time() + 60, migration="m1", checkpoint=str(saved.checkpoint))  # fmt: skip
    res = await target.execute(start, 60.0)

    assert not res.ok and res.detail == {"died": True}, res
    assert res.error is not None and "(exit code 1)" in res.error
    assert not crash.exists(), "the copy on host-2 loaded the checkpoint and crashed"
    assert await rt2.list_containers() == []
    release(release_file(volume, "die-1"))
    await rt1.start(rt1.job_spec(ContainerId("die-1")) or s, checkpoint=saved.checkpoint)
    await wait_finished(rt1, "die-1")
    assert_exact_released(volume, "die-1", 80)


async def test_an_agent_killed_mid_save_loses_nothing(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    e1, _ = docker_engines
    rt1, _ = runtimes(docker_engines, volume)
    # Held: still training when the agent's SIGTERM comes, however slowly that agent starts.
    s = spec(
        "kill-1",
        recipe(python_images, volume, "--steps", "80", "--save-seconds", "3", *held(volume, "kill-1")),
    )
    await rt1.start(s)
    await wait_step(volume, "kill-1", 20)
    agent = subprocess.Popen(
        [sys.executable, "-c", SAVE_IN_A_PROCESS, str(volume), e1.url, *(h for h, _ in host_binds())],
        stdout=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert agent.stdout is not None
    while agent.stdout.readline().strip() != b"saving":  # its log lines come first
        assert agent.poll() is None
    deadline = time.monotonic() + 30
    while not any(r.get("event") == "saving" for r in records(volume, "kill-1")):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    agent.send_signal(signal.SIGKILL)  # mid-save: the job is writing its checkpoint
    agent.wait()
    # The restarted agent finds the ended container; the manager's rollback starts it again.
    restarted = DockerRuntime(volume, "host-1", e1.client(), rules=rules(volume))
    await wait_finished_or_exited(restarted, "kill-1")
    release(release_file(volume, "kill-1"))  # stopped mid-save: the restarted job may finish
    await restarted.start(s)
    await wait_finished(restarted, "kill-1")
    assert_exact_released(volume, "kill-1", 80)


async def wait_finished_or_exited(rt: DockerRuntime, job: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        infos = {i.id: i for i in await rt.list_containers()}
        if job in infos and not infos[job].alive:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{job} still runs")


async def test_an_engine_restarted_mid_run_loses_nothing(python_images: str, volume: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="sd-r-", dir="/tmp"))
    engine = start_engine("host-r", base)
    try:
        python_image(engine)
        rt = DockerRuntime(volume, "host-r", engine.client(), rules=rules(volume))
        args = ("--steps", "100", "--checkpoint-every", "1000", *held(volume, "restart-1"))
        s = spec("restart-1", recipe(python_images, volume, *args))
        await rt.start(s)
        await wait_step(volume, "restart-1", 20)
        stop_engine_keeping_containers(engine)  # dockerd stops its containers with SIGTERM
        engine = start_engine("host-r", base)
        rt = DockerRuntime(volume, "host-r", engine.client(), rules=rules(volume))
        (info,) = await rt.list_containers()
        assert not info.alive
        release(release_file(volume, "restart-1"))  # stopped with its engine: the restarted job may finish
        await rt.start(s)
        await wait_finished(rt, "restart-1")
        assert_exact_released(volume, "restart-1", 100)
    finally:
        stop_engine(engine)
        subprocess.run(["rm", "-rf", str(base)], check=False)


def stop_engine_keeping_containers(engine: Engine) -> None:
    for c in engine.clients:
        c.close()
    engine.clients.clear()
    engine.process.send_signal(signal.SIGTERM)
    engine.process.wait(timeout=60)


async def test_a_lost_engines_copy_that_never_checks_its_generation_is_killed_when_it_comes_back(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    # A plain container (no jobkit: it never looks at generation.json) on host-1, superseded by
    # a start on host-2 while host-1 was taken for lost: the first time host-1's runtime lists
    # its containers again, it kills the stale copy and does not report it.
    e1, e2 = docker_engines
    rt1, rt2 = runtimes(docker_engines, volume)
    deaf = replace(
        recipe(python_images, volume), command=(sys.executable, "-c", "import time\nwhile 1: time.sleep(1)")
    )
    s = spec("plain-1", deaf)
    await rt1.start(s)
    assert [c.id for c in await rt1.list_containers() if c.alive] == ["plain-1"]
    await rt2.start(rt2.job_spec(ContainerId("plain-1")) or s, supersede=True)
    assert [c.id for c in await rt1.list_containers() if c.alive] == [], "the stale copy is not reported"
    (stale,) = e1.client().containers.list(all=True, filters={"label": f"{LABEL_JOB}=plain-1"})
    deadline = time.monotonic() + 30
    while (stale.reload(), stale.status)[1] == "running":
        assert time.monotonic() < deadline, "the stale copy still runs"
        await asyncio.sleep(0.2)
    assert [c.id for c in await rt2.list_containers() if c.alive] == ["plain-1"], "the new copy runs on"
    (fresh,) = e2.client().containers.list(filters={"label": f"{LABEL_JOB}=plain-1"})
    assert fresh.status == "running"
    await rt2.stop(ContainerId("plain-1"), grace=1)


async def test_a_start_that_supersedes_a_lost_engines_run_fences_it_and_the_job_keeps_exactly_its_steps(
    docker_engines: tuple[Engine, Engine], python_images: str, volume: Path
) -> None:
    # host-1 is cut off while its job trains: host-2 cannot verify that run, so a plain start
    # is refused (never twice); once the manager takes host-1 for lost, its start supersedes
    # the run in a new generation, and the stale copy stops at its next step without writing.
    e1, _ = docker_engines
    rt1, rt2 = runtimes(docker_engines, volume)
    args = ("--steps", "120", "--checkpoint-every", "10", *held(volume, "fence-1"))
    s = spec("fence-1", recipe(python_images, volume, *args))
    await rt1.start(s)
    await wait_step(volume, "fence-1", 15)
    with pytest.raises(AlreadyRunning):
        await rt2.start(rt2.job_spec(ContainerId("fence-1")) or s)
    await rt2.start(rt2.job_spec(ContainerId("fence-1")) or s, supersede=True)
    assert JobPaths(volume, ContainerId("fence-1")).read_generation() == 2
    stale = e1.client().containers.list(all=True, filters={"label": f"{LABEL_JOB}=fence-1"})[0]
    deadline = time.monotonic() + 60
    while (stale.reload(), stale.status)[1] != "exited":
        assert time.monotonic() < deadline, "the stale copy still runs"
        await asyncio.sleep(0.2)
    assert stale.attrs["State"]["ExitCode"] == EXIT_FENCED
    release(release_file(volume, "fence-1"))
    await wait_finished(rt2, "fence-1")
    # One sequence of steps: the stale copy wrote nothing once the new generation started.
    assert_exact_released(volume, "fence-1", 120)
