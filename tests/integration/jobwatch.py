"""Watching real training jobs on the embedded cluster: their progress logs, their processes.

Shared by the fault tests and the chaos run. A job's progress log tells its runs (where
each resumed, what it trained, the checkpoints it wrote, how it ended); ``/proc`` tells
where its processes run. "Nothing lost" is judged from both: never two copies at once,
never running nowhere for long, exactly its steps, redoing only steps after the last
complete checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp
from listening import IN_USE, listens

from specon.embedded.cluster import Daemon, EmbeddedCluster
from specon.fence import ENV_GENERATION, env_generation
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from specon.runtime.volume import JobPaths
from specon.testing.progress_log import job_records
from specon.wire.status import MigrationStatus, Status

JOB = Path(__file__).parent / "jobs" / "curve_job.py"
CHECKPOINT_EVERY = 50
# A job may legitimately run nowhere while it is being moved or while the worker that
# must restart it is down; longer than this, it has been lost. A bound on a hang, not a
# measurement: a move between skewed-clock hosts took over 15 s under the full suite's load
# (the move's own time is a benchmark's, docs/benchmarks.md).
LOST_AFTER = 60.0


@contextlib.asynccontextmanager
async def embedded_cluster(
    root: Path, policy: str, *, workers: int = 2, cpus: float = 0.5
) -> AsyncIterator[EmbeddedCluster]:
    """An embedded cluster under ``root`` with the policy file ``policy`` (YAML text). Its
    manager is SIGKILLed first at the end: a SIGTERMed manager waits out the agents' open long
    polls, up to 20 s a test; its journal is write-ahead, so a kill loses nothing."""
    path = root / "policy.yaml"
    path.write_text("apiVersion: specon/v1alpha1\nkind: Policy\n" + policy)
    async with EmbeddedCluster(root / "c", workers=workers, cpus_per_worker=cpus, policy=path) as c:
        try:
            yield c
        finally:
            if c.manager is not None:
                c.kill(c.manager)


def spec(
    jid: str,
    steps: int,
    curve: str,
    *,
    step_seconds: float = 0.05,
    save_seconds: float = 0.0,
    restore_seconds: float = 0.0,
    save_gate: Path | None = None,
    ignore_sigterm: bool = False,
    until_released: Path | None = None,
    crash_on_restore: Path | None = None,
) -> JobSpec:
    """The curve job ``jid`` as the embedded cluster runs it; ``until_released``: trains past
    ``steps`` until that file exists (``held_jobs.release``), so a test decides when it ends;
    ``crash_on_restore``: its next checkpoint load crashes while that file exists."""
    argv = [sys.executable, str(JOB), "--steps", str(steps), "--curve", curve]
    argv += ["--step-seconds", str(step_seconds), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    argv += ["--save-seconds", str(save_seconds), "--restore-seconds", str(restore_seconds)]
    argv += ["--ignore-sigterm"] if ignore_sigterm else []
    argv += ["--save-gate", str(save_gate)] if save_gate is not None else []
    argv += ["--until-released", str(until_released)] if until_released is not None else []
    argv += ["--crash-on-restore", str(crash_on_restore)] if crash_on_restore is not None else []
    return JobSpec(id=ContainerId(jid), command=tuple(argv), steps=steps, model=curve)


# -- the job's progress log ----------------------------------------------------------------
def records(c: EmbeddedCluster, jid: str) -> list[dict[str, Any]]:
    return job_records(c.volume, jid)


def has_event(c: EmbeddedCluster, jid: str, event: str) -> bool:
    return any(r.get("event") == event for r in records(c, jid))


def finished(c: EmbeddedCluster, jid: str) -> bool:
    return has_event(c, jid, "finished")


@dataclass
class Run:
    """One process lifetime of a job, as its progress log tells it."""

    resumed_from: int
    trained: list[int] = field(default_factory=list)
    # Steps of the checkpoints it recorded (periodic, and the one written on SIGTERM).
    checkpoints: list[int] = field(default_factory=list)
    ending: str | None = None  # "checkpointed" | "finished" | None (killed)


def runs(c: EmbeddedCluster, jid: str) -> list[Run]:
    out: list[Run] = []
    for r in records(c, jid):
        event = r.get("event")
        if event == "started":
            out.append(Run(int(r["step"])))
        elif event in ("checkpoint", "checkpointed"):
            out[-1].checkpoints.append(int(r["step"]))
            if event == "checkpointed":
                out[-1].ending = "checkpointed"
        elif event == "finished":
            out[-1].ending = "finished"
        elif "loss" in r:
            # The job's own state counts the steps it trained: a run restored from garbage
            # (or from the wrong checkpoint) would disagree with the step number.
            assert r["trained"] == r["step"], f"{jid}: state says {r['trained']} at step {r['step']}"
            out[-1].trained.append(int(r["step"]))
    return out


def stale_commits(recs: list[dict[str, Any]]) -> list[str]:
    """The records of a job's progress log (in file order) that a stale copy wrote: what
    fencing (``specon.fence``) must make impossible, one line each saying why.

    Each start bumps the job's generation before the new copy exists, and jobkit names its
    generation in every event record (``started``, ``checkpoint``, ``checkpointed``,
    ``saving``, ``finished``, ``checkpoint_failed``) and checks the generation before every
    write. The file is appended to in write order, so a record after a ``started`` record
    of generation G was written after generation G had begun. Stale, then:

    * an event record of a generation below the highest one a ``started`` record before it
      names (a record without a generation, from an unfenced copy, counts as generation 0);
    * any record (a training sample too) after a ``finished`` record and before the next
      ``started``: the job's done marker is written just before ``finished``, and the copy
      that wrote it writes nothing after it, so whoever did is a copy that was not stopped.
      (A new start after the job finished is a start too many, not a stale write: the step
      check, ``assert_exactly_its_steps``, rejects it.)

    Training samples carry no generation, so between starts they cannot be told apart by
    copy; two copies' samples interleaving shows in ``assert_exactly_its_steps`` instead.
    """
    out: list[str] = []
    newest = 0  # the highest generation a started record named so far
    done = False  # a finished record, and no start since
    for n, r in enumerate(recs, 1):
        event = r.get("event")
        if event is None:
            if done:
                out.append(f"record {n}: a training sample (step {r.get('step')}) after the job finished")
            continue
        g = r.get("generation")
        gen = g if isinstance(g, int) and not isinstance(g, bool) else 0
        if gen < newest:
            step = r.get("step")
            out.append(f"record {n}: {event} (step {step}) of generation {gen} after {newest} started")
        elif done and event != "started":
            out.append(f"record {n}: {event} (step {r.get('step')}) after the job finished")
        if event == "started" and gen >= newest:
            newest, done = gen, False
        elif event == "finished" and gen >= newest:
            done = True
    return out


def handover_gaps(
    seen: list[tuple[float, dict[str, Any]]],
    alive: Mapping[int, float] | None = None,
    launched: Mapping[int, Sequence[float]] | None = None,
) -> list[tuple[float, dict[str, Any]]]:
    """How long a job went without a live copy at each of its restarts, from its progress
    log as an observer read it: ``seen`` is every record in file order with the time (the
    observer's own clock, so the hosts' skewed clocks do not matter) it was first seen.

    For every ``started`` record but the first (a restart: after a move, a crash, a lost
    host, a fenced partition), the gap is the time from the record before it (whichever
    copy wrote it: the last sign of life of the copy that ended, or of the stale copy that
    was fenced) to the new copy's ``started`` record, which it writes once it has loaded its
    checkpoint. ``alive``: the last time (same clock) a process of each generation was seen
    running; an older copy seen alive later than its last record (silent: waiting out a full
    disk, SIGSTOPped) was a live copy until then, up to the restart. ``launched``: when each
    copy of each generation was launched (its launcher first seen); the gap then ends at the
    newest launch of the restart's generation before its ``started`` record, so it measures
    how long the cluster took to start a copy, not how long the copy's interpreter took to
    start and load its checkpoint on its worker's CPU share. It bounds the time the job ran
    nowhere from above: it also counts the old copy's last moments (a save on SIGTERM).
    Returned as (gap in seconds, the ``started`` record), in file order."""
    alive, launched = alive or {}, launched or {}
    out = []
    for (t_prev, _), (t, r) in itertools.pairwise(seen):
        if r.get("event") != "started":
            continue
        gen = r.get("generation")
        older = [at for g, at in alive.items() if isinstance(gen, int) and g < gen]
        last_sign = max(t_prev, min(t, max(older))) if older else t_prev
        out.append((max(0.0, launch_of(launched, gen, t) - last_sign), r))
    return out


def launch_of(launched: Mapping[int, Sequence[float]], gen: object, t: float) -> float:
    """When the copy of generation ``gen`` whose ``started`` record was seen at ``t`` was
    launched: the newest launch of that generation by ``t`` (``handover_gaps``), else ``t``."""
    launches = launched.get(gen, ()) if isinstance(gen, int) else ()
    return max((at for at in launches if at <= t), default=t)


def assert_exactly_its_steps(
    c: EmbeddedCluster, jid: str, steps: int, *, corrupt: frozenset[int] = frozenset()
) -> list[Run]:
    """Every step 1..steps trained, in order within each run, and each restart resumes from
    the newest checkpoint the previous run completed: exactly where it stopped after a clean
    stop, else (killed, or its last checkpoint is in ``corrupt``) from its newest good one
    or later. So only steps after the last good checkpoint are ever redone."""
    rs = runs(c, jid)
    assert rs and rs[0].resumed_from == 0, f"{jid}: no first run from step 0"
    for prev, run in itertools.pairwise(rs):
        newest = max((s for s in prev.checkpoints if s not in corrupt), default=prev.resumed_from)
        last = prev.trained[-1] if prev.trained else prev.resumed_from
        # A killed run may have completed a checkpoint without living to record it.
        lo = last if prev.ending == "checkpointed" and last not in corrupt else newest
        assert lo <= run.resumed_from <= last, f"{jid}: resumed at {run.resumed_from}, not in [{lo}, {last}]"
    for run in rs:
        expected = list(range(run.resumed_from + 1, run.resumed_from + 1 + len(run.trained)))
        if run.trained != expected:  # the first step out of order says where (two writers?)
            got, want = next((s, e) for s, e in zip(run.trained, expected, strict=True) if s != e)
            raise AssertionError(f"{jid}: the run from step {run.resumed_from} logged step {got}, not {want}")
    for prev, run in itertools.pairwise(rs):
        assert prev.ending != "finished", (
            f"{jid}: started again (from step {run.resumed_from}) after it finished"
        )
    # A run killed between its final checkpoint and its ``finished`` record leaves the next
    # one nothing to train: it resumes at ``steps`` and only records the end.
    last = rs[-1].trained[-1] if rs[-1].trained else rs[-1].resumed_from
    assert rs[-1].ending == "finished" and last == steps, f"{jid}: did not finish ({rs[-1]})"
    assert sorted(set().union(*(r.trained for r in rs))) == list(range(1, steps + 1))
    return rs


async def assert_finished_once(
    c: EmbeddedCluster, dog: Watchdog, steps: int, *, corrupt: frozenset[int] = frozenset()
) -> list[Run]:
    """The job finished with exactly its steps, never ran twice at once, and the volume
    names the worker of its last run as its owner (one container record, ended)."""
    rs = assert_exactly_its_steps(c, dog.jid, steps, corrupt=corrupt)

    async def records_of_its_run() -> list[tuple[str, bool, bool]]:
        return [(ci.worker, ci.alive, ci.finished) for ci in await c.containers() if ci.id == dog.jid]

    async def exited() -> bool:  # it logs "finished" a moment before its process ends
        return not any(alive for _, alive, _ in await records_of_its_run())

    await wait_for(exited, f"{dog.jid} to exit", timeout=10)
    dog.check()
    mine = await records_of_its_run()
    assert mine == [(dog.workers[-1], False, True)], f"{dog.jid}: {mine}, last ran on {dog.workers[-1]}"
    return rs


# -- processes -------------------------------------------------------------------------------
def job_environs() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, environment) of every live training-job process (the job itself, not its
    launcher) of ``jobs/curve_job.py``, from /proc."""
    for pid, env, launcher in job_and_launcher_environs():
        if not launcher:
            yield pid, env


