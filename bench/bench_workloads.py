"""Training workloads: steps/s on one thread, how soon each converges, save+resume cost.

Each model trains its default number of steps (quick: 600) in-process on one torch thread;
speed is steps per CPU second (other load on the machine disturbs wall time, not this).
Convergence, two ways: the share of the whole run's loss reduction reached after the first
20 % of the steps (the paper's Fig. 1 reports 65-98 %), and the step at which SpeCon's
Algorithm 1 (``specon.policy.monitor.tick``, SPEC defaults: alpha 0.01, mean, normalise by
max) first marks the job converged when one tick covers 5 % of the run's steps (100 of the
default 2000: about 10 s for a job sharing a worker in the demo). The detail adds the step
from which the tick-to-tick change stays below alpha for good.

Save+resume: a VAE job is SIGTERMed and restarted; the figure is the time from the signal
to the first newly trained step (process start, torch import, data generation and restore
included).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.figures import Figure
from specon import jobkit
from specon.config import MonitorConfig
from specon.model import Category
from specon.policy import monitor
from specon.workloads.registry import WORKLOADS, build

TICKS_PER_RUN = 20
STEPS_PER_S_TARGET = 20.0  # the demo wants 20-60 steps/s per job on one thread
RESUME_TARGET_S = 5.0  # SPEC §8: save+resume overhead under 5 s


def _ticks(losses: list[float], tick_steps: int) -> list[list[float]]:
    return [losses[i : i + tick_steps] for i in range(0, len(losses) - tick_steps + 1, tick_steps)]


def converged_step(losses: list[float], *, tick_steps: int) -> int | None:
    """The step at which Algorithm 1 first reaches CC, one tick per ``tick_steps`` steps."""
    cfg, state = MonitorConfig(), monitor.initial()
    for k, samples in enumerate(_ticks(losses, tick_steps)):
        state = monitor.tick(state, samples, float(k), cfg)
        if state.category is Category.CONVERGED:
            return (k + 1) * tick_steps
    return None


def flat_for_good_step(losses: list[float], *, tick_steps: int) -> int | None:
    """The step from which every tick's normalised change stays below alpha."""
    cfg, state, flat_from = MonitorConfig(), monitor.initial(), None
    for k, samples in enumerate(_ticks(losses, tick_steps)):
        state = monitor.tick(state, samples, float(k), cfg)
        if state.last_g is None:
            continue
        if state.last_g >= cfg.alpha:
            flat_from = None
        elif flat_from is None:
            flat_from = (k + 1) * tick_steps
    return flat_from


def reduction_share(losses: list[float], *, head: float = 0.2) -> float:
    """Share of the run's loss reduction (first to last 10-step mean) done in its first ``head``."""
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    cut = int(len(losses) * head)
    at_cut = sum(losses[cut - 10 : cut]) / 10
    return (first - at_cut) / (first - last) if first != last else 1.0


def _curve(losses: list[float]) -> str:
    points = [0, len(losses) // 20, len(losses) // 4, len(losses) // 2, len(losses) - 10]
    return " -> ".join(f"{sum(losses[p : p + 10]) / 10:.4g}@{p}" for p in points)


def _model_figures(name: str, steps: int) -> list[Figure]:
    workload = build(name, seed=0)
    losses: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        losses.append(workload.train_step())
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rate = steps / cpu
    tick = steps // TICKS_PER_RUN
    cc, flat = converged_step(losses, tick_steps=tick), flat_for_good_step(losses, tick_steps=tick)
    return [
        Figure(
            f"{name}: training steps/s (1 thread, CPU time)",
            rate,
            "steps/s",
            target=STEPS_PER_S_TARGET,
            better="min",
            detail=f"wall {steps / wall:.1f} steps/s; loss {_curve(losses)}",
        ),
        Figure(
            f"{name}: loss reduction done in the first 20% of steps",
            100 * reduction_share(losses),
            "%",
        ),
        Figure(
            f"{name}: Algorithm 1 converged at step (tick = {tick} steps)",
            float(cc if cc is not None else steps),
            "steps",
            detail=(
                f"never in {steps}" if cc is None else f"{cc / steps:.0%} of {steps}, {cc / rate:.0f} CPU s"
            )
            + (f"; flat for good from {flat}" if flat is not None else "; never flat for good"),
        ),
    ]


def _samples(progress: Path) -> list[dict[str, float]]:
    if not progress.exists():
        return []
    return [r for r in map(json.loads, progress.read_text().splitlines()) if "loss" in r]


def _wait(proc: subprocess.Popen[bytes], progress: Path, beyond: int) -> None:
    deadline = time.monotonic() + 300
    while not any(s["step"] > beyond for s in _samples(progress)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job stopped or stalled (exit {proc.returncode})")
        time.sleep(0.02)


def _save_resume_figures() -> list[Figure]:
    with tempfile.TemporaryDirectory() as tmp:
        progress = Path(tmp) / "progress.jsonl"
        env = {
            **os.environ,
            jobkit.ENV_PROGRESS_FILE: str(progress),
            jobkit.ENV_CHECKPOINT_DIR: f"{tmp}/ckpt",
        }
        cmd = [
            sys.executable,
            "-m",
            "specon.workloads",
            "--model",
            "vae",
            "--steps",
            "100000",
            "--log-every",
            "1",
        ]
        proc = subprocess.Popen(cmd, env=env)
        _wait(proc, progress, 30)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        saved = time.perf_counter() - t0
        step = max(int(s["step"]) for s in _samples(progress))
        proc = subprocess.Popen(cmd, env=env)
        try:
            _wait(proc, progress, step)
            total = time.perf_counter() - t0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return [
        Figure("vae: SIGTERM to checkpointed exit", saved, "s", detail=f"exit code {code}"),
        Figure(
            "vae: save + resume overhead (SIGTERM to next trained step)",
            total,
            "s",
            target=RESUME_TARGET_S,
            better="max",
            detail="includes interpreter start, torch import, data generation",
        ),
    ]


def run(quick: bool) -> list[Figure]:
    torch.set_num_threads(1)
    figures: list[Figure] = []
    for name, spec in WORKLOADS.items():
        figures += _model_figures(name, 600 if quick else spec.steps)
    return figures + _save_resume_figures()
