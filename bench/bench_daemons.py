"""The daemons under load: manager heartbeat throughput and latency, agent CPU tailing 100 logs.

1. Manager: the real ``python -m specon_manager`` pinned to one core; a load generator
   (``bench/_heartbeat_load.py``), pinned to the other core, plays 1,000 agents with 8
   containers each over loopback (four source addresses, 64 requests in flight). Measured:
   heartbeats answered (200) per second as fast as the manager answers, latency p50/p99
   there and at the design load (every agent once per ``heartbeat_interval``: 200/s), the
   manager's CPU per heartbeat (the robust figure on a shared machine) and its RSS, with
   rebalance ``off``; then the shipped default policy (whose ticker runs Algorithm 3 over
   the whole cluster every second), saturated (the target: 10,000/s) and paced at 80 % of
   that rate (the target: p99 under 20 ms). Then the same with ``--fronts`` (the manager past
   one core, docs/architecture.md): the decider pinned as before, each front on a core of its
   own where the machine has one (else beside the decider); measured: heartbeats/s, the
   decider's CPU per heartbeat (the part that cannot be spread: target 0.1 ms, i.e. 10,000
   beats per decider core), the fronts' CPU per heartbeat, p99 at 80 % of the rate. Last,
   the floor under any aiohttp manager (``bench/_aiohttp_floor.py`` on the manager's core):
   CPU per heartbeat of a bare aiohttp app answering a fixed reply, and of the same app
   decoding and checking each body with ``protocol.decode``.
   ``SPECON_BENCH_DAEMONS=manager`` runs this part only.
2. Agent: the real ``python -m specon_agent`` of an embedded cluster (specon.embedded.cluster) whose one
   worker owns 100 running jobs (``bench/_log_job.py``, started through the local runtime,
   each appending a progress record every 0.2 s); the agent's CPU time from /proc over a
   window, as a share of one core: with the default policy (Δ 30 s, heartbeat 5 s), then
   after an agent restart with Δ 1 s and heartbeat 0.5 s. The window opens once the jobs
   are adopted and their one-off convergence burst (a request and a command each) is over.

Everything runs on loopback, is bounded in time, and is torn down in ``finally`` blocks
(SIGTERM is turned into an interrupt for that). Should even those not run (SIGKILL), the
manager and load generator of part 1 die with us (parent-death signal) and every job ends
by itself after its lifetime; only part 2's embedded daemons would be left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench._proc import cpu_seconds, pinned_child, processes_mentioning, quiet_logs, rss_bytes, usable_cpus
from bench.figures import Figure
from specon.config import MessagingConfig, MonitorConfig
from specon.embedded.cluster import EmbeddedCluster, free_port
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec

ROOT = Path(__file__).resolve().parents[1]
LOG_JOB = Path(__file__).with_name("_log_job.py")
FLOOR_MODES = {"a fixed reply": (), "protocol.decode, then a fixed reply": ("--decode",)}

# -- manager load ---------------------------------------------------------------------------
AGENTS = 1_000
CONTAINERS_PER_AGENT = 8
IN_FLIGHT = 64
SOURCES = ("127.0.0.10", "127.0.0.11", "127.0.0.12", "127.0.0.13")
HEARTBEAT_TARGET = 10_000.0  # heartbeats/s on one core, shipped default policy
DECIDER_CPU_TARGET_MS = 1000 / HEARTBEAT_TARGET  # with fronts: the decider's CPU per heartbeat
MAX_FRONTS = 4
PACED_SHARE = 0.8  # the default policy is also paced at this share of its saturated rate ...
PACED_P99_TARGET_MS = 20.0  # ... where p99 must stay under this
PARTS_ENV = "SPECON_BENCH_DAEMONS"
DESIGN_RATE = AGENTS / MessagingConfig().heartbeat_interval  # every agent once per interval
POLICY_REBALANCE_OFF = """\
apiVersion: specon/v1alpha1
kind: Policy
rebalance: {mode: "off"}
"""

# -- agent CPU ------------------------------------------------------------------------------
JOBS = 100
LOG_INTERVAL = 0.2  # seconds between a job's progress records
AGENT_CPU_TARGET = 2.0  # % of one core
# Before measuring (see _settle): ticks to wait with Δ 1 s (a job can first request at its
# 4th tick), then SETTLE_QUIET s without a request or command; at most SETTLE_LIMIT s.
FAST_SETTLE_TICKS = 8
SETTLE_QUIET = 3.0
SETTLE_LIMIT = 40.0
POLICY_FAST = """\
apiVersion: specon/v1alpha1
kind: Policy
monitor: {interval: 1}
messaging: {heartbeat_interval: 0.5}
"""
FAST = "Δ 1 s, heartbeat 0.5 s"
DEFAULT = f"Δ {MonitorConfig().interval:g} s, heartbeat {MessagingConfig().heartbeat_interval:g} s"


def say(text: str) -> None:
    print(f"  .. {text}", flush=True)


def run(quick: bool) -> list[Figure]:
    parts = _parts()
    figures: list[Figure] = []
    with _sigterm_interrupts():
        if "manager" in parts:
            figures += _manager_figures(quick)
        if "agent" in parts:
            with quiet_logs():
                figures += asyncio.run(_agent_figures(quick))
    return figures


def _parts() -> set[str]:
    """``SPECON_BENCH_DAEMONS=manager`` (or ``agent``) runs that part only (default: both)."""
    raw = os.environ.get(PARTS_ENV, "manager,agent")
    parts = {p.strip() for p in raw.split(",") if p.strip()}
    if not parts or parts - {"manager", "agent"}:
        raise ValueError(f"{PARTS_ENV}={raw!r}: expected manager, agent or both, comma-separated")
    return parts


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM acts like Ctrl-C, so every ``finally`` (and each daemon's teardown) runs."""
    try:
        old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# == 1. manager ===============================================================================


