"""A seeded chaos run on the embedded cluster: random faults while jobs migrate (``make chaos``).

Real manager, agent and training-job processes (``EmbeddedCluster``, ``jobs/curve_job.py``),
the manager and each agent on a network host of its own, over TLS, one agent's clock five
minutes fast and another's seven minutes slow, each agent's host with a boot id of its own
(``chaos_hosts``: each said in the notes where this machine cannot have it).
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
  than ``worker_timeout`` (but not ``recovery.after``), mostly while a save or a restore is
  in flight;
* cut an agent's link for longer than ``recovery.after`` (a long partition), just after it
  was given a wave of jobs: the manager restores them elsewhere while their copies on the
  cut-off host run on, until fencing stops each (exit 76);
* lose a host: SIGKILL its agent and every job process on it at once, and bring the agent
  back after a pause under the same worker id (a reboot: its jobs are gone; see
  ``Chaos.lose_host``); the manager restores them elsewhere after ``recovery.after``;
* reclaim a host: a cloud's notice (GKE's ``impending-node-termination`` taint, in the
  agent's ``--taints-file``), then the host lost ``recovery.evacuate_deadline`` later (the
  manager drains it meanwhile: each job saved and moved off, ahead of other migrations).

One job of each wave saves slowly (longer than ``worker_timeout``), so saves outlast the
manager's view of their worker.

Judged from the jobs' own progress logs and from ``/proc`` (``jobwatch``): no job lost
(every job ends ``finished``); no stale commit (``jobwatch.stale_commits``: no record of a
copy older than one that had started, nothing written after ``finished``); no restart that
left the job without a live copy for longer than ``recovery.after`` + ``restore_allowance``
(``jobwatch.handover_gaps``, on the logs as tailed during the run); two processes of a job
at once only while the older one, fenced, has yet to reach its next write (a ``/proc``
watchdog over every job's processes); no step lost beyond the last complete checkpoint;
every job ends with exactly its steps. The counts (faults by kind, kills and partitions by
the migration states in flight, hosts lost, long partitions, slow saves, copies fenced,
recoveries, migrations done and rolled back, stale commits, the longest restart gap) are
printed, as the run goes too, and written to a JSON file.

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
import shutil
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
from typing import Any

import structlog
from chaos_hosts import placement
from jobwatch import (
    assert_exactly_its_steps,
    finished,
    generation_of,
    handover_gaps,
    job_and_launcher_environs,
    job_environs,
    launch_of,
    parent_of,
    records,
    restart_agent,
    spec,
    stale_commits,
    worker_of,
)

from specon import checkpoint
from specon.embedded.cluster import EmbeddedCluster
from specon.fence import EXIT_FENCED
from specon.model import ContainerId, WorkerId
from specon.runtime.base import StartFailed
from specon.runtime.volume import JobPaths
from specon.testing.net_hosts import NetHost
from specon.testing.progress_log import BrokenLogError
from specon.wire.status import Status


@dataclass(frozen=True)
class ChaosConfig:
    seed: int = 1
    migrations: int = 100  # finished migrations (done or rolled back) to reach
    min_faults: int = 0  # ... and at least this many faults
    workers: int = 3
    cpus_per_worker: float = 0.5
    jobs_per_wave: int = 6
    steps: int = 400  # about 13 s of training: long partitions find jobs to fence
    step_seconds: float = 0.03
    max_seconds: float = 1800.0  # give up (and fail) after this long
    # Once the faults stop: every job must finish within this, or it counts as lost.
    finish_seconds: float = 180.0
    lost_after: float = 40.0  # running nowhere longer than this (unfinished) = lost
    fault_every: tuple[float, float] = (0.5, 2.5)  # seconds between faults, uniform
    volume_bytes: int = 256 << 20  # the tmpfs the volume lives on (the full-disk fault)
    min_partitions: int = 0  # ... and at least this many partitions (where hosts can be cut)
    min_host_losses: int = 0  # ... and at least this many lost hosts
    min_long_partitions: int = 0  # ... and at least this many agents cut off past recovery.after
    min_reclaims: int = 0  # ... and at least this many hosts reclaimed after a notice
    slow_save: float = 4.5  # seconds one job per wave takes to save (> worker_timeout)
    # The policy's recovery.after: a worker silent this long is lost, its jobs restored elsewhere.
    recovery_after: float = 6.0
    # The policy's recovery.evacuate_deadline: a reclaimed host dies this long after its notice.
    evacuate_deadline: float = 10.0
    # What a restore may take on top of recovery.after before a job counts as having run
    # nowhere for too long (``handover_gaps``): the reconciler's pass (1 s), the start command's
    # way to the target (a long poll; heartbeats every 0.5 s), a crash's backoff (at most
    # max_backoff, 5 s), the agent's first heartbeat after a cut (a request in flight times out
    # first: up to SPECON_AGENT_REQUEST_TIMEOUT, 10 s, but recovery.after runs meanwhile) and
    # the agent's own start of the launcher. The gap ends once the new copy's launcher runs:
    # its interpreter's start and checkpoint load on the worker's CPU share (0.5 CPU for all
    # its jobs: 1 s, or 12 s with the suite's other tests on the same two cores) is the
    # worker's speed, not the cluster's handover.
    restore_allowance: float = 15.0
    # How long a partition lasts: a blip, longer than the policy's worker_timeout (4 s) but
    # shorter than recovery.after, or (agents only) longer than recovery.after by this much.
    blip: tuple[float, float] = (0.5, 3.0)
    cut_off: tuple[float, float] = (4.5, 5.5)
    long_cut: tuple[float, float] = (2.0, 6.0)
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
    # Two processes of one job at once: legitimate only while the older one, fenced, has yet
    # to reach its next write (its host was taken for lost); the longest any such overlap was.
    longest_overlap: float = 0.0
    slow_saves: int = 0  # slow saves begun ("saving" records)
    # Jobs on a host when its reclaim notice came, and those of them moved off before it died.
    reclaimed_jobs: int = 0
    reclaimed_moved: int = 0
    fenced: int = 0  # copies that stopped because a newer one had started (exit 76)
    # Records a stale copy wrote after a newer one started (``jobwatch.stale_commits``).
    stale_commits: int = 0
    # Restarts with no live copy for longer than recovery.after + restore_allowance
    # (``jobwatch.handover_gaps``); the bound, the longest gap, and which restart it was.
    gap_bound: float = 0.0
    longest_gap: float = 0.0
    longest_gap_at: str = ""
    gaps_over_bound: int = 0
    # The slowest restart's start-up: its launch to its ``started`` record (not in the gaps).
    longest_launch: float = 0.0
    longest_launch_at: str = ""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(n for k, n in self.faults.items() if k.startswith("kill"))

    @property
    def partitions(self) -> int:
        return sum(n for k, n in self.faults.items() if k.startswith("partition"))

    @property
    def long_partitions(self) -> int:
        """Agents cut off for longer than recovery.after: taken for lost, their jobs restored
        elsewhere while the cut-off copies run on until fenced."""
        return self.faults["partition-agent-long"]

    def summary(self) -> str:
        lines = [
            f"chaos seed {self.seed}: {self.jobs} jobs, {self.seconds:.0f} s",
            f"  faults: {dict(sorted(self.faults.items()))} ({self.kills} kills)",
            f"  kills by migration state in flight: {dict(sorted(self.kills_by_state.items()))}",
            f"  partitions ({self.partitions}, {self.long_partitions} longer than recovery.after)"
            f" by migration state in flight: {dict(sorted(self.partitions_by_state.items()))}",
            f"  hosts lost: {self.faults['host-loss']}; reclaimed after a notice: {self.faults['reclaim']}"
            f" ({self.reclaimed_moved} of their {self.reclaimed_jobs} jobs moved off in time);"
            f" slow saves: {self.slow_saves}; stale copies fenced (exit {EXIT_FENCED}): {self.fenced}",
            f"  clocks off the manager's: {self.skews or 'none'}",
            f"  recoveries: {self.recoveries}; migrations: {dict(sorted(self.migrations.items()))};"
            f" jobs restored after running nowhere: {dict(sorted(self.restored.items()))}",
            f"  most copies of one job at once: {self.max_copies} (longest overlap, the older"
            f" copy fenced: {self.longest_overlap:.1f} s); longest unfinished job running nowhere"
            f" (/proc): {self.longest_down:.1f} s",
            f"  stale commits: {self.stale_commits}; restarts with no live copy for longer than"
            f" {self.gap_bound:.0f} s: {self.gaps_over_bound} (longest {self.longest_gap:.1f} s"
            f"{', ' + self.longest_gap_at if self.longest_gap_at else ''}); slowest restart from"
            f" its launch to its first record: {self.longest_launch:.1f} s"
            f"{', ' + self.longest_launch_at if self.longest_launch_at else ''}",
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
        data["long_partitions"] = self.long_partitions
        data["host_losses"] = self.faults["host-loss"]
        data["reclaims"] = self.faults["reclaim"]
        return json.dumps(data, indent=2, sort_keys=True)


_ENDED = ("done", "rolled_back")
WORKER_TIMEOUT = 4.0  # the run's policy: a worker silent this long is unreachable
# Tries at bringing an agent back (each waits 30 s for it to answer): a full run on two cores
# shared with a test suite (load 25) once saw three in a row time out.
AGENT_STARTS = 6
# A fenced copy may outlive the start of its successor by its slow save, or by a SIGSTOP
# (at most 3 s) that held it before its next write, and a loaded machine's lag on top.
OVERLAP_SLACK = 5.0
# How often each fault is drawn, relative to the others.
FAULT_WEIGHTS = {
    "kill-manager": 2,
    "kill-agent": 3,
    "stop-manager": 1,
    "stop-agent": 1,
    "stop-job": 2,
    "kill-saving-job": 2,
    "corrupt": 2,
    "full-disk": 1,
    "partition": 6,
    # The rarest of a full run's targets (20 each, and each takes 10-20 s): drawn often
    # enough for a full run to take about 20 minutes on two shared cores.
    "partition-long": 10,
    "host-loss": 10,
    "reclaim": 3,
}

# What the hosts' notice hook writes: GKE's taint for a spot VM about to be reclaimed.
RECLAIM_TAINT = "cloud.google.com/impending-node-termination=true:NoSchedule"


def _policy(path: Path, recovery_after: float, evacuate_deadline: float) -> Path:
    path.write_text(
        "apiVersion: specon/v1alpha1\n"
        "kind: Policy\n"
        "monitor: {interval: 1, alpha: 0.02}\n"
        f"messaging: {{heartbeat_interval: 0.5, worker_timeout: {WORKER_TIMEOUT:g}}}\n"
        "migration: {grace_period: 5, max_concurrent: 2, save_timeout: 30, restore_timeout: 30,\n"
        "            min_residence: 0}\n"
        # Migration safety is what is tested: every move Algorithm 2 picks is made, at once.
        "placement: {max_migrations_per_container: 3, require_gain: false}\n"
        # A lost host's jobs come back well within lost_after.
        f"recovery: {{after: {recovery_after:g}, backoff: 1, max_backoff: 5,"
        f" evacuate_deadline: {evacuate_deadline:g}}}\n"
        'rebalance: {mode: "balanced", when: "always", max_rebalances_per_container: 3}\n'
    )
    return path


class LogTail:
    """A job's progress log as it grows, each whole record stamped with when this process
    first saw it (its monotonic clock: the hosts' clocks are minutes apart)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.seen: list[tuple[float, dict[str, Any]]] = []
        self.finished = False
        self.broken = False  # a whole line that is no record (judged from the file later)

    def read(self, now: float) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                self.broken = True
                continue
            self.seen.append((now, r))
            self.finished = self.finished or r.get("event") == "finished"

    @property
    def slow_saves(self) -> int:
        return sum(r.get("event") == "saving" for _, r in self.seen)


class ProcessWatch:
    """Every job's processes, from one ``/proc`` scan every 0.2 s: copies at once, how long
    two overlapped, and time spent running nowhere while unfinished (SIGSTOPped processes
    still count as running); and every job's progress log, tailed at each scan."""

    def __init__(self, c: EmbeddedCluster) -> None:
        self.c = c
        self.markers: dict[bytes, str] = {}
        self.tails: dict[str, LogTail] = {}
        self.max_copies: dict[str, int] = {}
        self.down_since: dict[str, float] = {}
        self.longest_down: dict[str, float] = {}
        self.overlap_since: dict[str, float] = {}
        self.longest_overlap: dict[str, float] = {}
        self.pids: dict[str, dict[int, str]] = {}
        # When a process of each generation of each job was last seen (handover_gaps' alive),
        # and when each copy of it was launched: its launcher first seen, or the job process
        # where its launcher was not (handover_gaps' launched).
        self.alive: dict[str, dict[int, float]] = {}
        self.launched: dict[str, dict[int, list[float]]] = {}
        self.first_seen: dict[int, float] = {}  # pid -> when, for the processes still there

    def add(self, jid: str) -> None:
        path = JobPaths(self.c.volume, ContainerId(jid)).progress
        self.tails[jid] = LogTail(path)  # first: a scan finds the job by its marker
        self.markers[f"SPECON_PROGRESS_FILE={path}".encode()] = jid

    def ended(self, jid: str) -> bool:
        tail = self.tails[jid]
        return tail.finished or tail.broken

    @property
    def slow_saves(self) -> int:
        return sum(t.slow_saves for t in list(self.tails.values()))

    def scan(self) -> None:
        markers = dict(self.markers)  # jobs are added meanwhile, by the submitter
        found: dict[str, dict[int, str]] = {jid: {} for jid in markers.values()}
        gens: dict[tuple[str, int], int | None] = {}
        now = time.monotonic()
        first_seen: dict[int, float] = {}
        for pid, env, launcher in job_and_launcher_environs():
            jid = next((markers[e] for e in env if e in markers), None)
            if jid is None:
                continue
            gen = generation_of(env)
            first_seen[pid] = self.first_seen.get(pid, now)
            new_copy = launcher or parent_of(pid) not in self.first_seen  # not its launcher's child
            if pid not in self.first_seen and gen is not None and new_copy:
                self.launched.setdefault(jid, {}).setdefault(gen, []).append(now)
            if not launcher:
                found[jid][pid] = worker_of(env)
                gens[jid, pid] = gen
        self.first_seen = first_seen
        for (jid, _), gen in gens.items():
            if gen is not None:
                self.alive.setdefault(jid, {})[gen] = now
        for jid, procs in found.items():
            self.tails[jid].read(now)
            self.max_copies[jid] = max(self.max_copies.get(jid, 0), len(procs))
            if len(procs) > 1:
                since = self.overlap_since.setdefault(jid, now)
                self.longest_overlap[jid] = max(self.longest_overlap.get(jid, 0.0), now - since)
            else:
                self.overlap_since.pop(jid, None)
            if procs or self.ended(jid):
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
        self.started = time.monotonic()  # the run's start (``run`` sets it again)
        self.watch = ProcessWatch(c)
        self.jobs: list[str] = []
        self.corrupt: dict[str, set[int]] = {}
        # Held while a job is submitted to the worker, and while its host is down: nobody
        # starts a job on a dead host, and a host dies with every job it was given.
        self.host_up = {w: asyncio.Lock() for w in c.workers}
        self.fresh_wave: tuple[WorkerId, float] | None = None  # the newest wave: (worker, when)

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

    def given_up(self) -> dict[str, list[float]]:
        """When (wall clock, the manager's: it runs unskewed) each restore the manager gave up
        on was decided, by job: its target went silent (a host lost or stopped right after it
        was chosen), and the job was restored again elsewhere. One read of the journal."""
        path = self.c.root / "manager" / "journal.db"
        out: dict[str, list[float]] = {}
        if not path.exists():
            return out
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            rows = db.execute(
                "SELECT container, decided_at FROM migrations WHERE state = 'rolled_back'"
                " AND error LIKE 'gave up in state restoring%'"
            ).fetchall()
        for jid, t in rows:
            out.setdefault(str(jid), []).append(float(t))
        return out

    def restored(self) -> Counter[str]:
        """Journaled recoveries (jobs restored after running nowhere), by reason."""
        path = self.c.root / "manager" / "journal.db"
        if not path.exists():
            return Counter()
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            query = "SELECT reason, COUNT(*) FROM migrations WHERE reason IN (?, ?) GROUP BY reason"
            rows = db.execute(query, ("recovered", "crashed")).fetchall()
        return Counter(dict(rows))

    def exit_codes(self, jid: str) -> Counter[int | None]:
        """How the job's runs ended, by exit code (its ``exits.jsonl``)."""
        try:
            text = JobPaths(self.c.volume, ContainerId(jid)).exits.read_text()
        except FileNotFoundError:
            return Counter()
        out: Counter[int | None] = Counter()
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                out[json.loads(line).get("exit_code")] += 1
        return out

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
            self.fresh_wave = (worker, time.monotonic())
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
                async with self.host_up[worker]:
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
            if (self.disk or k != "full-disk") and (self.links or not k.startswith("partition"))
        }
        owed = self.owed()
        if owed and time.monotonic() - self.started > self.cfg.max_seconds / 2:
            # Half the run gone with a quota unmet: draw only what it still needs, so the run
            # meets its quotas within max_seconds instead of giving up on a long unlucky draw.
            weights = {k: w for k, w in weights.items() if k in owed} or weights
        action = rng.choices(list(weights), weights=list(weights.values()))[0]
        if action == "kill-manager" and c.manager is not None:
            await self.kill_daemon("manager")
            await c.start_manager()
            self.report.recoveries += 1
        elif action == "kill-agent":
            w = rng.choice(c.workers)
            await self.kill_daemon("agent", w)
            await restart_agent(c, w, attempts=AGENT_STARTS)
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
        elif action == "partition-long":
            await self.partition_long()
        elif action == "host-loss":
            await self.lose_host(rng.choice(c.workers))
        elif action == "reclaim":
            await self.reclaim(rng.choice(c.workers))

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

    async def partition_long(self) -> None:
        """Cut an agent's link for longer than recovery.after: the manager takes its host for
        lost and restores its jobs elsewhere, while their copies on the cut-off host run on
        (the volume is shared) until each finds the newer generation at its next write and
        stops without writing (fencing). A job trains for about ten seconds, so the cut must
        come early in its life for it to outlive recovery.after there: the worker of the
        next wave, cut as soon as it has been given it (or, after 10 s without one, the
        worker whose running jobs have the most steps left)."""
        asked = time.monotonic()
        while time.monotonic() - asked < 10.0 and (self.fresh_wave is None or self.fresh_wave[1] < asked):
            await asyncio.sleep(0.05)
        st = await self.status()
        states = [m.state.value for m in st.migrations if m.state.value not in _ENDED] if st else ["unknown"]
        workers = list(self.c.workers)
        if self.fresh_wave is not None and self.fresh_wave[1] >= asked:
            w = self.fresh_wave[0]
        else:
            left: Counter[str] = Counter()
            for jid, procs in self.watch.pids.items():
                steps = [r["step"] for _, r in self.watch.tails[jid].seen if "loss" in r]
                for worker in set(procs.values()):
                    left[worker] += self.cfg.steps - (steps[-1] if steps else 0)
            w = max(workers, key=lambda w: (left[w], self.rng.random()))
        host = self.links[1 + workers.index(w)]  # the manager's first, then the agents' in order
        self.report.faults["partition-agent-long"] += 1
        for s in states or ["none"]:
            self.report.partitions_by_state[s] += 1
        host.cut()
        try:
            await asyncio.sleep(self.cfg.recovery_after + self.rng.uniform(*self.cfg.long_cut))
        finally:
            host.mend()

    async def reclaim(self, w: WorkerId) -> None:
        """A reclaim notice on ``w``'s host, and the host gone ``evacuate_deadline`` later
        (what a spot VM's two minutes, or GKE's 30 s, come to), back after a pause without
        the notice (a new VM under the same worker id)."""
        async with self.host_up[w]:
            self.report.faults["reclaim"] += 1
            on_it = {jid for jid, procs in self.watch.pids.items() if w in procs.values()}
            self.c.set_taints(w, RECLAIM_TAINT)
            await asyncio.sleep(self.cfg.evacuate_deadline)
            left = {jid for jid, procs in self.watch.pids.items() if w in procs.values()}
            self.report.reclaimed_jobs += len(on_it)
            self.report.reclaimed_moved += len(on_it - left)
            self.c.set_taints(w)  # the host that comes back is a new VM: no notice on it
            await self._down(w)

    async def lose_host(self, w: WorkerId) -> None:
        """The host dies: its agent and every job process on it at once, no goodbye, no save;
        it comes back (a reboot) after a pause, its jobs gone.

        This is the host-reboot fault too, not a second one: the agent comes back under the
        same worker id with none of its jobs running. What a real reboot adds is a new boot
        id, and the runtime already treats a run whose pid is gone on this boot and a run
        of another boot alike (not running here); the one kernel of this machine keeps its
        boot id, so the restarted agent finds its jobs' ``owner.json`` naming dead pids."""
        await self.mid_migration(within=self.rng.uniform(0.0, 4.0))
        async with self.host_up[w]:
            self.report.faults["host-loss"] += 1
            await self._down(w)

    async def _down(self, w: WorkerId) -> None:
        """``w``'s agent and every job process on its host SIGKILLed at once, the agent back
        after a pause (call with ``host_up[w]`` held)."""
        self.c.kill(self.c.agents[w])
        markers = dict(self.watch.markers)  # every job's: from /proc now, not the last scan
        for pid, env in job_environs():
            if worker_of(env) == w and any(e in markers for e in env):
                with contextlib.suppress(ProcessLookupError):  # the job and its launcher
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
        await asyncio.sleep(self.rng.uniform(2.0, 10.0))
        await restart_agent(self.c, w, attempts=AGENT_STARTS)
        self.report.recoveries += 1

    def owed(self) -> set[str]:
        """The fault kinds a quota not yet met still needs (``run``'s loop condition)."""
        r, cfg, out = self.report, self.cfg, set()
        if r.kills < cfg.min_faults:
            out |= {"kill-manager", "kill-agent", "kill-saving-job"}
        if self.links and r.partitions < cfg.min_partitions:
            out |= {"partition", "partition-long"}
        if self.links and r.long_partitions < cfg.min_long_partitions:
            out.add("partition-long")
        if r.faults["host-loss"] < cfg.min_host_losses:
            out.add("host-loss")
        if r.faults["reclaim"] < cfg.min_reclaims:
            out.add("reclaim")
        return out

    async def faults(self, stop: asyncio.Event) -> None:
        lo, hi = self.cfg.fault_every
        while not stop.is_set():
            await asyncio.sleep(self.rng.uniform(lo, hi))
            if not stop.is_set():
                await self.fault()

    # -- the run ----------------------------------------------------------------------------
    async def run(self) -> None:
        t0 = self.started = time.monotonic()
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
                or (self.links and self.report.long_partitions < self.cfg.min_long_partitions)
                or self.report.faults["host-loss"] < self.cfg.min_host_losses
                or self.report.faults["reclaim"] < self.cfg.min_reclaims
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
                    r = self.report
                    print(f"  .. {time.monotonic() - t0:5.0f} s: {done} migrations finished, "
                          f"{r.kills} kills, {r.partitions} partitions ({r.long_partitions} long), "
                          f"{r.faults['host-loss']} hosts lost, {self.watch.slow_saves} slow saves, "
                          f"{len(self.jobs)} jobs", flush=True)  # fmt: skip
                    last = done
                await asyncio.sleep(1.0)
            stop.set()
            await asyncio.gather(tasks[1], tasks[2], return_exceptions=True)
            print("  .. faults stopped; waiting for every job to finish", flush=True)
            deadline = time.monotonic() + self.cfg.finish_seconds
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
        r.longest_overlap = max(self.watch.longest_overlap.values(), default=0.0)
        r.slow_saves = self.watch.slow_saves
        r.gap_bound = self.cfg.recovery_after + self.cfg.restore_allowance
        r.fenced = sum(self.exit_codes(jid)[EXIT_FENCED] for jid in self.jobs)
        wall = time.time() - time.monotonic()  # the tails' clock to the manager's
        given_up_all = self.given_up()
        for jid in self.jobs:
            given_up = given_up_all.get(jid, [])
            with contextlib.suppress(BrokenLogError):  # said already, by self.finished
                for why in stale_commits(records(self.c, jid)):
                    r.stale_commits += 1
                    r.problems.append(f"{jid}: stale commit: {why}")
            for (gap, started), (t, _) in zip(
                handover_gaps(
                    self.watch.tails[jid].seen, self.watch.alive.get(jid), self.watch.launched.get(jid)
                ),
                [x for x in self.watch.tails[jid].seen[1:] if x[1].get("event") == "started"],
                strict=True,
            ):
                gen = started.get("generation")
                where = f"{jid} gen {gen} from step {started.get('step')}"
                if gap > r.longest_gap:
                    r.longest_gap, r.longest_gap_at = gap, where
                # The gap ends at the copy's launch (handover_gaps), its start-up is reported.
                end = launch_of(self.watch.launched.get(jid, {}), gen, t)
                if t - end > r.longest_launch:
                    r.longest_launch, r.longest_launch_at = t - end, where
                # A restore whose target went silent right after (lost, or stopped) is given up
                # after worker_timeout and made again elsewhere: each such one within the gap
                # allows another notice and restore.
                again = sum(wall + end - gap - 1.0 <= d <= wall + end for d in given_up)
                bound = r.gap_bound + again * (WORKER_TIMEOUT + self.cfg.restore_allowance)
                if gap > bound:
                    r.gaps_over_bound += 1
                    r.problems.append(f"{where}: no live copy for {gap:.1f} s (> {bound:g} s)")
            if not self.finished(jid):
                r.problems.append(f"{jid}: lost (never finished)")
                continue
            # Two processes at once: the older one fenced, it stops at its next write (after
            # a slow save or a SIGSTOP at worst); one that outlives that bound was not stopped.
            overlap = self.watch.longest_overlap.get(jid, 0.0)
            if overlap > self.cfg.slow_save + OVERLAP_SLACK:
                copies = self.watch.max_copies[jid]
                r.problems.append(f"{jid}: ran {copies} times at once for {overlap:.1f} s")
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


