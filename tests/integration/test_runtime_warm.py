"""The warm interpreter (``specon.runtime.local.zygote``) against real processes and cgroups.

The job is test_runtime_local's plain-Python loop, run as a module (``python -m warmjob``)
so the warm interpreter may fork it; one test runs the real torch workload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_runtime_local import HELD, JOB, _Killed, gru, last_step, records, wait_for

from specon import checkpoint
from specon.model import ContainerId, WorkerId
from specon.runtime import (
    AlreadyRunning,
    ContainerState,
    JobPaths,
    JobSpec,
    LocalCluster,
    LocalRuntime,
    StartFailed,
)
from specon.runtime.local.cgroups import read_stat
from specon.runtime.local.launcher import find_launcher, warm_comm
from specon.runtime.local.warm import WarmInterpreter, WarmSpec
from specon.runtime.local.zygote import Request, read_line
from specon.runtime.volume import Owner

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MODULE = "warmjob"


@pytest.fixture
def job_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``warmjob`` importable by every interpreter started from here (the warm ones too)."""
    src = tmp_path / "src"
    src.mkdir()
    # The loop, which also writes down the environment it got.
    dump = "stop = False\nPath(progress + '.env').write_text(json.dumps(dict(os.environ)))\n"
    (src / f"{MODULE}.py").write_text(JOB.replace("stop = False\n", dump, 1))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    yield src


@pytest.fixture
async def cluster(tmp_path: Path, job_module: Path) -> AsyncIterator[LocalCluster]:
    c = LocalCluster(tmp_path / "volume", [0.5, 0.5], warm=WarmSpec(MODULE, preload=(MODULE + "_deps",)))
    try:
        yield c
    finally:
        clean = await c.teardown()
    assert clean
    for rt in c.runtimes.values():
        assert rt.warm is not None and not rt.warm.socket.parent.exists(), "the server cleaned up"


@pytest.fixture(autouse=True)
def deps(job_module: Path) -> None:
    # What the server imports ahead: a module that records which process imported it.
    (job_module / f"{MODULE}_deps.py").write_text("import os\nIMPORTED_BY = os.getpid()\n")


def spec(
    job: str,
    *,
    steps: int = 40,
    pause: float = 0.03,
    every: int = 0,
    mode: str = "normal",
    release: Path | None = None,
) -> JobSpec:
    """The loop as job ``job``; ``release``: held past ``steps`` until that file exists."""
    argv: tuple[str, ...] = (
        sys.executable,
        "-m",
        MODULE,
        str(steps),
        str(pause),
        str(every),
        str(10**9),
        mode,
    )
    argv += (str(release),) if release is not None else ()
    return JobSpec(id=ContainerId(job), command=argv, steps=steps, model="loop")


async def ready(rt: LocalRuntime, timeout: float = 30.0) -> WarmInterpreter:
    warm = rt.warm
    assert warm is not None
    await wait_for(lambda: warm.ready, "the warm interpreter to import and serve", timeout=timeout)
    return warm