@dataclass(frozen=True, slots=True)
class Manager:
    proc: subprocess.Popen[bytes]
    url: str
    dir: Path
    token_file: Path


def _cores() -> tuple[int | None, int | None, str]:
    """(manager core, load core, note): two distinct cores when there are two."""
    cpus = usable_cpus()
    if len(cpus) >= 2:
        return cpus[0], cpus[1], f"manager on cpu {cpus[0]}, load on cpu {cpus[1]}"
    return None, None, "one usable cpu: manager and load share it (figure understates)"


@contextlib.contextmanager
def _manager(
    directory: Path, token_file: Path, policy: str | None, cpu: int | None, *, extra: Sequence[str] = ()
) -> Iterator[Manager]:
    directory.mkdir(parents=True)
    port = free_port()
    argv = [
        sys.executable, "-m", "specon_manager",
        "--listen", f"127.0.0.1:{port}",
        "--token-file", str(token_file),
        "--state-dir", str(directory / "state"),
        *extra,
    ]  # fmt: skip
    if policy is not None:
        (directory / "policy.yaml").write_text(policy)
        argv += ["--policy", str(directory / "policy.yaml")]
    log_path = directory / "manager.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # a Ctrl-C reaches only us; we stop it in order
            preexec_fn=pinned_child(cpu),  # noqa: PLW1509 - single-threaded here; see pinned_child
        )
    try:
        mgr = Manager(proc, f"http://127.0.0.1:{port}", directory, token_file)
        _wait_healthy(mgr, log_path)
        yield mgr
    finally:
        _stop(proc)


