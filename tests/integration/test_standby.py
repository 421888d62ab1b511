"""The GPU standby (``specon.runtime.local.standby``) against real processes and cgroups, on a
fake "GPU 0": there is no GPU here, so the standby primes on the CPU (or, for the plain-Python
job, imports only) and the whole protocol runs for real.

The job is test_runtime_local's plain-Python loop, run as a module (``python -m sbjob``), which
also writes down its environment, pid and process group; one test runs the real torch workload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_runtime_local import HELD, JOB, gru, last_step, records, wait_for

from specon import checkpoint
from specon.model import ContainerId, Resources, WorkerId
from specon.runtime import ContainerState, JobPaths, JobSpec, LocalRuntime, StartFailed
from specon.runtime.local.cgroup_entry import Entry
from specon.runtime.local.cgroups import read_stat
from specon.runtime.local.launcher import find_launcher, warm_comm
from specon.runtime.local.standby_pool import Standby, StandbySpec
from specon.runtime.local.warm import WarmLaunchError
from specon.runtime.local.zygote import Request, read_line

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODULE = "sbjob"
SPEC = StandbySpec(MODULE, preload=(MODULE + "_deps",), prime=False)


@pytest.fixture
def job_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``sbjob`` importable by every interpreter started from here (the standbys too)."""
    src = tmp_path / "src"
    src.mkdir()
    dump = (
        "stop = False\n"
        "import sbjob_deps\n"
        "Path(progress + '.env').write_text(json.dumps({'env': dict(os.environ), 'pid': os.getpid(),"
        " 'ppid': os.getppid(), 'pgid': os.getpgid(0), 'deps_imported_by': sbjob_deps.IMPORTED_BY}))\n"
    )
    (src / f"{MODULE}.py").write_text(JOB.replace("stop = False\n", dump, 1))
    (src / f"{MODULE}_deps.py").write_text("import os\nIMPORTED_BY = os.getpid()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    yield src


def cluster_of(root: Path) -> str:
    """One cgroup tree per test (its volume), so no other run's workers are touched."""
    return "sb" + hashlib.sha1(str(root).encode()).hexdigest()[:10]


def runtime(root: Path, worker: str, spec: StandbySpec = SPEC, cpus: float = 0.5) -> LocalRuntime:
    return LocalRuntime(
        root, WorkerId(worker), cpus, cluster=cluster_of(root), standby_gpus=(0,), standby=spec
    )


@pytest.fixture
async def pair(tmp_path: Path, job_module: Path) -> AsyncIterator[tuple[LocalRuntime, LocalRuntime]]:
    src, dst = runtime(tmp_path / "volume", "w0"), runtime(tmp_path / "volume", "w1")
    try:
        yield src, dst
    finally:
        for rt in (src, dst):
            await rt.stop_all()
        clean = [src.close(), dst.close()]
    assert all(clean)
    for rt in (src, dst):
        assert rt.standby is not None and not rt.standby._dir.exists(), "the pool cleaned up"


def gpu_job(
    job: str, *, steps: int = 40, pause: float = 0.03, gpus: int = 1, release: Path | None = None, **kw: Any
) -> JobSpec:
    """The loop as job ``job`` asking for ``gpus``; ``release``: held past ``steps`` until that
    file exists."""
    argv: tuple[str, ...] = (sys.executable, "-m", MODULE, str(steps), str(pause), "0", str(10**9), "normal")
    argv += (str(release),) if release is not None else ()
    return JobSpec(id=ContainerId(job), command=argv, steps=steps, requests=Resources(gpu=gpus), **kw)


async def ready(rt: LocalRuntime, timeout: float = 60) -> Standby:
    pool = rt.standby
    assert pool is not None
    await wait_for(lambda: pool.standbys[0].ready, "the standby to prime and serve", timeout=timeout)
    return pool.standbys[0]


def dumped(rt: LocalRuntime, job: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(str(JobPaths.of(rt.root, job).progress) + ".env").read_text())
    return data


def exits(rt: LocalRuntime, job: str) -> list[dict[str, Any]]:
    path = JobPaths.of(rt.root, job).exits
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


async def test_a_gpu_job_becomes_the_standby_in_place_and_moves_with_exactly_its_steps(
    pair: tuple[LocalRuntime, LocalRuntime], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    src, dst = pair
    standby = await ready(src)
    keeper = standby.proc.pid
    gate = tmp_path / "release-gpu-1"
    job = gpu_job("gpu-1", release=gate)  # held: it waits out the fresh standby's priming
    info = await src.start(job)
    assert src.standby is not None and src.standby.launches == 1
    assert info.pid == keeper, "the run is the keeper's process group"
    run_id = json.loads(JobPaths.of(src.root, "gpu-1").owner.read_text())["run_id"]
    assert Path(f"/proc/{keeper}/comm").read_text().strip() == warm_comm(run_id)
    assert find_launcher(run_id) == keeper
    await wait_for(lambda: last_step(src, "gpu-1") >= 10, "ten steps")
    seen = dumped(src, "gpu-1")
    # In place: the module the standby imported ahead was imported by the job's own process,
    # whose parent (the keeper) leads its process group.
    assert seen["deps_imported_by"] == seen["pid"] != keeper
    assert (seen["ppid"], seen["pgid"]) == (keeper, keeper)
    assert seen["env"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["env"]["SPECON_WORKER"] == "w0"
    if src.budget.group is not None:  # both entered the job's own group in the worker's budget
        assert {keeper, seen["pid"]} <= set(src.budget.job_group(info.id).pids())

    fresh = await ready(src)  # a fresh standby for GPU 0, primed in the background
    assert fresh.proc.pid != keeper

    saved = await src.save(job.id, grace=10)
    gate.touch()  # saved: its next run may finish (at step 40, or where it was saved if later)
    assert (saved.forced, saved.rolled_back) == (False, False) and saved.checkpoint is not None
    assert saved.step is not None
    await ready(dst)
    await dst.start(job, checkpoint=saved.checkpoint)
    assert dst.standby is not None and dst.standby.launches == 1
    await wait_for(JobPaths.of(dst.root, "gpu-1").done.exists, "the job to finish")
    recs = records(dst, "gpu-1")
    end = max(40, saved.step)  # 40 unless a loaded machine held the first run past it
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, end + 1))
    assert recs[-1] == {"event": "finished", "step": end}
    assert [r for r in recs if r.get("event") == "resumed"] == [
        {"event": "resumed", "step": saved.step, "worker": "w1"}
    ]
    await wait_for(lambda: len(exits(dst, "gpu-1")) == 2, "the keepers' exit records")
    first, second = exits(dst, "gpu-1")
    assert (first["worker"], first["reason"], first["exit_code"], first["pid"]) == ("w0", "exited", 0, keeper)
    assert (second["worker"], second["reason"], second["exit_code"]) == ("w1", "exited", 0)
    deadline = time.monotonic() + 30
    while (done := (await dst.list_containers())[0]).state is ContainerState.RUNNING:
        assert time.monotonic() < deadline, "the keeper outlived its exit record by 30 s"
        await asyncio.sleep(0.05)
    assert (done.state, done.exit_code, done.finished) == (ContainerState.EXITED, 0, True)


async def test_the_job_gets_its_own_environment_and_none_of_the_agents_secrets(
    tmp_path: Path, job_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECON_TOKEN", "agent-secret")  # the agent's own: never a job's
    monkeypatch.setenv("FROM_AGENT", "inherited")
    rt = runtime(tmp_path / "volume", "w0")
    try:
        await ready(rt)
        await rt.start(
            gpu_job("env", steps=3, pause=0.01, env=(("FOO", "bar"), ("CUDA_VISIBLE_DEVICES", "0")))
        )
        paths = JobPaths.of(rt.root, "env")
        await wait_for(paths.done.exists, "the job to finish")
        env = dumped(rt, "env")["env"]
        assert "SPECON_TOKEN" not in env
        assert (env["FOO"], env["FROM_AGENT"], env["SPECON_PROGRESS_FILE"]) == (
            "bar",
            "inherited",
            str(paths.progress),
        )
        assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("0", "PCI_BUS_ID")
        assert rt.standby is not None and rt.standby.launches == 1
        standby_env = Path(f"/proc/{rt.standby.standbys[0].proc.pid}/environ").read_bytes()
        assert b"SPECON_TOKEN" not in standby_env, "nor do the standbys get them"
    finally:
        await rt.stop_all()
        assert rt.close()


@pytest.mark.parametrize(
    "job",
    [
        gpu_job("cpu-job", steps=5, pause=0.01, gpus=0),
        gpu_job("two-gpus", steps=5, pause=0.01, gpus=2),
        gpu_job("other-gpu", steps=5, pause=0.01, env=(("CUDA_VISIBLE_DEVICES", "3"),)),
    ],
    ids=lambda j: j.id,
)
async def test_a_job_it_does_not_take_starts_as_before(
    pair: tuple[LocalRuntime, LocalRuntime], job: JobSpec
) -> None:
    rt = pair[0]
    standby = await ready(rt)
    await rt.start(job)
    await wait_for(JobPaths.of(rt.root, job.id).done.exists, "the cold job to finish")
    assert rt.standby is not None and rt.standby.launches == 0
    assert rt.standby.standbys[0] is standby and standby.ready, "still standing by"
    assert "CUDA_VISIBLE_DEVICES" not in dumped(rt, job.id)["env"] or job.id == "other-gpu"


async def test_a_job_while_no_standby_is_ready_starts_cold(pair: tuple[LocalRuntime, LocalRuntime]) -> None:
    rt = pair[0]
    sb = await ready(rt)
    hidden = sb.socket.with_name("hidden")
    sb.socket.rename(hidden)  # as one still priming: its socket appears once it serves
    try:
        assert not sb.ready
        await rt.start(gpu_job("early", steps=5, pause=0.01))
    finally:
        hidden.rename(sb.socket)
    await wait_for(JobPaths.of(rt.root, "early").done.exists, "the cold job to finish")
    assert rt.standby is not None and rt.standby.launches == 0
    seen = dumped(rt, "early")
    assert "CUDA_VISIBLE_DEVICES" not in seen["env"]
    await rt.start(gpu_job("later", steps=5, pause=0.01))  # it serves again
    assert rt.standby.launches == 1


def raw_request(rt: LocalRuntime, job: str, *, module: str = MODULE, entry: Entry | None = None) -> Request:
    paths = JobPaths.of(rt.root, job)
    paths.create()
    spec = gpu_job(job, steps=10_000, pause=0.01)
    return Request(
        module=module,
        args=spec.command[3:],
        cwd=str(paths.dir),
        env=paths.env(spec, rt.worker),
        stdout=str(paths.stdout),
        stderr=str(paths.stderr),
        exits=str(paths.exits),
        run_id=uuid.uuid4().hex,
        worker=rt.worker,
        entry=rt.budget.entry(spec.id) if entry is None else entry,
    )


def ask(standby: Standby, req: Request) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(standby.socket))
        s.sendall(req.encode())
        answer: dict[str, Any] = json.loads(read_line(s))
    return answer


async def test_a_refused_request_leaves_it_serving(pair: tuple[LocalRuntime, LocalRuntime]) -> None:
    rt = pair[0]
    standby = await ready(rt)
    answer = ask(standby, raw_request(rt, "other", module="os"))
    assert answer == {"error": "module 'os' is not one this standby runs", "spent": False}
    paths = JobPaths.of(rt.root, "fifo")
    paths.create()
    os.mkfifo(paths.stdout)  # planted: never written into
    with pytest.raises(StartFailed, match="cannot launch it"):
        await rt.start(gpu_job("fifo"))
    assert not paths.owner.exists()
    assert rt.standby is not None and rt.standby.standbys[0] is standby and standby.ready


async def test_a_set_up_that_fails_half_way_spends_it_records_nothing_and_a_fresh_one_comes(
    pair: tuple[LocalRuntime, LocalRuntime],
) -> None:
    rt = pair[0]
    standby = await ready(rt)
    req = raw_request(rt, "spent", entry=Entry(files=(("/nonexistent/cgroup.procs", None),)))
    pool = rt.standby
    assert pool is not None
    with pytest.raises(WarmLaunchError, match="cannot set up the job's process"):
        pool.launch(standby, req)
    assert standby.proc.wait(10) == 0, "the keeper saw no hand-over: it exits, recording nothing"
    assert not JobPaths.of(rt.root, "spent").exits.exists()
    assert pool.standbys[0] is not standby
    await ready(rt)


async def test_an_answer_that_cannot_be_delivered_kills_the_group(
    pair: tuple[LocalRuntime, LocalRuntime],
) -> None:
    rt = pair[0]
    standby = await ready(rt)
    req = raw_request(rt, "orphan")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(standby.socket))
        s.sendall(req.encode())
        s.shutdown(socket.SHUT_RDWR)  # gone before the answer
    assert standby.proc.wait(10) == -signal.SIGKILL
    steps = last_step(rt, "orphan")
    time.sleep(0.3)
    assert last_step(rt, "orphan") == steps, "nothing trains unrecorded"
    paths = JobPaths.of(rt.root, "orphan")
    assert not paths.exits.exists() or "exited" not in paths.exits.read_text(), "killed, not ended"