def job_and_launcher_environs() -> Iterator[tuple[int, list[bytes], bool]]:
    """(pid, environment, whether it is the launcher) of every live process of a run of
    ``jobs/curve_job.py``: the job and the launcher it runs under (which has its
    environment too), from /proc."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            if JOB.name.encode() not in cmdline:
                continue
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        yield int(name), env, b"launcher.py" in cmdline


def parent_of(pid: int) -> int | None:
    """The parent process id of ``pid``, from /proc; None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so after the last ")".
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


def generation_of(env: list[bytes]) -> int | None:
    """The generation a job process was started in (``$SPECON_GENERATION``), None without."""
    raw = next((e.split(b"=", 1)[1] for e in env if e.startswith(ENV_GENERATION.encode() + b"=")), b"")
    return env_generation({ENV_GENERATION: raw.decode(errors="replace")})


def worker_of(env: list[bytes]) -> str:
    return next((e.split(b"=", 1)[1] for e in env if e.startswith(b"SPECON_WORKER=")), b"?").decode()


def job_processes(c: EmbeddedCluster, jid: str) -> dict[int, str]:
    """pid -> worker of every live process running ``jid``, found by the progress file its
    environment names (unique to this cluster)."""
    marker = f"SPECON_PROGRESS_FILE={JobPaths(c.volume, ContainerId(jid)).progress}".encode()
    return {pid: worker_of(env) for pid, env in job_environs() if marker in env}


