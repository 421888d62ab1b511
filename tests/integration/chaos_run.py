"""A seeded chaos run on the embedded cluster: random faults while jobs migrate (``make chaos``).

Real manager, agent and training-job processes (``EmbeddedCluster``, ``jobs/curve_job.py``),
the manager and each agent on a network host of its own, over TLS, one agent's clock five
minutes fast and another's seven minutes slow (``chaos_hosts``: each said in the notes where
this machine cannot have it).
Waves of converging jobs are submitted onto one worker at a time, so Algorithm 2 moves
them off it and Algorithm 3 evens the workers out: migrations go on all the time. Meanwhile,
at random points drawn from ``--seed``:

* SIGKILL the manager or an agent (restarted after a random pause), or a job in the middle
  of its save;
* SIGSTOP a manager, an agent or a job for a while, then SIGCONT (a hang, not a crash);
* corrupt the newest checkpoint of a job (the one a migration in flight restores from,
  when there is one: bit rot between save and restore);
* fill the volume (a size-limited tmpfs mounted for the run; needs root, skipped and said
  so otherwise) for a few seconds, mostly while a save is under way;
* cut the link of the manager's host or an agent's (a partition) for a blip or for longer
  than ``worker_timeout``, mostly while a save or a restore is in flight;
* lose a host: SIGKILL its agent and every job process on it at once, and bring the agent
  back after a pause (a reboot: its jobs are gone); the manager restores them elsewhere
  after ``recovery.after``.

One job of each wave saves slowly (longer than ``worker_timeout``), so saves outlast the
manager's view of their worker.

Judged from the jobs' own progress logs and from ``/proc`` (``jobwatch``): no job lost
(every job ends ``finished``), none ran twice at once (a ``/proc`` watchdog over every
job's processes), no step lost beyond the last complete checkpoint, every job ends with
exactly its steps. The counts (faults by kind, kills by the migration states in flight,
partitions by the migration states in flight, recoveries, migrations done and rolled back)
are printed and written to a JSON file.

``python tests/integration/chaos_run.py --seed 1 --migrations 100 --out chaos.json``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog
from chaos_hosts import placement
from jobwatch import (
    assert_exactly_its_steps,
    finished,
    job_environs,
    restart_agent,
    spec,
    worker_of,
)

from specon import checkpoint
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import StartFailed
from specon.runtime.volume import JobPaths
from specon.testing.net_hosts import NetHost
from specon.testing.progress_log import BrokenLogError
from specon.wire.protocol import Status


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    migrations: int = 100  # finished migrations (done or rolled back) to reach
    min_faults: int = 0  # ... and at least this many faults
    workers: int = 3
    cpus_per_worker: float = 0.5
    jobs_per_wave: int = 6
    steps: int = 300
    step_seconds: float = 0.03
    max_seconds: float = 1800.0  # give up (and fail) after this long
    lost_after: float = 40.0  # running nowhere longer than this (unfinished) = lost
    fault_every: tuple[float, float] = (0.5, 2.5)  # seconds between faults, uniform
    volume_bytes: int = 256 << 20  # the tmpfs the volume lives on (the full-disk fault)
    min_partitions: int = 0  # ... and at least this many partitions (where hosts can be cut)
    min_host_losses: int = 0  # ... and at least this many lost hosts
    slow_save: float = 4.5  # seconds one job per wave takes to save (> worker_timeout)
    # How long a partition lasts: a blip, or longer than the policy's worker_timeout (4 s).
    blip: tuple[float, float] = (0.5, 3.0)
    cut_off: tuple[float, float] = (5.0, 10.0)
    # Seconds each worker's clock is off the manager's (libfaketime): one fast, one slow.
    skews: tuple[float, ...] = (0.0, 300.0, -420.0)


@dataclass
class ChaosReport:
    seed: int
    seconds: float = 0.0
    jobs: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    # Daemon kills by the migration states in flight at that moment ("none": no migration).
    kills_by_state: Counter[str] = field(default_factory=Counter)
    # Partitions likewise ("unknown": the manager did not answer just then).
    partitions_by_state: Counter[str] = field(default_factory=Counter)
    skews: dict[str, float] = field(default_factory=dict)  # worker -> seconds its clock was off
    hosts_tag: str = ""  # what the run's network namespaces and links were named with
    recoveries: int = 0  # daemons restarted after a kill
    # Journaled recoveries of jobs that ran nowhere, by reason (host lost, crashed).
    restored: Counter[str] = field(default_factory=Counter)
    migrations: Counter[str] = field(default_factory=Counter)  # journaled, by final state
    max_copies: int = 0
    longest_down: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(n for k, n in self.faults.items() if k.startswith("kill"))

    @property
    def partitions(self) -> int:
        return sum(n for k, n in self.faults.items() if k.startswith("partition"))

    def summary(self) -> str:
        lines = [
            f"chaos seed {self.seed}: {self.jobs} jobs, {self.seconds:.0f} s",
            f"  faults: {dict(sorted(self.faults.items()))} ({self.kills} kills)",
            f"  kills by migration state in flight: {dict(sorted(self.kills_by_state.items()))}",
            f"  partitions ({self.partitions}) by migration state in flight:"
            f" {dict(sorted(self.partitions_by_state.items()))}",
            f"  clocks off the manager's: {self.skews or 'none'}",
            f"  recoveries: {self.recoveries}; migrations: {dict(sorted(self.migrations.items()))};"
            f" jobs restored after running nowhere: {dict(sorted(self.restored.items()))}",
            f"  most copies of one job at once: {self.max_copies}; longest unfinished job"
            f" running nowhere: {self.longest_down:.1f} s",
            *(f"  note: {n}" for n in self.notes),
            f"  problems: {len(self.problems)}" + "".join(f"\n    - {p}" for p in self.problems),
        ]
        return "\n".join(lines)

    def to_json(self) -> str:
        data = asdict(self)
        for name in (
            "faults",
            "kills_by_state",
            "partitions_by_state",
            "migrations",
            "restored",
        ):  # asdict mangles Counters
            data[name] = dict(sorted(getattr(self, name).items()))
        data["kills"] = self.kills
        data["partitions"] = self.partitions
        return json.dumps(data, indent=2, sort_keys=True)


_ENDED = ("done", "rolled_back")
# How often each fault is drawn, relative to the others.
FAULT_WEIGHTS = {
    "kill-manager": 3,
    "kill-agent": 4,
    "stop-manager": 1,
    "stop-agent": 2,
    "stop-job": 2,
    "kill-saving-job": 2,
    "corrupt": 2,
    "full-disk": 2,
    "partition": 10,
    "host-loss": 3,
}


def _policy(path: Path) -> Path:
    path.write_text(
        "apiVersion: specon/v1alpha1\n"
        "kind: Policy\n"
        "monitor: {interval: 1, alpha: 0.02}\n"
        "messaging: {heartbeat_interval: 0.5, worker_timeout: 4}\n"
        "migration: {grace_period: 5, max_concurrent: 2, save_timeout: 30, restore_timeout: 30,\n"
        "            min_residence: 0}\n"
        # Migration safety is what is tested: every move Algorithm 2 picks is made, at once.
        "placement: {max_migrations_per_container: 3, require_gain: false}\n"
        # A lost host's jobs come back well within lost_after.
        "recovery: {after: 6, backoff: 1, max_backoff: 5}\n"
        'rebalance: {mode: "balanced", when: "always", max_rebalances_per_container: 3}\n'
    )
    return path


def _ended(c: EmbeddedCluster, jid: str) -> bool:
    """``finished``, with a broken log counting as ended (it is judged as a problem later)."""
    try:
        return finished(c, jid)
    except BrokenLogError:
        return True


class ProcessWatch:
    """Every job's processes, from one ``/proc`` scan every 0.2 s: copies at once and time
    spent running nowhere while unfinished (SIGSTOPped processes still count as running)."""

    def __init__(self, c: EmbeddedCluster) -> None:
        self.c = c
        self.markers: dict[bytes, str] = {}
        self.max_copies: dict[str, int] = {}
        self.down_since: dict[str, float] = {}
        self.longest_down: dict[str, float] = {}
        self.pids: dict[str, dict[int, str]] = {}

    def add(self, jid: str) -> None:
        path = JobPaths(self.c.volume, ContainerId(jid)).progress
        self.markers[f"SPECON_PROGRESS_FILE={path}".encode()] = jid

    def scan(self) -> None:
        found: dict[str, dict[int, str]] = {jid: {} for jid in self.markers.values()}
        for pid, env in job_environs():
            jid = next((self.markers[e] for e in env if e in self.markers), None)
            if jid is not None:
                found[jid][pid] = worker_of(env)
        now = time.monotonic()
        for jid, procs in found.items():
            self.max_copies[jid] = max(self.max_copies.get(jid, 0), len(procs))
            if procs or _ended(self.c, jid):
                self.down_since.pop(jid, None)
            else:
                since = self.down_since.setdefault(jid, now)
                self.longest_down[jid] = max(self.longest_down.get(jid, 0.0), now - since)
        self.pids = found

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.scan)
            await asyncio.sleep(0.2)


class Chaos:
    def __init__(
        self,
        c: EmbeddedCluster,
        cfg: ChaosConfig,
        report: ChaosReport,
        *,
        disk: bool,
        links: list[NetHost] | None = None,
    ) -> None:
        self.c, self.cfg, self.report = c, cfg, report
        self.disk = disk  # the volume is a tmpfs of its own: it can be filled
        self.links = links or []  # the hosts whose links can be cut: the manager's first
        self.rng = random.Random(cfg.seed)
        self.watch = ProcessWatch(c)
        self.jobs: list[str] = []
        self.corrupt: dict[str, set[int]] = {}

    def finished(self, jid: str) -> bool:
        """Whether ``jid`` logged its end; a broken log counts as a problem, once."""
        try:
            return finished(self.c, jid)
        except BrokenLogError as exc:
            if str(exc) not in self.report.problems:
                self.report.problems.append(str(exc))
            return True  # judged already: do not wait for it

    # -- facts ------------------------------------------------------------------------------
    async def status(self) -> Status | None:
        m = self.c.manager
        if m is None or m.proc.poll() is not None:
            return None
        try:
            return await asyncio.wait_for(self.c.status(), 2.0)
        except Exception:  # down, stopped, restarting: no answer is an answer here
            return None

    def journal_counts(self) -> Counter[str]:
        """Migrations by state, read from the manager's journal (also while it is down)."""
        path = self.c.root / "manager" / "journal.db"
        if not path.exists():
            return Counter()
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return Counter(
                dict(db.execute("SELECT state, COUNT(*) FROM migrations GROUP BY state").fetchall())
            )

    def restored(self) -> Counter[str]:
        """Journaled recoveries (jobs restored after running nowhere), by reason."""
        path = self.c.root / "manager" / "journal.db"
        if not path.exists():
            return Counter()
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            query = "SELECT reason, COUNT(*) FROM migrations WHERE reason IN (?, ?) GROUP BY reason"
            rows = db.execute(query, ("recovered", "crashed")).fetchall()
        return Counter(dict(rows))

    def finished_migrations(self) -> int:
        counts = self.journal_counts()
        return counts["done"] + counts["rolled_back"]

    # -- jobs -------------------------------------------------------------------------------
    async def submit_waves(self, stop: asyncio.Event) -> None:
        wave = 0
        while not stop.is_set():
            worker = self.c.workers[wave % len(self.c.workers)]
            for i in range(self.cfg.jobs_per_wave):
                jid = f"j{wave:03d}-{i}"
                self.watch.add(jid)
                self.jobs.append(jid)
                await self.submit(jid, worker)
            wave += 1
            # The next wave once most of this one has finished (a steady stream of moves).
            while not stop.is_set() and sum(not self.finished(j) for j in self.jobs) > self.cfg.jobs_per_wave:
                await asyncio.sleep(0.5)

    async def submit(self, jid: str, worker: WorkerId) -> None:
        """Submit as a user would: again, a moment later, when the volume is full."""
        slow = jid.endswith("-0")  # one per wave saves for longer than worker_timeout
        save = self.cfg.slow_save if slow else 0.0
        job = spec(jid, self.cfg.steps, "converge", step_seconds=self.cfg.step_seconds, save_seconds=save)
        for _ in range(120):
            try:
                await self.c.submit(job, worker)
                return
            except StartFailed as exc:
                if "No space left" not in str(exc):
                    raise
                await asyncio.sleep(0.5)
        raise RuntimeError(f"{jid}: the volume stayed full for a minute")

    # -- faults -----------------------------------------------------------------------------
    async def in_flight_states(self) -> list[str]:
        st = await self.status()
        if st is None:
            return ["unknown"]
        states = [m.state.value for m in st.migrations if m.state.value not in _ENDED]
        return states or ["none"]

    async def mid_migration(self, *states: str, within: float = 4.0) -> Status | None:
        """Wait (at most ``within`` s) for a migration in one of ``states`` (any in flight if
        none given), so that most faults land in the middle of one; the status then."""
        deadline = time.monotonic() + within
        while True:
            st = await self.status()
            if st is not None and any(
                m.state.value in states if states else m.state.value not in _ENDED for m in st.migrations
            ):
                return st
            if time.monotonic() > deadline:
                return st
            await asyncio.sleep(0.05)

    async def kill_daemon(self, kind: str, worker: WorkerId | None = None) -> None:
        await self.mid_migration(within=self.rng.uniform(0.0, 4.0))
        d = self.c.manager if worker is None else self.c.agents[worker]
        assert d is not None
        for s in await self.in_flight_states():
            self.report.kills_by_state[s] += 1
        self.report.faults[f"kill-{kind}"] += 1
        self.c.kill(d)
        await asyncio.sleep(self.rng.uniform(0.0, 2.0))

    async def fault(self) -> None:
        rng, c = self.rng, self.c
        weights = {
            k: w
            for k, w in FAULT_WEIGHTS.items()
            if (self.disk or k != "full-disk") and (self.links or k != "partition")
        }
        action = rng.choices(list(weights), weights=list(weights.values()))[0]
        if action == "kill-manager" and c.manager is not None:
            await self.kill_daemon("manager")
            await c.start_manager()
            self.report.recoveries += 1
        elif action == "kill-agent":
            w = rng.choice(c.workers)
            await self.kill_daemon("agent", w)
            await restart_agent(c, w)
            self.report.recoveries += 1
        elif action in ("stop-manager", "stop-agent"):
            d = c.manager if action == "stop-manager" else c.agents[rng.choice(c.workers)]
            if d is not None:
                self.report.faults[action] += 1
                await self.pause(d.proc.pid)
        elif action == "stop-job":
            live = [(jid, pid) for jid, procs in self.watch.pids.items() for pid in procs]
            if live:
                self.report.faults[action] += 1
                await self.pause(rng.choice(live)[1])
        elif action == "kill-saving-job":
            await self.kill_saving_job()
        elif action == "corrupt":
            await self.corrupt_checkpoint()
        elif action == "full-disk":
            await self.fill_volume()
        elif action == "partition":
            await self.partition()
        elif action == "host-loss":
            await self.lose_host(rng.choice(c.workers))

    async def pause(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def kill_saving_job(self) -> None:
        st = await self.mid_migration("saving")
        saving = [m.container for m in (st.migrations if st else ()) if m.state.value == "saving"]
        for jid in saving:
            for pid in self.watch.pids.get(jid, {}):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self.report.faults["kill-saving-job"] += 1
                self.report.kills_by_state["saving"] += 1
                return

    async def corrupt_checkpoint(self) -> None:
        """Flip a byte of a job's newest checkpoint: the one a migration in flight restores
        from if there is one, else a running job's. Once per job (with two kept, twice
        could leave none intact: then refusing to restart is the right answer, not a loss)."""
        st = await self.mid_migration("saved", "restoring")
        candidates = [
            (m.container, Path(m.checkpoint))
            for m in (st.migrations if st else ())
            if m.state.value in ("saved", "restoring") and m.checkpoint and m.container not in self.corrupt
        ]
        if not candidates:
            for jid in self.rng.sample(self.jobs, min(5, len(self.jobs))):
                info = checkpoint.latest_complete(JobPaths(self.c.volume, ContainerId(jid)).checkpoints)
                if info is not None and jid not in self.corrupt and not self.finished(jid):
                    candidates.append((jid, info.manifest))
                    break
        if not candidates:
            return
        jid, manifest = candidates[0]
        try:
            info = checkpoint.verify(manifest)
            data = bytearray(info.payload.read_bytes())
            data[0] ^= 0xFF  # same size, wrong checksum
            info.payload.write_bytes(bytes(data))
        except (OSError, checkpoint.CheckpointError):
            return  # rotated away meanwhile
        self.corrupt.setdefault(jid, set()).add(info.step)
        self.report.faults["corrupt-checkpoint"] += 1

    async def fill_volume(self) -> None:
        """Fill the volume to the last byte for a few seconds (mostly during a save)."""
        await self.mid_migration("saving")
        filler = self.c.volume / ".chaos-filler"
        self.report.faults["full-disk"] += 1
        try:
            await asyncio.to_thread(_fill, filler)
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        finally:
            filler.unlink(missing_ok=True)

    async def partition(self) -> None:
        """Cut the link of the manager's host or an agent's, mostly while a save or a restore
        is in flight, for a blip or for longer than worker_timeout; mended however it ends."""
        st = await self.mid_migration("saving", "saved", "restoring", within=self.rng.uniform(0.0, 4.0))
        states = [m.state.value for m in st.migrations if m.state.value not in _ENDED] if st else ["unknown"]
        i = self.rng.randrange(len(self.links))
        lo, hi = self.cfg.blip if self.rng.random() < 0.5 else self.cfg.cut_off
        self.report.faults["partition-manager" if i == 0 else "partition-agent"] += 1
        for s in states or ["none"]:
            self.report.partitions_by_state[s] += 1
        self.links[i].cut()
        try:
            await asyncio.sleep(self.rng.uniform(lo, hi))
        finally:
            self.links[i].mend()

    async def lose_host(self, w: WorkerId) -> None:
        """The host dies: its agent and every job process on it at once, no goodbye, no save;
        it comes back (a reboot) after a pause, its jobs gone."""
        await self.mid_migration(within=self.rng.uniform(0.0, 4.0))
        self.report.faults["host-loss"] += 1
        self.c.kill(self.c.agents[w])
        for procs in self.watch.pids.values():
            for pid, worker in procs.items():
                if worker == w:  # the job and its launcher: the whole process group
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
        await asyncio.sleep(self.rng.uniform(2.0, 10.0))
        await restart_agent(self.c, w)
        self.report.recoveries += 1

    async def faults(self, stop: asyncio.Event) -> None:
        lo, hi = self.cfg.fault_every
        while not stop.is_set():
            await asyncio.sleep(self.rng.uniform(lo, hi))
            if not stop.is_set():
                await self.fault()

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> None:
        t0 = time.monotonic()
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(self.watch.run()),
            asyncio.create_task(self.submit_waves(stop)),
            asyncio.create_task(self.faults(stop)),
        ]
        try:
            last = -1
            while (
                self.finished_migrations() < self.cfg.migrations
                or self.report.kills < self.cfg.min_faults
                or (self.links and self.report.partitions < self.cfg.min_partitions)
                or self.report.faults["host-loss"] < self.cfg.min_host_losses
            ):
                broken = [t for t in tasks if t.done()]
                if broken:  # a fault or the submitter failed (e.g. a daemon did not come back)
                    exc = broken[0].exception()
                    where = "".join(traceback.format_exception(exc)[-4:]) if exc else ""
                    self.report.problems.append(f"the run itself failed: {exc!r}\n{where}")
                    break
                if time.monotonic() - t0 > self.cfg.max_seconds:
                    self.report.problems.append(f"gave up after {self.cfg.max_seconds:.0f} s")
                    break
                done = self.finished_migrations()
                if done != last:
                    print(f"  .. {time.monotonic() - t0:5.0f} s: {done} migrations finished, "
                          f"{self.report.kills} kills, {self.report.partitions} partitions, "
                          f"{len(self.jobs)} jobs", flush=True)  # fmt: skip
                    last = done
                await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(tasks[1], tasks[2], return_exceptions=True)
            print("  .. faults stopped; waiting for every job to finish", flush=True)
            deadline = time.monotonic() + 180.0
            while not all(self.finished(j) for j in self.jobs) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.5)  # the last scans see the last processes end
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for host in self.links:  # a partition the run ended in the middle of
                if host.is_cut():
                    host.mend()
        self.judge(time.monotonic() - t0)

    def judge(self, seconds: float) -> None:
        r = self.report
        r.seconds, r.jobs = seconds, len(self.jobs)
        r.migrations = self.journal_counts()
        r.restored = self.restored()
        r.max_copies = max(self.watch.max_copies.values(), default=0)
        r.longest_down = max(self.watch.longest_down.values(), default=0.0)
        for jid in self.jobs:
            if not self.finished(jid):
                r.problems.append(f"{jid}: lost (never finished)")
                continue
            if self.watch.max_copies.get(jid, 0) > 1:
                r.problems.append(f"{jid}: ran {self.watch.max_copies[jid]} times at once")
            if self.watch.longest_down.get(jid, 0.0) >= self.cfg.lost_after:
                r.problems.append(f"{jid}: ran nowhere for {self.watch.longest_down[jid]:.1f} s")
            try:
                assert_exactly_its_steps(
                    self.c, jid, self.cfg.steps, corrupt=frozenset(self.corrupt.get(jid, ()))
                )
            except AssertionError as exc:
                r.problems.append(f"{jid}: {exc}")


