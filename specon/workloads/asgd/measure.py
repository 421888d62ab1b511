"""One async-SGD job on network hosts, profiled with one worker, then measured with more.

``measure_case`` runs the PS on ``hosts[0]`` (its link limited by ``link.shape``) and ``w``
workers on ``hosts[1..w]``, each as its own ``python -m specon.workloads.asgd`` process in its
host's network namespace: first one worker (the profile: ``profile.service_times``), then
``w = 1..max_workers`` measured at the PS over a steady window, against what
``specon.sim.asgd.mva`` predicts from the profile alone (exact, approximate and hybrid MVA).

Every process is waited for; one that outlives its run's deadline is killed and the run fails
(``MeasureError``) with its log's tail. Needs root (namespaces, ``tc``).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specon.sim.asgd import mva
from specon.workloads.asgd import link
from specon.workloads.asgd.link import NetHost
from specon.workloads.asgd.mlp import Shape
from specon.workloads.asgd.profile import Profile, Rate, measured_throughput, relative_error, service_times

PORT = 7810
METHODS: tuple[mva.Method, ...] = ("exact", "approx", "hybrid")


class MeasureError(RuntimeError):
    """A run did not complete: a process failed or hung; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Case:
    """One job: its model, the workers' mini-batch, the PS's link."""

    name: str
    shape: Shape
    batch: int
    shaping: link.Shaping
    optimizer: str = "momentum"

    def describe(self) -> str:
        return (
            f"{self.shape.nbytes / 1e6:.2f} MB model, batch {self.batch}, "
            f"{self.shaping.rate_mbit:g} Mbit/s PS link, {self.optimizer}"
        )

    def model_args(self) -> list[str]:
        s = self.shape
        return [
            "--inputs",
            str(s.inputs),
            "--hidden",
            str(s.hidden),
            "--layers",
            str(s.layers),
            "--outputs",
            str(s.outputs),
        ]


@dataclass(frozen=True, slots=True)
class Run:
    """The records of one job's run with ``workers`` workers."""

    workers: int
    ps: list[dict[str, Any]]
    per_worker: list[list[dict[str, Any]]]

    @property
    def summary(self) -> dict[str, Any]:
        return next((r for r in self.ps if r.get("event") == "done"), {})


@dataclass(slots=True)
class CaseResult:
    """A case's profile, and per worker count the measured and predicted throughput."""

    case: Case
    profile: Profile
    measured: dict[int, Rate] = field(default_factory=dict)
    predicted: dict[str, tuple[float, ...]] = field(default_factory=dict)
    compute: dict[int, float] = field(default_factory=dict)  # mean worker compute, s, per w
    ps_cpu: dict[int, float] = field(default_factory=dict)  # the PS's CPU seconds per second, per w
    load: dict[int, float] = field(default_factory=dict)  # the machine's 1-min load average after w

    def error(self, method: str, w: int) -> float:
        return relative_error(self.predicted[method][w - 1], self.measured[w].throughput)

    def errors(self, method: str, *, from_workers: int = 2) -> list[float]:
        return [self.error(method, w) for w in sorted(self.measured) if w >= from_workers]

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "setup": self.case.describe(),
            "service_times": self.profile.as_dict(),
            "measured": {str(w): r.throughput for w, r in sorted(self.measured.items())},
            "updates": {str(w): r.updates for w, r in sorted(self.measured.items())},
            "predicted": {m: list(v) for m, v in self.predicted.items()},
            "worker_compute": {str(w): c for w, c in sorted(self.compute.items())},
            "ps_cpu": {str(w): c for w, c in sorted(self.ps_cpu.items())},
            "load": {str(w): c for w, c in sorted(self.load.items())},
            "errors": {m: {str(w): self.error(m, w) for w in sorted(self.measured)} for m in self.predicted},
        }


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _tail(path: Path, lines: int = 5) -> str:
    return " | ".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def run_job(
    hosts: Sequence[NetHost],
    case: Case,
    workers: int,
    *,
    duration: float,
    logdir: Path,
    port: int = PORT,
    congestion: str | None = link.CONGESTION,
) -> Run:
    """The PS on ``hosts[0]``, ``workers`` workers on the next hosts, for ``duration`` s after
    all joined, their sockets on TCP ``congestion`` control (None: the system's); every
    process is gone when this returns."""
    if not 1 <= workers < len(hosts):
        raise ValueError(f"{workers} workers need {workers + 1} hosts, there are {len(hosts)}")
    logdir.mkdir(parents=True, exist_ok=True)
    ps_host = hosts[0]
    base = [sys.executable, "-m", "specon.workloads.asgd"]
    tcp = ["--congestion", congestion] if congestion else []
    ps_log = logdir / "ps.jsonl"
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    with open(logdir / "ps.err", "wb") as err:
        argv = [
            *base,
            "ps",
            "--host",
            ps_host.address,
            "--port",
            str(port),
            "--duration",
            str(duration),
            "--wait-workers",
            str(workers),
            "--optimizer",
            case.optimizer,
            "--log",
            str(ps_log),
            *tcp,
            *case.model_args(),
        ]
        procs.append(("ps", ps_host.popen(argv, stdout=err, stderr=subprocess.STDOUT), logdir / "ps.err"))
    for i in range(workers):
        with open(logdir / f"w{i}.err", "wb") as err:
            argv = [
                *base,
                "worker",
                "--ps",
                f"{ps_host.address}:{port}",
                "--id",
                str(i),
                "--batch",
                str(case.batch),
                "--log",
                str(logdir / f"w{i}.jsonl"),
                *tcp,
                *case.model_args(),
            ]
            procs.append(
                (
                    f"worker {i}",
                    hosts[i + 1].popen(argv, stdout=err, stderr=subprocess.STDOUT),
                    logdir / f"w{i}.err",
                )
            )
    deadline = time.monotonic() + duration + 60  # start-up, joining, the last round trips
    failures = []
    for name, proc, err_path in procs:
        try:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            rc = None
        if rc != 0:
            failures.append(f"{name} {'hung' if rc is None else f'exited {rc}'}: {_tail(err_path)}")
    if failures:
        raise MeasureError(f"{case.name}, {workers} worker(s): " + "; ".join(failures))
    return Run(workers, _read(ps_log), [_read(logdir / f"w{i}.jsonl") for i in range(workers)])


