"""Host loss on the local runtime and on Docker hosts: the host dies -> the job's first step
on another host (target <= recovery.after + 5 s), and the steps each recovery redoes (target
<= the job's checkpoint interval).

Each run is an embedded cluster (real manager, two real agents) with the shipped default
policy (heartbeats every 5 s, a worker unreachable after 20 s, lost after
``recovery.after`` = 60 s; rebalancing off so that nothing else moves the job). A curve job
checkpointing every 50 steps trains on w0; after its first checkpoint (once the manager has
heard of the job: one it never heard of cannot be restored) the host dies, with no goodbye
and no save. Two set-ups, interleaved run by run:

* local - the local runtime on this machine: w0's agent and the job's processes SIGKILLed
  together;
* Docker hosts - the manager and each agent on a network host of its own
  (``specon.testing.net_hosts``, over TLS), each agent beside its own Docker engine in its
  host, the job a container of the host-Python image, as in
  ``tests/integration/test_recovery_docker_hosts.py``: every process in w0's host and below
  it SIGKILLed at once (agent, dockerd, containerd, shims, the container's processes:
  ``specon.testing.host_kill``). Where network hosts or a Docker engine cannot be made here,
  the benchmark says why and reports the local figures only.

Times from the first SIGKILL, on this machine's clock, from the job's own progress log:

* first step - the first training record the resumed run writes (on w1);
* redone     - the steps the dead run had trained past the checkpoint the new run resumed
  from: what the loss cost.

Median of 5 runs of each (1 with ``--quick``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._proc import quiet_logs
from bench.figures import Figure
from specon.config import default_policy
from specon.embedded.cluster import EmbeddedCluster
from specon.embedded.docker_hosts import DockerUnavailable
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.volume import JobPaths
from specon.testing import net_hosts
from specon.testing.host_kill import in_image, kill_host
from specon.testing.progress_log import job_records

JOB = Path(__file__).resolve().parents[1] / "tests" / "integration" / "jobs" / "curve_job.py"
CHECKPOINT_EVERY = 50
W0, W1 = WorkerId("w0"), WorkerId("w1")
SLACK = 5.0  # the target: recovery.after + this
LOCAL, DOCKER = "local", "Docker hosts"


class SetupUnavailableError(RuntimeError):
    """The set-up cannot be made on this machine; the message says why."""


def _policy(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "policy.yaml"
    path.write_text('apiVersion: specon/v1alpha1\nkind: Policy\nrebalance: {mode: "off"}\n')
    return path


def _spec(jid: ContainerId) -> JobSpec:
    return JobSpec(
        id=jid,
        command=(sys.executable, str(JOB), "--steps", "1000000", "--curve", "linear",
                 "--step-seconds", "0.05", "--checkpoint-every", str(CHECKPOINT_EVERY)),
        steps=1_000_000,
        model="linear",
    )  # fmt: skip


def _processes(progress: Path) -> list[int]:
    """Every live process of the job, found by the progress file its environment names."""
    marker = f"SPECON_PROGRESS_FILE={progress}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
    return out


async def _until(cond: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not reach the expected state")
        await asyncio.sleep(0.05)


async def _lose(c: EmbeddedCluster, spec: JobSpec, kill: Callable[[], object]) -> tuple[float, int]:
    """``spec`` started on w0 and, after its first checkpoint, w0's host lost (``kill``):
    seconds from the kill to the first step elsewhere, steps redone."""
    jid = spec.id
    await c.submit(spec, W0)

    def records() -> list[dict[str, Any]]:
        return job_records(c.volume, jid)

    await _until(lambda: any(r.get("event") == "checkpoint" for r in records()), 120)
    # The manager must know the job (its first heartbeat listing it, up to 5 s later).
    deadline = time.monotonic() + 60
    while not any(x.id == jid and x.phase == "running" for x in (await c.status()).containers):
        if time.monotonic() > deadline:
            raise TimeoutError("the manager never listed the job")
        await asyncio.sleep(0.2)
    killed = time.time()
    kill()

    def resumed() -> bool:
        rs = records()
        starts = [k for k, r in enumerate(rs) if r.get("event") == "started"]
        return len(starts) > 1 and any("loss" in r for r in rs[starts[1] :])

    await _until(resumed, 300)
    rs = records()
    first_run, second_run = [k for k, r in enumerate(rs) if r.get("event") == "started"][:2]
    resumed_from = int(rs[second_run]["step"])
    first = next(float(r["ts"]) for r in rs[second_run:] if "loss" in r)
    dead = [int(r["step"]) for r in rs[first_run:second_run] if "loss" in r]
    return first - killed, (dead[-1] - resumed_from if dead else 0)


async def _local(root: Path, i: int) -> tuple[float, int]:
    """One host loss on the local runtime: w0's agent and the job's processes SIGKILLed."""
    spec = _spec(ContainerId(f"lost-{i}"))
    async with EmbeddedCluster(root, workers=2, cpus_per_worker=1.0, policy=_policy(root)) as c:

        def kill() -> None:
            c.kill(c.agents[W0])
            for pid in _processes(JobPaths.of(c.volume, spec.id).progress):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        try:
            return await _lose(c, spec, kill)
        finally:
            if c.manager is not None:
                c.kill(c.manager)


async def _docker(root: Path, i: int) -> tuple[float, int]:
    """One host loss on Docker hosts: everything in w0's network host and below it SIGKILLed
    (``kill_host``). ``SetupUnavailableError`` where the hosts or the engines cannot be made."""
    if why := net_hosts.available():
        raise SetupUnavailableError(f"network hosts need namespaces: {why}")
    spec = in_image(_spec(ContainerId(f"lost-docker-{i}")))
    with net_hosts.NetHosts(3) as hosts:
        tls = None
        if importlib.util.find_spec("cryptography") is not None:  # the dev extra
            from specon.testing.certs import manager_tls  # noqa: PLC0415

            tls = manager_tls(root, hosts[0].address)
        c = EmbeddedCluster(
            root / "c",
            workers=2,
            cpus_per_worker=1.0,
            policy=_policy(root),
            hosts=list(hosts),
            tls=tls,
            runtime="docker",
        )
        try:
            await c.start()
        except ImportError as err:  # the docker SDK (the docker extra)
            raise SetupUnavailableError(f"no Docker SDK: {err}") from err
        except DockerUnavailable as err:
            raise SetupUnavailableError(f"no Docker engine here: {err}") from err
        try:
            return await _lose(c, spec, lambda: kill_host(c, W0, hosts[1]))
        finally:
            # The manager SIGKILLed first (it would wait out long polls), then the agents and
            # engines stopped, the dead host's among them.
            if c.manager is not None:
                c.kill(c.manager)
            await c.stop()


def _figures(setup: str, results: list[tuple[float, int]], after: float) -> list[Figure]:
    n = len(results)
    times, steps = [t for t, _ in results], [r for _, r in results]
    spread = (
        f"median of {n}; {min(times):.1f}-{max(times):.1f} s; recovery.after {after:g} s, default heartbeats"
    )
    redone = "steps redone per host loss (checkpoint every 50)"
    if setup != LOCAL:
        redone = f"steps redone per host loss, {setup} (checkpoint every 50)"
    return [
        Figure(f"host loss -> first step on another host ({setup})", statistics.median(times), "s",
               target=after + SLACK, detail=spread),
        Figure(redone, statistics.median(steps), "steps",
               target=CHECKPOINT_EVERY, detail=f"median of {n}; {min(steps)}-{max(steps)}"),
    ]  # fmt: skip


def run(quick: bool = False) -> list[Figure]:
    n = 1 if quick else 5
    after = default_policy().recovery.after
    results: dict[str, list[tuple[float, int]]] = {LOCAL: [], DOCKER: []}
    docker_off: str | None = None
    with quiet_logs(), tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for i in range(n):  # interleaved: a drift of the machine's load hits both set-ups alike
            for setup, one in ((LOCAL, _local), (DOCKER, _docker)):
                if setup == DOCKER and docker_off is not None:
                    continue
                try:
                    took, redone = asyncio.run(one(Path(tmp) / f"run-{i}-{setup.split()[0]}", i))
                except SetupUnavailableError as why:
                    docker_off = str(why)
                    print(f"  {DOCKER}: not measured: {docker_off}", flush=True)
                    continue
                print(
                    f"  run {i + 1}/{n}, {setup}: first step on w1 {took:.1f} s after the kill; "
                    f"{redone} steps redone",
                    flush=True,
                )
                results[setup].append((took, redone))
    figures = _figures(LOCAL, results[LOCAL], after)
    if results[DOCKER]:
        figures += _figures(DOCKER, results[DOCKER], after)
    else:
        print(f"  the local figures only: {DOCKER} not measured ({docker_off})", flush=True)
    return figures