def _fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 64):  # to the last bytes, in smaller and smaller pieces
            with contextlib.suppress(OSError):  # ENOSPC: full at this size
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)


def _mount_tmpfs(path: Path, size: int) -> str | None:
    """Mount a tmpfs of ``size`` bytes at ``path``; None, or why it cannot be done here."""
    if os.geteuid() != 0:
        return "not root: no tmpfs for the volume, so no full-disk faults"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        return f"cannot mount a tmpfs ({done.stderr.strip()}): no full-disk faults"
    return None


async def run_chaos(root: Path, cfg: ChaosConfig) -> ChaosReport:
    report = ChaosReport(seed=cfg.seed)
    root.mkdir(parents=True, exist_ok=True)
    policy = _policy(root / "policy.yaml")
    volume = root / "c" / "volume"
    volume.mkdir(parents=True, exist_ok=True)
    why_not = _mount_tmpfs(volume, cfg.volume_bytes)
    if why_not:
        report.notes.append(why_not)
    if len(cfg.skews) != cfg.workers:
        raise ValueError(f"one clock skew per worker: {cfg.workers} workers, skews {cfg.skews}")
    try:
        with placement(root, cfg.skews) as where:
            report.notes += where.notes
            report.skews, report.hosts_tag = where.skews, where.tag
            async with EmbeddedCluster(
                root / "c",
                workers=cfg.workers,
                cpus_per_worker=cfg.cpus_per_worker,
                policy=policy,
                hosts=where.cluster_hosts,
                tls=where.tls,
            ) as c:
                try:
                    await Chaos(c, cfg, report, disk=why_not is None, links=where.links).run()
                finally:
                    if c.manager is not None:  # a SIGTERMed manager waits out open long polls
                        c.kill(c.manager)
    finally:
        if why_not is None:
            subprocess.run(["umount", "--lazy", str(volume)], check=False)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="make chaos", description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1, help="the random faults' seed (default 1)")
    p.add_argument("--migrations", type=int, default=100, help="finished migrations to reach (default 100)")
    p.add_argument(
        "--min-partitions",
        type=int,
        default=30,
        help="partitions to reach as well, where hosts can be cut (default 30)",
    )
    p.add_argument("--min-host-losses", type=int, default=20, help="lost hosts to reach as well (default 20)")
    p.add_argument("--out", type=Path, default=Path("chaos.json"), help="where to write the counts (JSON)")
    p.add_argument(
        "--dir", type=Path, default=None, help="keep the cluster's files here (default: a temp dir)"
    )
    args = p.parse_args(argv)
    cfg = ChaosConfig(
        seed=args.seed,
        migrations=args.migrations,
        min_partitions=args.min_partitions,
        min_host_losses=args.min_host_losses,
    )
    # SIGTERM (a timeout, Ctrl-C's cousin) tears the cluster down like an interrupt does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # This process's own runtime (it submits the jobs) logs one line per job: errors only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    with contextlib.ExitStack() as stack:
        root = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="specon-chaos-")))
        print(
            f"chaos: seed {cfg.seed}, until {cfg.migrations} migrations have finished; files in {root}",
            flush=True,
        )
        report = asyncio.run(run_chaos(root, cfg))
    print(report.summary(), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)  # bench/results/ is not in a fresh clone
    args.out.write_text(report.to_json() + "\n")
    print(f"counts written to {args.out}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