def _compute(run: Run, since: float) -> float:
    """Mean seconds a worker computed a gradient in the steady window (CPU contention shows)."""
    values = [r["compute_end"] - r["recv_end"] for rs in run.per_worker for r in rs if r["recv_end"] >= since]
    return statistics.fmean(values) if values else float("nan")


def measure_case(
    hosts: Sequence[NetHost],
    case: Case,
    *,
    max_workers: int,
    duration: float,
    warmup: float,
    logdir: Path,
    progress: Callable[[str], None] = print,
    congestion: str | None = link.CONGESTION,
    tcp: Mapping[str, str] = link.TCP_SETTINGS,
) -> CaseResult:
    """Profile ``case`` with one worker, predict 1..max_workers, measure 1..max_workers; the
    hosts' TCP set to ``tcp`` (sysctls of their namespaces) and ``congestion`` control."""
    link.shape(hosts[0], case.shaping)
    for host in hosts[: max_workers + 1]:
        link.tune_tcp(host, tcp)
    result: CaseResult | None = None
    for w in range(1, max_workers + 1):
        run = run_job(
            hosts, case, w, duration=duration, logdir=logdir / case.name / f"w{w}", congestion=congestion
        )
        summary = run.summary
        if summary.get("errors"):
            raise MeasureError(f"{case.name}, {w} worker(s): the PS reported {summary['errors']}")
        clock = next((r["t"] for r in run.ps if r.get("event") == "clock"), 0.0)
        if result is None:  # the one-worker run is the profile: predictions use nothing else
            prof = service_times(run.ps, run.per_worker[0])
            result = CaseResult(case, prof)
            result.predicted = {m: mva.curve(prof.times, max_workers, m) for m in METHODS}
            t = prof.times
            progress(
                f"  ... {case.name}: profile worker {t.worker * 1e3:.1f} ms, uplink {t.uplink * 1e3:.1f} ms, "
                f"server {t.server * 1e3:.1f} ms, downlink {t.downlink * 1e3:.1f} ms (n={prof.samples})"
            )
        rate = measured_throughput(run.ps, warmup=warmup)
        result.measured[w] = rate
        result.compute[w] = _compute(run, clock + warmup)
        result.ps_cpu[w] = summary.get("cpu_s", math.nan) / summary.get("wall_s", math.nan)
        result.load[w] = os.getloadavg()[0]
        pred = {m: result.predicted[m][w - 1] for m in METHODS}
        progress(
            f"  ... {case.name}, {w} worker(s): measured {rate.throughput:.2f}/s ({rate.updates} updates), "
            f"exact {pred['exact']:.2f}, hybrid {pred['hybrid']:.2f}, approx {pred['approx']:.2f}; "
            f"worker compute {result.compute[w] * 1e3:.1f} ms, PS CPU {result.ps_cpu[w]:.0%}, "
            f"load {result.load[w]:.1f}; loss {summary.get('first_loss', 0):.2f}"
            f" -> {summary.get('last_loss', 0):.2f}"
        )
    assert result is not None
    return result