def _wait_healthy(mgr: Manager, log_path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if mgr.proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the manager exited with {mgr.proc.returncode}:\n{tail}")
        with contextlib.suppress(OSError), urllib.request.urlopen(mgr.url + "/healthz", timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"the manager was not healthy after {timeout:g} s; see {log_path}")


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _load(
    mgr: Manager,
    *,
    name: str,
    agents: int,
    duration: float,
    cpu: int | None,
    rate: float | None = None,
    warmup_timeout: float = 120.0,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the load generator once (its own process, pinned to ``cpu``); its JSON result."""
    out = mgr.dir / f"load-{name}.json"
    argv = [
        sys.executable, "-m", "bench._heartbeat_load",
        "--url", mgr.url,
        "--token-file", str(mgr.token_file),
        "--agents", str(agents),
        "--containers", str(CONTAINERS_PER_AGENT),
        "--concurrency", str(IN_FLIGHT),
        "--duration", str(duration),
        "--sources", *SOURCES,
        "--manager-pid", str(mgr.proc.pid),
        "--warmup-timeout", str(warmup_timeout),
        "--out", str(out),
        *extra,
    ]  # fmt: skip
    if rate is not None:
        argv += ["--rate", str(rate)]
    # subprocess.run kills the generator if we are interrupted.
    subprocess.run(
        argv,
        check=True,
        cwd=ROOT,
        timeout=warmup_timeout + duration + 60,
        preexec_fn=pinned_child(cpu),
    )
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _manager_figures(quick: bool) -> list[Figure]:
    duration = 3.0 if quick else 10.0
    default_agents = 200 if quick else AGENTS  # a smaller cluster keeps the quick run quick
    mcpu, lcpu, cores = _cores()
    load = os.getloadavg()[0]  # a busy machine starves the pinned manager: say so
    size = f"{AGENTS:,} agents x {CONTAINERS_PER_AGENT}"
    dsize = f"{default_agents:,} agents x {CONTAINERS_PER_AGENT}"
    with tempfile.TemporaryDirectory(prefix="specon-bench-manager-") as tmp:
        root = Path(tmp)
        token = root / "token"
        token.write_text(secrets.token_urlsafe(24))
        token.chmod(0o600)
        say(f"manager (rebalance off), {size} containers, {IN_FLIGHT} in flight, {cores}")
        with _manager(root / "off", token, POLICY_REBALANCE_OFF, mcpu) as mgr:
            rss_idle = rss_bytes(mgr.proc.pid)
            say(f"as fast as it answers, {duration:g} s")
            sat = _load(mgr, name="saturate", agents=AGENTS, duration=duration, cpu=lcpu)
            say(f"at the design load, {DESIGN_RATE:,.0f}/s for {duration:g} s")
            paced = _load(mgr, name="paced", agents=AGENTS, duration=duration, cpu=lcpu, rate=DESIGN_RATE)
            rss_after = rss_bytes(mgr.proc.pid)
            log_bytes = (mgr.dir / "manager.log").stat().st_size
        say(f"manager (shipped default policy), {dsize} containers, {duration:g} s")
        with _manager(root / "default", token, None, mcpu) as mgr:
            try:
                dflt = _load(mgr, name="default", agents=default_agents, duration=duration, cpu=lcpu)
                rate = PACED_SHARE * dflt["rate"]
                say(
                    f"default policy paced at {100 * PACED_SHARE:.0f}% of that: {rate:,.0f}/s, {duration:g} s"
                )
                dpaced = _load(
                    mgr, name="default-paced", agents=default_agents, duration=duration, cpu=lcpu, rate=rate
                )
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
                # Too slow even to warm up: report it instead of losing the other figures.
                dflt = dpaced = {"rate": float("nan"), "p99_ms": float("nan"), "failed": str(exc)}

        fronts, front_cpus, fnote = _front_cores(mcpu)
        say(f"manager with {fronts} front(s) (shipped default policy), {dsize} containers; {fnote}")
        fr, frp = _fronts_runs(
            root / "fronts",
            token,
            decider=mcpu,
            fronts=fronts,
            cpus=front_cpus,
            agents=default_agents,
            duration=duration,
            load_cpu=lcpu,
        )

        floors = {}
        for what, flags in FLOOR_MODES.items():
            say(f"aiohttp floor: {what}, {duration:g} s")
            floors[what] = _floor_run(
                root / f"floor{len(floors)}", token, flags, cpu=mcpu, duration=duration, load_cpu=lcpu
            )

    sent = sat["ok"] + paced["ok"] + 2 * AGENTS  # timed beats and both warm-ups
    figures = [
        Figure(
            f"manager heartbeats/s, 1 core ({size}, rebalance off)",
            sat["rate"],
            "/s",
            clock="wall",
            detail=f"{sat['ok']:,} in {sat['seconds']:.1f} s; {_errors(sat)}; {_manager_share(sat)}; "
            f"{sat['body_bytes']:,} B bodies; {cores}; load average {load:.1f}",
        ),
        Figure(
            f"manager heartbeat latency p50, saturated ({IN_FLIGHT} in flight)",
            sat["p50_ms"],
            "ms",
            clock="wall",
            detail=f"p90 {sat['p90_ms']:.1f} ms, max {sat['max_ms']:.1f} ms; queueing: ~{IN_FLIGHT}/rate",
        ),
        Figure(
            f"manager heartbeat latency p99, saturated ({IN_FLIGHT} in flight)",
            sat["p99_ms"],
            "ms",
            clock="wall",
        ),
        Figure(
            f"manager heartbeat latency p50 at design load ({DESIGN_RATE:,.0f}/s)",
            paced["p50_ms"],
            "ms",
            clock="wall",
            detail=f"{paced['ok']:,} answered at {paced['rate']:,.0f}/s; {_errors(paced)}; "
            f"{_manager_share(paced)}",
        ),
        Figure(
            f"manager heartbeat latency p99 at design load ({DESIGN_RATE:,.0f}/s)",
            paced["p99_ms"],
            "ms",
            clock="wall",
            detail=f"p90 {paced['p90_ms']:.1f} ms, max {paced['max_ms']:.1f} ms",
        ),
        Figure(
            "manager CPU per heartbeat, saturated",
            _cpu_ms_per_beat(sat),
            "ms",
            clock="cpu",
            detail=f"{1000 / _cpu_ms_per_beat(sat):,.0f} beats per CPU-second: the throughput a whole "
            "core would give, whatever else the machine runs",
        ),
        Figure(
            f"manager heartbeats/s, 1 core ({dsize}, shipped default policy)",
            dflt["rate"],
            "/s",
            HEARTBEAT_TARGET,
            "min",
            clock="wall",
            detail=f"failed: {dflt['failed']}"
            if "failed" in dflt
            else f"p50 {dflt['p50_ms']:.0f} ms, p99 {dflt['p99_ms']:.0f} ms; {_errors(dflt)}; "
            f"{_manager_share(dflt)}; {1000 / _cpu_ms_per_beat(dflt):,.0f} beats per CPU-second "
            f"({_cpu_ms_per_beat(dflt):.3f} ms each); the ticker's decision pass each second included",
        ),
        Figure(
            "manager CPU per heartbeat, shipped default policy",
            _cpu_ms_per_beat(dflt) if "failed" not in dflt else float("nan"),
            "ms",
            clock="cpu",
            detail="the ticker's decision pass each second included; 0.1 ms is 10,000 beats per CPU-second",
        ),
        Figure(
            f"manager heartbeat latency p99, shipped default policy at {100 * PACED_SHARE:.0f}% of its rate",
            dpaced["p99_ms"],
            "ms",
            PACED_P99_TARGET_MS,
            "max",
            clock="wall",
            detail=f"failed: {dpaced['failed']}"
            if "failed" in dpaced
            else f"{dpaced['ok']:,} answered at {dpaced['rate']:,.0f}/s; p50 {dpaced['p50_ms']:.1f} ms, "
            f"max {dpaced['max_ms']:.1f} ms; {_errors(dpaced)}; {_manager_share(dpaced)}",
        ),
        Figure(
            f"manager RSS after the heartbeat runs ({size})",
            (rss_after or 0) / 2**20,
            "MiB",
            detail=f"idle before: {(rss_idle or 0) / 2**20:.1f} MiB; after {sent:,} beats; "
            f"its log grew {log_bytes / 2**20:.1f} MiB ({log_bytes / sent:.0f} B per beat)",
        ),
        *_fronts_figures(fr, frp, fronts, dsize, fnote, own_cores=bool(front_cpus)),
        *(
            Figure(
                f"aiohttp floor: CPU per heartbeat, {what}",
                _cpu_ms_per_beat(r),
                "ms",
                clock="cpu",
                detail=f"{r['rate']:,.0f}/s answered; no token, no state, no metrics: what any aiohttp "
                "manager pays before its own work",
            )
            for what, r in floors.items()
        ),
    ]
    return figures


def _floor_run(
    directory: Path,
    token: Path,
    flags: Sequence[str],
    *,
    cpu: int | None,
    duration: float,
    load_cpu: int | None,
) -> dict[str, Any]:
    """The load generator against ``bench/_aiohttp_floor.py`` pinned to ``cpu``."""
    directory.mkdir(parents=True)
    port = free_port()
    argv = [sys.executable, "-m", "bench._aiohttp_floor", "--port", str(port), *flags]
    proc = subprocess.Popen(argv, cwd=ROOT, preexec_fn=pinned_child(cpu))  # noqa: PLW1509 - see pinned_child
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the aiohttp floor server did not listen (exit {proc.poll()})")
            time.sleep(0.1)
        server = Manager(proc, f"http://127.0.0.1:{port}", directory, token)
        return _load(server, name="floor", agents=AGENTS, duration=duration, cpu=load_cpu)
    finally:
        _stop(proc)


def _front_cores(decider: int | None) -> tuple[int, list[int], str]:
    """(fronts, a core for each or none, note): the cores past the decider's and the load's."""
    spare = usable_cpus()[2:]
    if spare:
        n = min(MAX_FRONTS, len(spare))
        return n, spare[:n], f"fronts on cpus {', '.join(map(str, spare[:n]))}"
    return 1, [], f"one front beside the decider on cpu {decider} (no spare core: heartbeats/s understates)"


def _fronts_runs(
    directory: Path,
    token: Path,
    *,
    decider: int | None,
    fronts: int,
    cpus: list[int],
    agents: int,
    duration: float,
    load_cpu: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Saturated, then paced at PACED_SHARE of that, with ``--fronts``."""
    with _manager(directory, token, None, decider, extra=("--fronts", str(fronts))) as mgr:
        pids = _fronts_of(mgr, fronts)
        for pid, cpu in zip(pids, cpus, strict=False):
            os.sched_setaffinity(pid, {cpu})
        extra = ("--front-pids", *map(str, pids))
        try:
            fr = _load(mgr, name="fronts", agents=agents, duration=duration, cpu=load_cpu, extra=extra)
            rate = PACED_SHARE * fr["rate"]
            say(f"with fronts, paced at {100 * PACED_SHARE:.0f}%: {rate:,.0f}/s, {duration:g} s")
            frp = _load(
                mgr,
                name="fronts-paced",
                agents=agents,
                duration=duration,
                cpu=load_cpu,
                rate=rate,
                extra=extra,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            fr = frp = {"rate": float("nan"), "p99_ms": float("nan"), "failed": str(exc)}
    return fr, frp


def _fronts_of(mgr: Manager, count: int, timeout: float = 30.0) -> list[int]:
    """The pids of the decider's ``count`` fronts, once all are up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids: set[int] = set()
        for task in Path(f"/proc/{mgr.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                pids |= {int(c) for c in (task / "children").read_text().split()}
        if len(pids) == count:
            return sorted(pids)
        time.sleep(0.1)
    raise TimeoutError(f"the manager did not start {count} front(s) in {timeout:g} s")


def _fronts_figures(
    fr: dict[str, Any], frp: dict[str, Any], fronts: int, dsize: str, note: str, *, own_cores: bool
) -> list[Figure]:
    failed = "failed" in fr
    decider = float("nan") if failed else _cpu_ms_per_beat(fr)
    front = float("nan") if failed or fr.get("fronts_cpu_s") is None else 1000 * fr["fronts_cpu_s"] / fr["ok"]
    return [
        Figure(
            f"manager heartbeats/s with {fronts} front(s) ({dsize}, shipped default policy)",
            fr["rate"],
            "/s",
            HEARTBEAT_TARGET if own_cores else None,
            "min",
            clock="wall",
            detail=f"failed: {fr['failed']}"
            if failed
            else f"p50 {fr['p50_ms']:.0f} ms, p99 {fr['p99_ms']:.0f} ms; {_errors(fr)}; decider "
            f"{_manager_share(fr).removeprefix('manager ')}; {note}",
        ),
        Figure(
            "decider CPU per heartbeat with fronts, shipped default policy",
            decider,
            "ms",
            DECIDER_CPU_TARGET_MS,
            "max",
            clock="cpu",
            detail=f"{1000 / decider:,.0f} beats per decider CPU-second: one decider's ceiling, given "
            "cores enough for its fronts; the ticker's decision pass included",
        ),
        Figure(
            "front CPU per heartbeat, shipped default policy",
            front,
            "ms",
            clock="cpu",
            detail=f"all fronts together: {1000 / front:,.0f} beats per front CPU-second",
        ),
        Figure(
            f"manager heartbeat latency p99 with fronts at {100 * PACED_SHARE:.0f}% of its rate",
            frp["p99_ms"],
            "ms",
            PACED_P99_TARGET_MS,
            "max",
            clock="wall",
            detail=f"failed: {frp['failed']}"
            if "failed" in frp
            else f"{frp['ok']:,} answered at {frp['rate']:,.0f}/s; p50 {frp['p50_ms']:.1f} ms; "
            f"{_errors(frp)}",
        ),
    ]


def _errors(r: dict[str, Any]) -> str:
    errs: dict[str, int] = r["errors"]
    return "no errors" if not errs else "errors " + ", ".join(f"{k}: {v:,}" for k, v in sorted(errs.items()))


def _manager_share(r: dict[str, Any]) -> str:
    cpu = r["manager_cpu_s"]
    return (
        "manager CPU unknown" if cpu is None else f"manager busy {100 * cpu / r['seconds']:.0f}% of its core"
    )


def _cpu_ms_per_beat(r: dict[str, Any]) -> float:
    cpu = r["manager_cpu_s"]
    return float("nan") if cpu is None or not r["ok"] else 1000 * cpu / r["ok"]


# == 2. agent =================================================================================


@dataclass(frozen=True, slots=True)
class AgentRun:
    cpu_percent: float
    seconds: float
    rss: int | None
    counters: dict[str, float]  # /metrics counters gained during the window


def _job(i: int, lifetime: float, rng: random.Random) -> JobSpec:
    argv = (
        sys.executable, "-I", "-S", str(LOG_JOB),
        "--interval", str(LOG_INTERVAL),
        "--seconds", str(lifetime),
        "--tau", f"{rng.uniform(200, 5000):.0f}",
        "--seed", str(i),
    )  # fmt: skip
    return JobSpec(id=ContainerId(f"log-{i:03d}"), command=argv, model="bench-log")


async def _agent_figures(quick: bool) -> list[Figure]:
    window = 10.0 if quick else 30.0
    # Jobs end by themselves after this, should the teardown never run.
    lifetime = 300.0 if quick else 600.0
    rng = random.Random(3)
    runs: dict[str, AgentRun] = {}
    cgroup: Path | None = None
    with tempfile.TemporaryDirectory(prefix="specon-bench-agent-") as tmp:
        root = Path(tmp)
        fast_policy = root / "fast.yaml"
        fast_policy.write_text(POLICY_FAST)
        try:
            async with EmbeddedCluster(root / "cluster", workers=1, cpus_per_worker=1.0) as c:
                worker = c.workers[0]
                group = c.runtime(worker).budget.group
                cgroup = group.cpu_dir if group is not None else None
                say(f"agent: starting {JOBS} jobs that log every {LOG_INTERVAL:g} s")
                for i in range(JOBS):
                    await c.submit(_job(i, lifetime, rng), worker)
                # Δ 30 s: the burst would come minutes later; no tick to wait for.
                runs[DEFAULT] = await _measure_agent(c, worker, window, DEFAULT, min_ticks=0)
                # The same jobs, a restarted agent with the demanding policy (it re-adopts them).
                say(f"agent: restarting with {FAST}")
                old = c.agents.pop(worker)
                c.kill(old, signal.SIGTERM)
                c.policy = fast_policy
                await c.start_agent(worker, old.url.split("//", 1)[1].rsplit(":", 1)[0])
                runs[FAST] = await _measure_agent(c, worker, window, FAST, min_ticks=FAST_SETTLE_TICKS)
                say("agent: tearing down (every job killed, cgroups removed)")
        finally:
            _kill_leftovers(root)
    if cgroup is not None and cgroup.exists():
        print(f"  !! cgroup {cgroup} was not removed", flush=True)
    return [_agent_figure(name, r, target=name == DEFAULT) for name, r in runs.items()]


async def _measure_agent(
    c: EmbeddedCluster, worker: WorkerId, window: float, name: str, *, min_ticks: int
) -> AgentRun:
    d = c.agents[worker]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        await _wait_adopted(s, d.url, JOBS, timeout=60.0)
        say(f"agent ({name}): {JOBS} containers adopted; settling")
        before = await _settle(s, d.url, min_ticks=min_ticks, quiet=SETTLE_QUIET, limit=SETTLE_LIMIT)
        pid = d.proc.pid
        t0, cpu0 = time.monotonic(), cpu_seconds(pid)
        if cpu0 is None:
            raise RuntimeError(f"agent {worker} (pid {pid}) is gone")
        say(f"agent ({name}): measuring {window:g} s")
        while (left := t0 + window - time.monotonic()) > 0:
            await asyncio.sleep(min(5.0, left))
            now, cpu = time.monotonic(), cpu_seconds(pid)
            if cpu is None:
                raise RuntimeError(f"agent {worker} (pid {pid}) died while measured")
            say(f"agent ({name}): {now - t0:4.1f} s, {100 * (cpu - cpu0) / (now - t0):.2f}% of a core")
        t1, cpu1 = time.monotonic(), cpu_seconds(pid)
        rss = rss_bytes(pid)
        after = await _counters(s, d.url)
    if cpu1 is None:
        raise RuntimeError(f"agent {worker} (pid {pid}) died while measured")
    gained = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return AgentRun(100 * (cpu1 - cpu0) / (t1 - t0), t1 - t0, rss, gained)


async def _wait_adopted(s: aiohttp.ClientSession, url: str, n: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with s.get(url + "/healthz") as r:
                seen = int((await r.json())["containers"])
                if seen >= n:
                    return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the agent watches {seen} containers after {timeout:g} s, expected {n}")


async def _settle(
    s: aiohttp.ClientSession, url: str, *, min_ticks: int, quiet: float, limit: float
) -> dict[str, float]:
    """Wait for ``min_ticks`` ticks and then ``quiet`` s without a request or command
    (at most ``limit`` s); the counters at that moment.

    Adopted jobs converge in a burst (one request and one command each, once in their
    life); with a short Δ it comes within a few ticks and is let pass, since the figure is
    the steady cost of watching them.
    """
    t0 = time.monotonic()
    first = last = await _counters(s, url)
    calm_since = t0
    while time.monotonic() - t0 < limit:
        await asyncio.sleep(0.5)
        now = await _counters(s, url)
        if any(now.get(k, 0.0) != last.get(k, 0.0) for k in ("requests", "commands")):
            calm_since = time.monotonic()
        last = now
        ticked = now.get("ticks", 0.0) - first.get("ticks", 0.0) >= min_ticks
        if ticked and time.monotonic() - calm_since >= quiet:
            break
    return last


# A counter sample of /metrics, labelled or not: labelled series are summed per name.
_COUNTER = re.compile(r"^specon_agent_(\w+)_total(?:\{[^}]*\})? ([0-9.e+]+)$", re.MULTILINE)


async def _counters(s: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for m in _COUNTER.finditer(text):
        out[m[1]] = out.get(m[1], 0.0) + float(m[2])
    return out


def _agent_figure(name: str, r: AgentRun, *, target: bool) -> Figure:
    k = r.counters
    detail = (
        f"over {r.seconds:.0f} s: {k.get('samples', 0):,.0f} samples read, {k.get('ticks', 0):.0f} ticks, "
        f"{k.get('heartbeats', 0):.0f} heartbeats, {k.get('requests', 0):.0f} requests, "
        f"{k.get('commands', 0):.0f} commands; RSS {(r.rss or 0) / 2**20:.0f} MiB"
    )
    if not k.get("ticks"):
        detail += "; no tick fell in the window (shorter than Δ): see a full run"
    return Figure(
        f"agent CPU, {JOBS} jobs logging every {LOG_INTERVAL:g} s ({name})",
        r.cpu_percent,
        "% core",
        AGENT_CPU_TARGET if target else None,
        "max",
        detail,
        clock="cpu",
    )


def _kill_leftovers(root: Path) -> None:
    """Anything still running from our temporary directory is ours: report and kill it by pid."""
    left = processes_mentioning(str(root))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if left:
        print(f"  !! killed {len(left)} process(es) left behind: {left}", flush=True)