class Watchdog:
    """Samples a job's processes every 0.1 s for the whole test: never two copies at once,
    and never running nowhere for longer than ``lost_after`` (unless it has finished).

    (Two copies overlapping between samples would still show in the progress log: their
    records would interleave, which ``assert_exactly_its_steps`` rejects.)"""

    def __init__(self, c: EmbeddedCluster, jid: str, *, lost_after: float = LOST_AFTER) -> None:
        self.c, self.jid = c, jid
        self.lost_after = lost_after
        self.max_copies = 0
        self.workers: list[str] = []  # the worker of each run seen, in order
        self.down_since: float | None = None
        self.longest_down = 0.0
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        procs = job_processes(self.c, self.jid)
        now = time.monotonic()
        self.max_copies = max(self.max_copies, len(procs))
        for worker in procs.values():
            if not self.workers or self.workers[-1] != worker:
                self.workers.append(worker)
        if procs or not self.workers or finished(self.c, self.jid):
            self.down_since = None  # running, not submitted yet, or done
        elif self.down_since is None:
            self.down_since = now
        else:
            self.longest_down = max(self.longest_down, now - self.down_since)

    def check(self) -> None:
        assert self.max_copies <= 1, f"{self.jid} ran {self.max_copies} times at once"
        assert self.longest_down < self.lost_after, f"{self.jid} ran nowhere for {self.longest_down:.1f}s"

    async def _loop(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(0.1)

    async def __aenter__(self) -> Watchdog:
        self.sample()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if exc is None:
            self.check()


# -- waiting -----------------------------------------------------------------------------------
async def wait_for(
    cond: Callable[[], Awaitable[bool]] | Callable[[], bool],
    what: str,
    *,
    timeout: float,
    watchdog: Watchdog | None = None,
) -> None:
    """Poll ``cond`` until true; fail at ``timeout`` or as soon as the watchdog objects."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if await got if asyncio.iscoroutine(got) else got:
            return
        if watchdog is not None:
            watchdog.check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.1)


async def status(c: EmbeddedCluster) -> Status | None:
    """The manager's status, or None while it is down or not answering."""
    if c.manager is None or c.manager.proc.poll() is not None:
        return None
    try:
        return await c.status()
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


async def migration_of(c: EmbeddedCluster, jid: str) -> MigrationStatus | None:
    st = await status(c)
    ms = [m for m in (st.migrations if st else ()) if m.container == jid]
    return max(ms, key=lambda m: m.decided_at) if ms else None


def in_state(c: EmbeddedCluster, jid: str, *states: str) -> Callable[[], Awaitable[bool]]:
    async def cond() -> bool:
        m = await migration_of(c, jid)
        return m is not None and m.state.value in states

    return cond


async def worker_reachable(c: EmbeddedCluster, worker: WorkerId) -> bool | None:
    st = await status(c)
    w = next((w for w in st.workers if w.id == worker), None) if st else None
    return None if w is None else w.reachable


async def agent_health(d: Daemon) -> dict[str, Any] | None:
    try:
        async with (
            aiohttp.ClientSession() as s,
            s.get(d.url + "/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r,
        ):
            return dict(await r.json())
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None


SAVES = 'specon_agent_commands_total{action="save"}'
STARTS = 'specon_agent_commands_total{action="start"}'


async def agent_metric(d: Daemon, name: str, *, default: float | None = None) -> float:
    async with (
        aiohttp.ClientSession() as s,
        # Generous: a loaded machine may hold a busy agent's answer for seconds.
        s.get(d.url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r,
    ):
        text = await r.text()
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return float(value)
    if default is not None:
        return default
    raise AssertionError(f"{d.name} has no metric {name}")


def address(d: Daemon) -> tuple[str, int]:
    host, port = d.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def manager_port(c: EmbeddedCluster) -> int:
    assert c.manager is not None
    return address(c.manager)[1]


async def restart_agent(c: EmbeddedCluster, worker: WorkerId, *, attempts: int = 3) -> Daemon:
    """Start ``worker``'s agent again on the address it had (after a kill), or on another
    port of its host when that one was taken while the agent was down (any process may
    take it meanwhile: other runs' agents on this loopback address bind their outgoing
    connections there). The manager only displays an agent's address.

    On a machine so loaded that the new agent does not answer within the cluster's health
    timeout, the cluster kills that process (never two agents for one worker) and it is
    started again."""
    for attempt in range(1, attempts + 1):
        try:
            return await _restart_agent(c, worker)
        except TimeoutError:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


async def _restart_agent(c: EmbeddedCluster, worker: WorkerId) -> Daemon:
    host, port = address(c.agents[worker])
    try:
        d = await c.start_agent(worker, host, port)
    except RuntimeError as err:  # it exited: see why
        if IN_USE not in str(err).lower():
            raise
    else:
        if listens(d.proc.pid, port):
            return d
        c.kill(d)  # a stranger answered on the port: ours could not bind it
    return await c.start_agent(worker, host)


def pending_request(c: EmbeddedCluster, worker: WorkerId, jid: str) -> bool:
    """Whether ``worker``'s agent holds an unanswered reallocation request for ``jid`` (its
    persisted monitor state, written after every tick)."""
    with contextlib.suppress(OSError, ValueError):  # not written yet
        states = json.loads((c.volume / "agents" / worker / "monitor.json").read_text())
        return bool(states.get(jid, {}).get("pending_request"))
    return False


async def marked_migrated(c: EmbeddedCluster, jid: str) -> bool:
    st = await status(c)
    return st is not None and any(ci.id == jid and ci.migrated for ci in st.containers)


@contextlib.contextmanager
def frozen(d: Daemon) -> Iterator[None]:
    """SIGSTOP a daemon for the block (a hung process, not a dead one); SIGCONT however it ends."""
    d.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        d.proc.send_signal(signal.SIGCONT)


async def specon_cli(c: EmbeddedCluster, *args: str, timeout: float = 90) -> tuple[int, str, str]:
    """Run ``specon ARGS`` against the cluster's manager with its operator token, verifying
    the manager's certificate where it serves TLS (plain HTTP said out loud elsewhere)."""
    assert c.manager is not None
    tls = ["--ca-file", str(c.tls.ca)] if c.tls is not None else ["--insecure-http"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specon.cli.main", *args, "--manager", c.manager.url,
        "--token-file", str(c.tokens_dir / "operator"), *tls,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def training(c: EmbeddedCluster, *jids: str) -> bool:
    """Every one of ``jids`` has trained a step (its handlers are in: a SIGTERM now makes it
    checkpoint; before, it only ends the process) and the manager lists it running."""
    if not all(any("loss" in r for r in records(c, j)) for j in jids):
        return False
    st = await status(c)
    running = {x.id for x in (st.containers if st else ()) if x.phase == "running"}
    return running >= set(jids)


async def drained_with_fresh_checkpoints(
    c: EmbeddedCluster, jobs: tuple[str, ...], source: str, target: str
) -> str:
    """``specon drain SOURCE --wait`` with ``jobs`` training there: it says it moved each, and
    each job's move is ``evacuated`` SOURCE -> TARGET, done, losing no step. Its output."""
    code, out, err = await specon_cli(c, "drain", source, "--wait")
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert lines[0] == f"{source} cordoned: {len(jobs)} job(s) to move", out
    assert lines[-1] == f"{source} drained: it runs no job", out
    for j in jobs:
        m = await migration_of(c, j)
        assert m is not None and (m.reason, m.source, m.target, m.state.value) == (
            "evacuated", source, target, "done"), m  # fmt: skip
        assert m.lost_steps == 0 and f"  {j}: {source} -> {target} moved" in out, (m, out)
    return out
