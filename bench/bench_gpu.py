"""The one prepared GPU check (issue 22): ``python -m bench bench_gpu``, about 7 minutes on one
H100 with PyTorch and CUDA. On a machine without a GPU every part that can runs on the CPU and
says so in its figures' names; nothing is skipped silently.

1. **cgroup path** of the local runtime (v2 on most current distributions, v1 here): the
   version that enforces a 0.5-CPU worker's budget, the CPU that worker's two busy jobs get
   together (target: at most its budget), and their split under CPU weights 10,000 and 1.
2. **switching** which job runs on the GPU: two GPU jobs share it; one is frozen and thawed ten
   times (``LocalRuntime.freeze``/``thaw``, the agent's mechanism): the time each call takes
   and the survivor's longest gap between steps around a switch (target: 0.1 s).
3. **restore** of a GPU job cold and from the standby (``--gpu-standby``), three model sizes
   (``bench._gpu_job``: checkpoints of about 10 MB, 300 MB and 1.2 GB): seconds from the
   ``start`` request to its first step, against the target 0.5 s under 100 MB and the
   checkpoint's own load time + 0.5 s above.
4. **GPU demo**: eight built-in workload jobs of different lengths arriving over a minute on
   one GPU, run twice on the same arrivals: plain time-slicing (no specon: DS) and specon's
   GPU priority (the default policy: the default priority rule, frozen in quanta); average
   JCT (target: 25 % below time-slicing), each job against its time-slicing JCT (target: no
   job over 2x), and each job ending with exactly its steps.
5. **suspend-on-memory**: the same kind of run with a GPU memory budget that cannot hold the
   frozen jobs: jobs are suspended to their checkpoints and restored when due; counted, and
   every job must end with exactly its steps.

Each job's steps are sized from its model's step rate measured alone on this machine first,
so the run lasts about the same on any GPU. Without torch only part 1 runs.

To run it on a GPU machine that reaches no package registry, carry the wheels of what it lacks
(``make gpu-wheels`` downloads msgspec, structlog, tenacity and nvidia-ml-py for Python 3.10-3.13
into ``build/gpu-wheels``) and run::

    pip install --no-index --find-links build/gpu-wheels msgspec structlog tenacity nvidia-ml-py
    PYTHONPATH=.:agent:manager python -m bench bench_gpu
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.figures import Figure
from specon import checkpoint
from specon.model import ContainerId, Resources, WorkerId
from specon.runtime import JobPaths, JobSpec, LocalRuntime
from specon.runtime.local.standby_pool import StandbySpec

ROOT = Path(__file__).resolve().parent.parent
# (name, hidden width): about 10 MB, 300 MB and 1.2 GB of checkpoint (``bench._gpu_job``).
SIZES = {False: (("10MB", 640), ("300MB", 3500), ("1.2GB", 7000)), True: (("10MB", 640),)}
RESTORES = {False: 2, True: 1}
SWITCHES = {False: 10, True: 3}
SMALL_CHECKPOINT = 100e6  # bytes: under this the target is 0.5 s flat
RESTORE_SLACK = 0.5  # s
SWITCH_TARGET = 0.1  # s
BUSY = (sys.executable, "-c", "while True: pass")


def _device() -> str:
    try:
        import torch  # noqa: PLC0415 - the CPU-only parts need no torch
    except ImportError:
        return "none"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


async def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


def _cluster(root: Path) -> str:
    return "gpu" + hashlib.sha1(str(root).encode()).hexdigest()[:8]


# -- 1. the cgroup path ---------------------------------------------------------------------
async def _cgroups(root: Path) -> list[Figure]:
    rt = LocalRuntime(root / "volume", WorkerId("cg"), 0.5, cluster=_cluster(root))
    version = rt._budget.version or 0
    try:
        for job, weight in (("heavy", 10_000), ("light", 1)):
            await rt.start(JobSpec(id=ContainerId(job), command=BUSY))
            await rt.set_cpu_weight(ContainerId(job), weight)
        await rt.usage()
        t0 = time.monotonic()
        await asyncio.sleep(8.0)
        u = await rt.usage()
        wall = time.monotonic() - t0
    finally:
        await rt.stop_all()
        rt.close()
    per = dict(u.per_container)
    total = u.cpu_utilisation * 0.5
    heavy = per.get(ContainerId("heavy"), 0.0)
    light = per.get(ContainerId("light"), 0.0)
    share = 100.0 * heavy / (heavy + light) if heavy + light > 0 else 0.0
    how = f"cgroup v{version}" if version else f"no cgroups ({u.enforcement})"
    return [
        Figure("cgroup: the version enforcing the budget (0: none)", version, "", detail=how),
        Figure(
            "cgroup: a 0.5-CPU worker's two busy jobs, CPU together",
            total,
            "cores",
            target=0.55,
            better="max",
            detail=f"{wall:.1f} s, {how}",
            clock="cpu",
        ),
        Figure(
            "cgroup: weights 10,000 vs 1, the first job's share",
            share,
            "%",
            target=90.0,
            better="min",
            detail=f"{heavy:.2f} vs {light:.2f} CPU-s since the first sample",
            clock="cpu",
        ),
    ]


# -- 2. switching ---------------------------------------------------------------------------
def _gpu_job(job: str, steps: int, width: int = 640, device: str = "auto") -> JobSpec:
    argv = (sys.executable, "-m", "bench._gpu_job", "--width", str(width), "--steps", str(steps))
    return JobSpec(
        id=ContainerId(job),
        command=(*argv, "--device", device),
        requests=Resources(gpu=1),
        steps=steps,
    )


def _gaps(path: Path, around: list[float], window: float = 1.0) -> float:
    """The longest time between two step records within ``window`` s after each of ``around``."""
    stamps = sorted(float(r["ts"]) for r in _records(path) if "loss" in r)
    worst = 0.0
    for t in around:
        near = [s for s in stamps if t - 0.2 <= s <= t + window]
        worst = max([worst, *(b - a for a, b in itertools.pairwise(near))])
    return worst


async def _switching(root: Path, device: str, switches: int) -> list[Figure]:
    rt = LocalRuntime(root / "volume", WorkerId("sw"), float(os.cpu_count() or 2), cluster=_cluster(root))
    runner, other = ContainerId("runner"), ContainerId("other")
    freezes: list[float] = []
    thaws: list[float] = []
    at: list[float] = []
    try:
        for job in (runner, other):
            await rt.start(_gpu_job(job, 1_000_000, device=device))
        progress = JobPaths(rt.root, runner).progress
        await _wait(lambda: sum("loss" in r for r in _records(progress)) > 20, 120.0)
        for _ in range(switches):
            await asyncio.sleep(0.5)
            t = time.time()
            ok = await rt.freeze(other)
            freezes.append(time.time() - t)
            at.append(t)
            await asyncio.sleep(0.5)
            t = time.time()
            ok = await rt.thaw(other) and ok
            thaws.append(time.time() - t)
            at.append(t)
            if not ok:
                break
        gap = _gaps(progress, at)
    finally:
        await rt.stop_all()
        rt.close()
    where = f"{device}, {len(freezes)} switches"
    return [
        Figure(
            "switch: freeze call", statistics.median(freezes), "s", SWITCH_TARGET, detail=where, clock="wall"
        ),
        Figure("switch: thaw call", statistics.median(thaws), "s", SWITCH_TARGET, detail=where, clock="wall"),
        Figure(
            "switch: the running job's longest step gap around a switch",
            gap,
            "s",
            SWITCH_TARGET,
            detail=f"{where}; includes one step's own time",
            clock="wall",
        ),
    ]


# -- 3. restores ----------------------------------------------------------------------------
def _checkpoint(width: int, device: str) -> tuple[bytes, float]:
    """A step-1 checkpoint of the ``width`` MLP, and how long loading it onto ``device`` takes."""
    import torch  # noqa: PLC0415

    from bench._gpu_job import model_of  # noqa: PLC0415
    from specon import jobkit  # noqa: PLC0415

    model = model_of(width, 2)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    payload = jobkit.torch_payload(model, opt)
    target = model_of(width, 2).to(device)
    target_opt = torch.optim.Adam(target.parameters(), lr=1e-3)
    t = time.perf_counter()
    jobkit.torch_restore(payload, target, target_opt)
    if device == "cuda":
        torch.cuda.synchronize()
    return payload, time.perf_counter() - t


async def _restore_once(rt: LocalRuntime, job: str, width: int, payload: bytes, device: str) -> float:
    spec = _gpu_job(job, 2, width, device)  # step 1 restored, one step, done
    paths = JobPaths.of(rt.root, job)
    paths.create()
    ckpt = checkpoint.write(paths.checkpoints, 1, payload)
    t0 = time.time()
    await rt.start(spec, checkpoint=ckpt.payload)
    if not await _wait(lambda: any("loss" in r for r in _records(paths.progress)), 300.0):
        raise RuntimeError(f"{job}: no step within 300 s (see {paths.progress})")
    first = next(r for r in _records(paths.progress) if "loss" in r)
    await _wait(paths.finished, 300.0)
    return float(first["ts"]) - t0


async def _restores(root: Path, device: str, quick: bool) -> list[Figure]:
    cluster = _cluster(root)
    standby = StandbySpec(module="bench._gpu_job", preload=("torch", "specon.jobkit"))
    cold = LocalRuntime(root / "volume", WorkerId("cold"), 4.0, cluster=cluster)
    hot = LocalRuntime(
        root / "volume", WorkerId("hot"), 4.0, cluster=cluster, standby_gpus=(0,), standby=standby
    )
    pool = hot.standby
    assert pool is not None
    out = []
    try:
        for name, width in SIZES[quick]:
            payload, load = _checkpoint(width, device)
            times: dict[str, list[float]] = {"cold": [], "standby": []}
            for i in range(RESTORES[quick]):
                times["cold"].append(await _restore_once(cold, f"cold-{name}-{i}", width, payload, device))
                if not await _wait(lambda: pool.standbys[0].ready, 300.0):
                    raise RuntimeError("the standby did not prime within 300 s")
                times["standby"].append(await _restore_once(hot, f"hot-{name}-{i}", width, payload, device))
            target = RESTORE_SLACK if len(payload) < SMALL_CHECKPOINT else load + RESTORE_SLACK
            size = f"{len(payload) / 1e6:.0f} MB checkpoint, load {load:.2f} s, {device}"
            for how, runs in times.items():
                out.append(
                    Figure(
                        f"restore {name}: request to first step, {how}",
                        statistics.median(runs),
                        "s",
                        target if how == "standby" else None,
                        detail=f"{size}; runs {', '.join(f'{r:.2f}' for r in runs)}",
                        clock="wall",
                    )
                )
    finally:
        for rt in (cold, hot):
            await rt.stop_all()
            rt.close()
    return out


def run(quick: bool) -> list[Figure]:
    device = _device()
    # The standbys and the jobs import bench._gpu_job from wherever they run.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "agent"), str(ROOT / "manager"), os.environ.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="specon-bench-gpu-") as tmp:
        root = Path(tmp)
        figures += _part("cgroup", lambda: asyncio.run(_cgroups(root / "cg")))
        if device == "none":
            print("  bench_gpu: no torch here: only the cgroup part ran")
            return figures
        if device == "cpu":
            print("  bench_gpu: no CUDA here: the GPU parts run on the CPU (their details say so)")
        figures += _part("switch", lambda: asyncio.run(_switching(root / "sw", device, SWITCHES[quick])))
        figures += _part("restore", lambda: asyncio.run(_restores(root / "restore", device, quick)))
        figures += _part("demo", lambda: _demo_figures(root / "demo", device, quick))
    return figures


def _part(name: str, part: Callable[[], list[Figure]]) -> list[Figure]:
    """One part's figures; a part that fails is reported (a missed figure) and the rest run on."""
    try:
        return part()
    except Exception as exc:
        traceback.print_exc()
        return [Figure(f"{name}: failed", 1.0, "", 0.0, detail=f"{type(exc).__name__}: {exc}")]


def _demo_figures(root: Path, device: str, quick: bool) -> list[Figure]:
    from bench._gpu_demo import demo  # noqa: PLC0415 - the embedded cluster, only here

    return demo(root, device, quick)