KEPT = ("progress.jsonl", "exits.jsonl", "generation.json", "owner.json", "stderr.log")


def _keep_volume(volume: Path, to: Path) -> None:
    """Copy what judges each job (its progress log, exits, generation, owner, stderr) out of
    the volume's tmpfs, which goes with the run."""
    for job in sorted((volume / "jobs").glob("*")):
        for name in KEPT:
            if (job / name).is_file():
                (to / job.name).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(job / name, to / job.name / name)


async def run_chaos(root: Path, cfg: ChaosConfig, *, keep_volume: bool = False) -> ChaosReport:
    """The run in ``root``; ``keep_volume``: copy the jobs' files to ``root/kept`` at the end."""
    report = ChaosReport(seed=cfg.seed)
    root.mkdir(parents=True, exist_ok=True)
    policy = _policy(root / "policy.yaml", cfg.recovery_after, cfg.evacuate_deadline)
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
                for worker, boot in where.boot_ids.items():
                    # This process submits jobs through each worker's runtime: it records their
                    # runs as that worker's host, which its agent's runtime then recognises.
                    c.runtime(WorkerId(worker))._host = boot  # type: ignore[attr-defined]
                try:
                    await Chaos(c, cfg, report, disk=why_not is None, links=where.links).run()
                finally:
                    if c.manager is not None:  # a SIGTERMed manager waits out open long polls
                        c.kill(c.manager)
    finally:
        if keep_volume:
            _keep_volume(volume, root / "kept")
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
    p.add_argument(
        "--min-long-partitions",
        type=int,
        default=20,
        help="agents cut off for longer than recovery.after to reach as well (default 20)",
    )
    p.add_argument(
        "--min-reclaims",
        type=int,
        default=5,
        help="hosts reclaimed after a notice to reach as well (default 5)",
    )
    p.add_argument("--out", type=Path, default=Path("chaos.json"), help="where to write the counts (JSON)")
    p.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="keep the cluster's files here, the jobs' in kept/ (default: a temp dir)",
    )
    args = p.parse_args(argv)
    cfg = ChaosConfig(
        seed=args.seed,
        migrations=args.migrations,
        min_partitions=args.min_partitions,
        min_host_losses=args.min_host_losses,
        min_long_partitions=args.min_long_partitions,
        min_reclaims=args.min_reclaims,
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
        report = asyncio.run(run_chaos(root, cfg, keep_volume=args.dir is not None))
    print(report.summary(), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)  # bench/results/ is not in a fresh clone
    args.out.write_text(report.to_json() + "\n")
    print(f"counts written to {args.out}")
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