async def test_closing_the_runtime_stops_the_idle_standbys_and_leaves_its_jobs_running(
    tmp_path: Path, job_module: Path
) -> None:
    rt = runtime(tmp_path / "volume", "w0")
    await ready(rt)
    info = await rt.start(gpu_job("lives-on", steps=10**6, pause=0.01))
    assert rt.standby is not None
    idle = await ready(rt)
    pool_dir = rt.standby._dir
    rt.close()
    assert idle.proc.poll() is not None and not pool_dir.exists()
    assert info.pid is not None and (st := read_stat(info.pid)) is not None and not st.zombie
    again = LocalRuntime(tmp_path / "volume", WorkerId("w0"), 0.5, cluster=cluster_of(tmp_path / "volume"))
    try:
        assert [c.id for c in await again.list_containers()] == ["lives-on"], "re-adopted as any local job"
        await again.stop_all()
    finally:
        assert again.close()


async def test_the_standby_exits_with_the_process_that_started_it(tmp_path: Path, job_module: Path) -> None:
    code = (
        "import time\n"
        "from specon.runtime.local.standby_pool import StandbyPool, StandbySpec\n"
        f"p = StandbyPool('w9', [0], StandbySpec({MODULE!r}, preload=(), prime=False))\n"
        "print('KEEPER', p.standbys[0].proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    line = b""
    while not line.startswith(b"KEEPER "):  # structlog's lines come first
        line = parent.stdout.readline()
        assert line, "the parent exited early"
    keeper = int(line.split()[1])
    home = Path(f"/proc/{keeper}/cwd").resolve()  # the pool's private directory
    deadline = time.monotonic() + 30
    while not any(home.glob("*.sock")):
        assert time.monotonic() < deadline, "the standby never served"
        time.sleep(0.05)
    group = [
        int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(int(p.name)) == keeper
    ]
    assert len(group) == 2, "keeper and standby"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert home.name.startswith("specon-standby-w9-")
    deadline = time.monotonic() + 10
    while any((st := read_stat(pid)) is not None and not st.zombie for pid in group):
        assert time.monotonic() < deadline, "the standby outlived its runtime"
        time.sleep(0.1)
    assert not home.exists(), "the orphaned keeper removed the directory"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_torch_workload_is_suspended_and_restored_through_the_standby_with_exactly_its_steps(
    tmp_path: Path,
) -> None:
    """The GPU sharing's suspend and resume on one worker: saved, then started from its
    checkpoint on the same worker through the standby primed meanwhile."""
    pytest.importorskip("torch")
    rt = runtime(tmp_path / "volume", "w0", StandbySpec(), cpus=1.0)
    try:
        first = await ready(rt, timeout=180)
        # The first run has no end of its own (HELD steps): the save ends it, however loaded the
        # machine. It resumes as the 60-step job (saved past step 60, as one of that many).
        job = JobSpec(
            id=ContainerId("gru-1"), command=gru(HELD), steps=60, model="gru", requests=Resources(gpu=1)
        )
        await rt.start(job)
        await wait_for(lambda: last_step(rt, "gru-1") >= 10, "ten steps", timeout=120)
        saved = await rt.save(job.id, grace=30)
        assert saved.checkpoint is not None and saved.step is not None
        assert checkpoint.verify(saved.checkpoint).step == saved.step
        end = max(60, saved.step)
        second = await ready(rt, timeout=180)
        assert second is not first
        await rt.start(dataclasses.replace(job, command=gru(end)), checkpoint=saved.checkpoint)
        paths = JobPaths.of(rt.root, "gru-1")
        await wait_for(paths.finished, "the job to finish", timeout=180)
        recs = records(rt, "gru-1")
        assert [r["step"] for r in recs if "loss" in r] == list(range(5, end + 1, 5))
        assert [(r["step"], r["steps"]) for r in recs if r.get("event") == "finished"] == [(end, end)]
        starts = [(r["step"], r["resumed"]) for r in recs if r.get("event") == "started"]
        assert starts == [(0, False), (saved.step, True)]
        assert rt.standby is not None and rt.standby.launches == 2
        assert "Traceback" not in paths.stderr.read_text()
        log = (rt.standby._dir / "g0.log").read_text()
        assert "primed on cpu" in log, log
    finally:
        await rt.stop_all()
        assert rt.close()