async def test_a_warm_job_moves_between_workers_and_finishes_with_exactly_n_steps(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    src, dst = cluster["w0"], cluster["w1"]
    warm_src, warm_dst = await ready(src), await ready(dst)
    gate = tmp_path / "release-warm-1"
    job = spec("warm-1", release=gate)
    info = await src.start(job)
    assert warm_src.launches == 1
    assert info.pid is not None
    assert Path(f"/proc/{info.pid}/comm").read_text().strip() == warm_comm(
        json.loads(JobPaths.of(src.root, "warm-1").owner.read_text())["run_id"]
    )
    if src.budget.group is not None:  # it entered its own group in the worker's budget
        assert info.pid in src.budget.job_group(info.id).pids()
    await wait_for(lambda: last_step(src, "warm-1") >= 10, "ten steps")

    saved = await src.save(job.id, grace=10)
    gate.touch()  # saved: its next run may finish (at step 40, or where it was saved if later)
    assert (saved.forced, saved.rolled_back) == (False, False) and saved.checkpoint is not None
    assert saved.step is not None
    await dst.start(job, checkpoint=saved.checkpoint)
    assert warm_dst.launches == 1
    await wait_for(JobPaths.of(dst.root, "warm-1").done.exists, "the job to finish")

    recs = records(dst, "warm-1")
    end = max(40, saved.step)  # 40 unless a loaded machine held the first run past it
    assert [r["step"] for r in recs if "loss" in r] == list(range(1, end + 1))
    assert recs[-1] == {"event": "finished", "step": end}
    assert [r for r in recs if r.get("event") == "resumed"] == [
        {"event": "resumed", "step": saved.step, "worker": "w1"}
    ]
    exits_file = JobPaths.of(dst.root, "warm-1").exits
    await wait_for(lambda: len(exits_file.read_text().splitlines()) == 2, "the launchers' exit records")
    exits = [json.loads(x) for x in exits_file.read_text().splitlines()]
    assert [(e["worker"], e["reason"], e["exit_code"]) for e in exits][1] == ("w1", "exited", 0)
    assert exits[0]["worker"] == "w0" and exits[0]["reason"] == "exited"
    # The launcher writes its exit record, then exits: until it is gone the job still lists
    # as running (a full run on a loaded machine listed it in between).
    deadline = time.monotonic() + 30
    while (done := (await dst.list_containers())[0]).state is ContainerState.RUNNING:
        assert time.monotonic() < deadline, "the launcher outlived its exit record by 30 s"
        await asyncio.sleep(0.05)
    assert (done.state, done.exit_code, done.finished) == (ContainerState.EXITED, 0, True)


async def test_the_job_gets_its_own_environment_and_none_of_the_agents_secrets(
    tmp_path: Path, job_module: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECON_TOKEN", "agent-secret")  # the agent's own: never a job's
    monkeypatch.setenv("FROM_AGENT", "inherited")
    c = LocalCluster(tmp_path / "volume", [0.5], warm=WarmSpec(MODULE, preload=(MODULE + "_deps",)))
    try:
        rt = c["w0"]
        await ready(rt)
        job = JobSpec(
            id=ContainerId("env"),
            command=(sys.executable, "-m", MODULE, "3", "0.01", "0", str(10**9), "normal"),
            steps=3,
            env=(("FOO", "bar"),),
        )
        await rt.start(job)
        paths = JobPaths.of(rt.root, "env")
        await wait_for(paths.done.exists, "the job to finish")
        env = json.loads(Path(str(paths.progress) + ".env").read_text())
        assert "SPECON_TOKEN" not in env
        assert (env["FOO"], env["FROM_AGENT"], env["SPECON_WORKER"]) == ("bar", "inherited", "w0")
        assert env["SPECON_PROGRESS_FILE"] == str(paths.progress)
        assert rt.warm is not None and rt.warm.launches == 1
    finally:
        assert await c.teardown()


async def test_a_command_it_does_not_run_starts_cold(cluster: LocalCluster, tmp_path: Path) -> None:
    rt = cluster["w0"]
    warm = await ready(rt)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = JobSpec(
        id=ContainerId("cold"),
        command=(sys.executable, str(script), "5", "0.01", "0", str(10**9), "normal"),
        steps=5,
    )
    await rt.start(job)
    await wait_for(JobPaths.of(rt.root, "cold").done.exists, "the cold job to finish")
    assert warm.launches == 0


async def test_a_dead_warm_interpreter_means_a_cold_start(cluster: LocalCluster) -> None:
    rt = cluster["w0"]
    warm = await ready(rt)
    proc = warm._proc
    assert proc is not None
    proc.kill()
    proc.wait()
    await rt.start(spec("after-death", steps=5, pause=0.01))
    await wait_for(JobPaths.of(rt.root, "after-death").done.exists, "the job to finish")
    assert warm.launches == 0
    assert records(rt, "after-death")[-1] == {"event": "finished", "step": 5}


async def test_a_set_up_it_cannot_do_is_a_start_failure_and_nothing_runs(cluster: LocalCluster) -> None:
    rt = cluster["w0"]
    await ready(rt)
    paths = JobPaths.of(rt.root, "fifo")
    paths.create()
    os.mkfifo(paths.stdout)  # planted: the launcher never writes into a FIFO
    with pytest.raises(StartFailed, match="warm"):
        await rt.start(spec("fifo"))
    assert not paths.owner.exists()
    assert await rt.list_containers() == []


async def test_an_unanswered_request_is_never_started_cold_and_its_record_stays(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Asked but silent (a server that took the request and hung or died before answering): a
    job may be running, so the runtime must not start a cold second copy. The start fails,
    the provisional record stays, and a later start goes ahead once nothing runs."""
    rt = cluster["w0"]
    warm = await ready(rt)
    real_socket = warm.socket
    silent = tmp_path / "silent.sock"  # short: unix socket paths are limited to 107 bytes
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(silent))
    srv.listen(1)

    def take_and_drop() -> None:
        conn, _ = srv.accept()
        with conn:
            read_line(conn)  # the whole request, then no answer

    taker = threading.Thread(target=take_and_drop)
    taker.start()
    warm.socket = silent
    job = spec("silent", steps=5, pause=0.01)
    try:
        with pytest.raises(StartFailed, match="no answer"):
            await rt.start(job)
    finally:
        taker.join(10)
        srv.close()
        warm.socket = real_socket
    provisional = JobPaths.of(rt.root, "silent").read_owner()
    assert provisional is not None and provisional.pid is None, "the run's record stays"
    assert await rt.list_containers() == []
    assert not JobPaths.of(rt.root, "silent").progress.exists(), "no cold copy was started"
    await rt.start(job)  # nothing runs under that record: a later start goes ahead
    await wait_for(JobPaths.of(rt.root, "silent").done.exists, "the job to finish")
    assert warm.launches == 1


def running_with(env: str) -> list[int]:
    """Live processes whose environment holds ``env`` (a zombie's reads empty)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if env.encode() in environ.split(b"\0"):
            out.append(int(pid))
    return out


async def test_a_launch_whose_answer_cannot_be_delivered_is_killed(cluster: LocalCluster) -> None:
    """The other side of the same rule: a requester gone before the answer leaves nobody to
    record the run, so the server kills the launcher it forked."""
    rt = cluster["w0"]
    warm = await ready(rt)
    paths = JobPaths.of(rt.root, "orphan")
    paths.create()
    req = Request(
        module=MODULE,
        args=("10000", "0.01", "0", str(10**9), "normal"),
        cwd=str(paths.dir),
        env=paths.env(spec("orphan", steps=10_000), WorkerId("w0")),
        stdout=str(paths.stdout),
        stderr=str(paths.stderr),
        exits=str(paths.exits),
        run_id=uuid.uuid4().hex,  # its own: a name no other run could hold
        worker="w0",
        entry=rt.budget.entry(ContainerId("orphan")),
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(warm.socket))
        s.sendall(req.encode())
        s.shutdown(socket.SHUT_RDWR)  # gone before the answer
    await wait_for(lambda: find_launcher(req.run_id) is None, "the undelivered launch to be killed")
    # Its job went with it: the group's SIGKILL lands at once, the exit can take a while on a
    # loaded machine (the fixture's teardown found it still in the worker's cgroup).
    await wait_for(lambda: not running_with(f"SPECON_PROGRESS_FILE={paths.progress}"), "the job to be gone")
    steps = last_step(rt, "orphan")
    time.sleep(0.5)
    assert last_step(rt, "orphan") == steps, "nothing trains unrecorded"
    assert not paths.exits.exists() or "exited" not in paths.exits.read_text(), "killed, not ended"
    assert warm.ready, "the server serves on"


async def test_a_runtime_killed_between_a_warm_launch_and_its_owner_record_never_starts_a_second_copy(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As test_runtime_local's cold case: the provisional record's run id finds the warm
    launcher (by its process name: its argv is the server's)."""
    src = cluster["w0"]
    await ready(src)
    job = spec("crash", steps=10**6)
    real_write = JobPaths.write_owner

    def dies_at_the_full_record(self: JobPaths, owner: Owner) -> None:
        if owner.pid is not None:
            raise _Killed
        real_write(self, owner)

    monkeypatch.setattr(JobPaths, "write_owner", dies_at_the_full_record)
    with pytest.raises(_Killed):
        await src.start(job)
    monkeypatch.setattr(JobPaths, "write_owner", real_write)
    await wait_for(lambda: last_step(src, "crash") >= 1, "the orphaned copy trains")
    provisional = JobPaths.of(cluster.root, "crash").read_owner()
    assert provisional is not None and provisional.pid is None
    assert find_launcher(provisional.run_id) is not None

    restarted = LocalRuntime(cluster.root, WorkerId("w0"), 0.5, cluster=cluster.name)
    try:
        with pytest.raises(AlreadyRunning):
            await restarted.start(job)
        with pytest.raises(AlreadyRunning):
            await cluster["w1"].start(job)
        starts = [r for r in records(restarted, "crash") if r.get("event") in ("started", "resumed")]
        assert len(starts) == 1, "one copy only"
    finally:
        restarted.close()


async def test_the_server_exits_with_the_process_that_started_it(tmp_path: Path, job_module: Path) -> None:
    code = (
        "import time\n"
        "from specon.runtime.local.warm import WarmInterpreter, WarmSpec\n"
        f"w = WarmInterpreter('w9', WarmSpec({MODULE!r}, preload=()))\n"
        "print('SERVER', w._proc.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    line = b""
    while not line.startswith(b"SERVER "):  # structlog's lines come first
        line = parent.stdout.readline()
        assert line, "the parent exited early"
    server = int(line.split()[1])
    # Read while it surely runs: once its parent is gone it may exit any moment, and the
    # link of a process that has exited resolves to nothing.
    home = Path(f"/proc/{server}/cwd").resolve()  # the private directory it serves in
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert home.name.startswith("specon-warm-w9-")
    deadline = time.monotonic() + 10
    while (st := read_stat(server)) is not None and not st.zombie:
        assert time.monotonic() < deadline, "the server outlived its parent"
        time.sleep(0.1)
    assert not home.exists(), "the orphaned server removed its directory"


@pytest.mark.timeout(300)
async def test_the_torch_workload_runs_warm_and_resumes_with_exactly_its_steps(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    c = LocalCluster(tmp_path / "volume", [1.0, 1.0], warm=True)
    try:
        src, dst = c["w0"], c["w1"]
        # Two interpreters import torch and torch._dynamo at once: 5 s of CPU each alone here,
        # over 30 s with the suite's workers on two cores (a full run missed 30 s once).
        await ready(src, timeout=120)
        await ready(dst, timeout=120)
        # The first run has no end of its own (HELD steps): the save ends it, however loaded the
        # machine. It resumes as the 60-step job (saved past step 60, as one of that many).
        job = JobSpec(id=ContainerId("gru-1"), command=gru(HELD), steps=60, model="gru")
        await src.start(job)
        await wait_for(lambda: last_step(src, "gru-1") >= 10, "ten steps", timeout=60)
        saved = await src.save(job.id, grace=30)
        assert saved.checkpoint is not None and saved.step is not None
        assert checkpoint.verify(saved.checkpoint).step == saved.step
        end = max(60, saved.step)
        await dst.start(dataclasses.replace(job, command=gru(end)), checkpoint=saved.checkpoint)
        paths = JobPaths.of(dst.root, "gru-1")
        await wait_for(
            lambda: any(r.get("event") == "finished" for r in records(dst, "gru-1")), "the job to finish", 120
        )
        recs = records(dst, "gru-1")
        assert [r["step"] for r in recs if "loss" in r] == list(range(5, end + 1, 5))
        assert [(r["step"], r["steps"]) for r in recs if r.get("event") == "finished"] == [(end, end)]
        assert (src.warm and src.warm.launches, dst.warm and dst.warm.launches) == (1, 1)
        assert "Traceback" not in paths.stderr.read_text()
    finally:
        assert await c.teardown()
