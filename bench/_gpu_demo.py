"""``bench_gpu``'s real runs on one GPU: the demo (plain time-slicing against specon's GPU
priority, paired on the same arrivals) and suspend-on-memory. See ``bench.bench_gpu``.

Both run the embedded default (``specon.embedded.demo.run_once``) with one worker that has the
machine's CPUs, so the GPU is what the jobs share: the built-in workloads on ``--device``,
each asking for one GPU. The specon runs' agent keeps a standby interpreter for the GPU
(``--gpu-standby auto``), through which a suspended job is restored.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import time
from pathlib import Path

from bench.figures import Figure
from specon.config import Policy, policy_to_yaml
from specon.embedded.demo import DemoJob, job_spec, make_workload, run_once
from specon.evaluation import RunResult
from specon.model import Resources
from specon.runtime import JobSpec

JOBS = {False: 8, True: 3}
WINDOW = {False: 60.0, True: 10.0}  # s: arrivals uniform in it
ALONE = {False: 9.0, True: 3.0}  # s a job trains alone on average (x [0.4, 1.6])
SPREAD = 0.6
DEADLINE = 240.0  # s per run
SUSPEND_JOBS = 3
# A GPU memory budget of 1 % of the device: two jobs' CUDA contexts do not fit, so every job
# that is frozen is suspended to its checkpoint instead and restored when it is due.
SUSPEND_HEADROOM = 0.99
RATE_SECONDS = 2.0
TARGET = 25.0  # % average JCT below time-slicing


def _rates(device: str, models: tuple[str, ...]) -> dict[str, float]:
    """Each model's steps per second alone on ``device``, measured here and now."""
    import torch  # noqa: PLC0415

    from specon.workloads.registry import build  # noqa: PLC0415 - imports torch

    out = {}
    for model in models:
        w = build(model, seed=0, device=torch.device(device))
        for _ in range(5):  # warm-up: kernels compiled, caches filled
            w.train_step()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < RATE_SECONDS:
            w.train_step()  # returns the loss as a float: each step has completed
            n += 1
        out[model] = n / (time.perf_counter() - t0)
    return out


def _jobs(rates: dict[str, float], quick: bool, n: int, window: float) -> list[DemoJob]:
    return make_workload(
        jobs=n,
        window=window,
        seed=1,
        steps=lambda m: max(20, round(rates[m] * ALONE[quick])),
        models=tuple(sorted(rates)),
        spread=SPREAD,
    )


def _gpu_spec(device: str) -> object:
    def spec_of(job: DemoJob) -> JobSpec:
        base = job_spec(job)
        return dataclasses.replace(
            base, command=(*base.command, "--device", device), requests=Resources(gpu=1)
        )

    return spec_of


def _run(
    root: Path, jobs: list[DemoJob], device: str, *, specon: bool, policy: Path | None, label: str
) -> RunResult:
    return asyncio.run(
        run_once(
            jobs,
            root=root,
            workers=1,
            cpus_per_worker=float(os.cpu_count() or 2),
            with_specon=specon,
            policy=policy,
            say=lambda line: print(f"    {line}", flush=True),
            deadline=DEADLINE,
            label=label,
            spec_of=_gpu_spec(device),  # type: ignore[arg-type]
            agent_args=("--gpu-standby", "auto") if specon else (),
        )
    )


def _exact(run: RunResult) -> tuple[int, int]:
    """Jobs that ended with exactly their steps, of all."""
    return sum(j.finish is not None and j.steps_done == j.steps for j in run.jobs), len(run.jobs)


def _jcts(run: RunResult) -> dict[str, float]:
    return {j.id: j.finish - j.submit for j in run.jobs if j.finish is not None}


def _log_count(root: Path, event: str) -> int:
    return sum(p.read_text(errors="replace").count(event) for p in (root / "logs").glob("agent-*.log"))


def demo(root: Path, device: str, quick: bool) -> list[Figure]:
    from specon.embedded.demo import MODELS  # noqa: PLC0415

    rates = _rates(device, MODELS)
    print("    steps/s alone: " + ", ".join(f"{m} {r:.0f}" for m, r in sorted(rates.items())), flush=True)
    jobs = _jobs(rates, quick, JOBS[quick], WINDOW[quick])
    ds = _run(root / "ds", jobs, device, specon=False, policy=None, label="time-slicing")
    sp = _run(root / "specon", jobs, device, specon=True, policy=None, label="specon")
    ds_jct, sp_jct = _jcts(ds), _jcts(sp)
    both = sorted(ds_jct.keys() & sp_jct.keys())
    out: list[Figure] = []
    where = f"{len(jobs)} jobs over {WINDOW[quick]:.0f} s, {device}"
    if both:
        a, b = statistics.fmean(ds_jct[j] for j in both), statistics.fmean(sp_jct[j] for j in both)
        worst = max(sp_jct[j] / ds_jct[j] for j in both)
        out += [
            Figure("demo: average JCT, time-slicing", a, "s", detail=where, clock="wall"),
            Figure("demo: average JCT, specon", b, "s", detail=where, clock="wall"),
            Figure(
                "demo: specon's average JCT below time-slicing",
                100.0 * (a - b) / a,
                "%",
                TARGET,
                better="min",
                detail=f"{len(both)} jobs finished in both",
                clock="wall",
            ),
            Figure(
                "demo: worst job against its time-slicing JCT", worst, "x", 2.0, detail=where, clock="wall"
            ),
        ]
    for name, run in (("time-slicing", ds), ("specon", sp)):
        exact, n = _exact(run)
        out.append(Figure(f"demo: jobs ending with exactly their steps, {name}", exact, f"of {n}", n, "min"))
    out += _suspend(root / "suspend", rates, device, quick)
    return out


def _suspend(root: Path, rates: dict[str, float], device: str, quick: bool) -> list[Figure]:
    root.mkdir(parents=True, exist_ok=True)
    policy = Policy()
    policy = dataclasses.replace(
        policy, gpu=dataclasses.replace(policy.gpu, memory_headroom=SUSPEND_HEADROOM)
    )
    path = root / "policy.yaml"
    path.write_text(policy_to_yaml(policy))
    jobs = _jobs(rates, quick, SUSPEND_JOBS, 5.0)
    run = _run(root, jobs, device, specon=True, policy=path, label="suspend")
    exact, n = _exact(run)
    suspends = _log_count(root, "specon.agent.gpu_suspended")
    resumes = _log_count(root, "specon.agent.gpu_resumed")
    detail = f"{n} jobs, GPU memory headroom {SUSPEND_HEADROOM:.0%}, {device}"
    return [
        Figure("suspend: suspends", suspends, "", detail=detail),
        Figure("suspend: resumes", resumes, "", detail=detail),
        Figure("suspend: jobs ending with exactly their steps", exact, f"of {n}", n, "min", detail=detail),
    ]
