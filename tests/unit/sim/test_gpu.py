"""The simulated GPUs: time-slicing, freezing, MPS, suspend and restore, GPU placement."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from specon.config.sections import GpuShareConfig
from specon.evaluation import RunResult
from specon.model import WorkerId
from specon.sim.calibration import params_from_dict
from specon.sim.cluster import JobPlan, WorkerSpec, Workload
from specon.sim.gpu import GIB, Device, GpuModel, GpuParams, GpuSlot
from specon.sim.params import DEFAULT_PARAMS
from specon.sim.policies import lower_bound, make_policy
from specon.sim.runner import simulate
from specon.testing.builders import job_plan, trace

STEP = 0.01  # seconds per step alone on a GPU
LAW = DEFAULT_PARAMS.gpu


def _gpu_job(
    jid: str, steps: int, *, submit: float = 0.0, memory: float = 4.5, worker: str | None = "g1"
) -> JobPlan:
    tr = trace([1.0 / (i + 1) for i in range(50)])
    plan = job_plan(jid, tr, submit=submit, steps=steps, cost=STEP, worker=worker)
    return replace(plan, gpu=1, gpu_memory=round(memory * GIB))


def _gpu_worker(
    name: str = "g1", *, memory: float = 80.0, share: int = 8, product: str | None = None
) -> WorkerSpec:
    return WorkerSpec(
        WorkerId(name), 16.0, gpus=1, gpu_memory=round(memory * GIB), gpu_product=product, gpu_share=share
    )


def _jct(run: RunResult) -> dict[str, float]:
    out = {}
    for j in run.jobs:
        assert j.jct is not None, f"{j.id} unfinished"
        assert j.steps_done == j.steps  # every job ends with exactly its steps
        out[j.id] = j.jct
    return out


# -- the law, on one device -----------------------------------------------------------------


def _device(*states: str, pct: tuple[int, ...] = ()) -> Device:
    dev = Device(0, 80 * GIB)
    for i, state in enumerate(states):
        dev.jobs[f"j{i}"] = GpuSlot(0, 0, device=0, state=state, pct=pct[i] if pct else 100)  # type: ignore[arg-type]
    return dev


def test_time_slicing_gives_one_job_all_and_two_jobs_47_percent_each() -> None:
    model = GpuModel(LAW, None)
    for states, share in ((("running",), 1.0), (("running", "running"), 0.47)):
        dev = _device(*states)
        model.rate(dev, 0.0)
        assert [s.share for s in dev.jobs.values()] == pytest.approx([share] * len(states))
    three = _device("running", "running", "running")
    model.rate(three, 0.0)  # assumed: the measured 94 % aggregate, split evenly
    assert sum(s.share for s in three.jobs.values()) == pytest.approx(0.94)


def test_a_frozen_job_gives_the_runner_the_whole_gpu() -> None:
    dev = _device("running", "frozen", "suspended")
    GpuModel(LAW, GpuShareConfig()).rate(dev, 0.0)
    assert [s.share for s in dev.jobs.values()] == [1.0, 0.0, 0.0]


def test_mps_percentages_reproduce_the_measured_pair() -> None:
    # 90 % and 10 % ran 51.0 and 5.8 steps/s against 57.6 alone.
    dev = _device("running", "running", pct=(90, 10))
    GpuModel(LAW, GpuShareConfig(mechanism="mps")).rate(dev, 0.0)
    fast, slow = (s.share for s in dev.jobs.values())
    assert fast == pytest.approx(51.0 / 57.6, abs=0.01)
    assert slow == pytest.approx(5.8 / 57.6, abs=0.01)
    assert fast + slow <= LAW.mps_aggregate + 1e-12


def test_a_restoring_job_runs_only_once_ready() -> None:
    dev = _device("running", "running")
    dev.jobs["j1"].ready = 5.0
    wake = GpuModel(LAW, GpuShareConfig()).rate(dev, 1.0)
    assert wake == 5.0
    assert [s.share for s in dev.jobs.values()] == [1.0, 0.0]


def test_restore_costs_are_the_measured_ones() -> None:
    # Standby: 0.10 / 0.24 / 2.99 s for checkpoints of 1.9 MB, 3.6 MB, 1.2 GB; cold 9.7-15.8 s.
    for size, low, high in ((1.9e6, 0.10, 0.24), (3.6e6, 0.10, 0.24), (1.2e9, 2.9, 3.1)):
        assert low <= LAW.restore_time(round(size)) <= high
    cold = replace(LAW, standby=False)
    assert 9.7 <= cold.restore_time(round(1.9e6)) <= 13.4
    assert 14.2 <= cold.restore_time(round(1.2e9)) <= 15.8
    assert LAW.save_time(round(1.2e9)) == pytest.approx(3.0)


def test_bad_gpu_parameters_are_rejected_with_a_reason() -> None:
    with pytest.raises(ValueError, match="slice_aggregate must be in"):
        GpuParams(slice_aggregate=1.5)
    with pytest.raises(ValueError, match="restore_standby must be >= 0"):
        GpuParams(restore_standby=-1.0)
    # ``--params`` reads them under ``gpu:``, each problem with its path.
    assert params_from_dict({"gpu": {"standby": False}}).gpu == replace(LAW, standby=False)
    with pytest.raises(ValueError, match=r"gpu\.slice_agregate: unknown key; did you mean 'slice_aggregate'"):
        params_from_dict({"gpu": {"slice_agregate": 0.9}})


# -- whole runs -----------------------------------------------------------------------------


def test_ds_time_slices_two_jobs_at_the_measured_aggregate() -> None:
    wl = Workload((_gpu_worker(),), (_gpu_job("a", 1000), _gpu_job("b", 1000)))
    alone = 1000 * STEP
    jct = _jct(simulate(wl, make_policy("ds")))
    assert jct == pytest.approx({"a": alone * 2 / 0.94, "b": alone * 2 / 0.94})
    single = _jct(simulate(Workload((_gpu_worker(),), (_gpu_job("a", 1000),)), make_policy("ds")))
    assert single["a"] == pytest.approx(alone)


def test_freezing_runs_the_priority_job_at_full_speed() -> None:
    wl = Workload((_gpu_worker(),), (_gpu_job("short", 1000), _gpu_job("long", 3000)))
    run = simulate(wl, make_policy("srpt"))  # the default gpu section: freeze, one at a time
    jct = _jct(run)
    assert jct["short"] == pytest.approx(1000 * STEP)  # the other frozen from the start
    assert jct["long"] == pytest.approx(4000 * STEP)  # then the whole GPU: no slicing loss
    assert run.meta["gpu"]["freezes"] >= 1 and run.meta["gpu"]["suspends"] == 0


def test_memory_pressure_suspends_and_the_resume_pays_its_restore() -> None:
    # 10 GiB, 5 % headroom: one 6 GiB job resident at a time; the frozen one is suspended.
    worker = _gpu_worker(memory=10.0)
    wl = Workload((worker,), (_gpu_job("short", 1000, memory=6.0), _gpu_job("long", 3000, memory=6.0)))
    run = simulate(wl, make_policy("srpt"))
    jct = _jct(run)
    ckpt = round(6.0 * GIB * LAW.checkpoint_ratio)
    assert jct["short"] == pytest.approx(1000 * STEP)
    # Saved at 0 (done long before), restored from the standby when the GPU frees.
    assert jct["long"] == pytest.approx(4000 * STEP + LAW.restore_time(ckpt))
    assert run.meta["gpu"]["suspends"] == 1 and run.meta["gpu"]["resumes"] == 1
    assert run.meta["gpu"]["over_memory"] == 0


def test_mps_runs_both_jobs_by_their_percentages() -> None:
    wl = Workload((_gpu_worker(),), (_gpu_job("a", 1000), _gpu_job("b", 3000)))
    policy = replace(make_policy("srpt"), gpu=GpuShareConfig(mechanism="mps"))
    jct = _jct(simulate(wl, policy))
    # a starts alone at 100 %; b beside it at the 10 % floor; together capped at 0.986.
    scale = LAW.mps_aggregate / 1.1
    assert jct["a"] == pytest.approx(1000 * STEP / scale)
    done_b = jct["a"] * 0.1 * scale / STEP
    assert jct["b"] == pytest.approx(jct["a"] + (3000 - done_b) * STEP / 0.1)  # its 10 % for life


def test_a_gpu_job_waits_for_a_free_gpu() -> None:
    # One slot per device (no time-slicing replicas): the second job queues.
    wl = Workload((_gpu_worker(share=1),), (_gpu_job("a", 1000), _gpu_job("b", 1000, submit=1.0)))
    jct = _jct(simulate(wl, make_policy("ds")))
    assert jct["a"] == pytest.approx(10.0)
    assert jct["b"] == pytest.approx(19.0)  # waited 9 s, then alone


def test_gpu_jobs_go_round_robin_over_the_workers_that_can_host_them() -> None:
    workers = (
        WorkerSpec(WorkerId("cpu"), 4.0),
        _gpu_worker("g1", product="H100"),
        _gpu_worker("g2", product="L4", memory=24.0),
    )
    jobs = [_gpu_job(f"j{i}", 100, worker=None) for i in range(4)]
    big = replace(_gpu_job("big", 100, memory=40.0, worker=None), submit=1.0)
    pinned = replace(_gpu_job("h", 100, worker=None), gpu_product="H100", submit=2.0)
    wl = Workload(workers, (*jobs, big, pinned))
    # Each over the workers that could ever host it: memory, product.
    assert wl.placement() == {"j0": "g1", "j1": "g2", "j2": "g1", "j3": "g2", "big": "g1", "h": "g1"}
    # At its arrival, the first from its round-robin worker with a GPU free for it.
    two = (_gpu_worker("g1", share=1), _gpu_worker("g2", share=1, memory=24.0))
    busy = Workload(two, (_gpu_job("a", 1000, worker=None), _gpu_job("b", 300, worker=None),
                          _gpu_job("c", 100, worker=None, submit=1.0)))  # fmt: skip
    assert busy.placement()["c"] == "g1"
    run = simulate(busy, make_policy("ds"))
    placed = {j.id: j.worker_history[0] for j in run.jobs}
    assert placed["c"] == (3.0, "g2")  # g1 busy: waited for b to free g2
    with pytest.raises(ValueError, match="job x: worker cpu can host"):
        Workload(workers, (_gpu_job("x", 10, worker="cpu"),))
    with pytest.raises(ValueError, match="no worker can host"):
        Workload(workers, (replace(_gpu_job("x", 10, worker=None), gpu_product="A100"),))


def test_the_lower_bound_pools_the_gpus() -> None:
    wl = Workload((_gpu_worker(),), (_gpu_job("a", 1000), _gpu_job("b", 3000)))
    bound = lower_bound(wl)
    assert bound.makespan == pytest.approx(40.0)
    assert bound.avg_jct == pytest.approx((10.0 + 40.0) / 2)  # SRPT on one GPU
    srpt = _jct(simulate(wl, make_policy("srpt")))
    assert sum(srpt.values()) / 2 >= bound.avg_jct - 1e-9


def test_cpu_jobs_ignore_an_idle_gpu_on_their_worker() -> None:
    """A CPU workload runs exactly as before on workers that also have GPUs."""
    tr = trace([1.0 / (i + 1) for i in range(40)], cost=0.5)
    jobs = [job_plan(f"c{i}", tr, submit=3.0 * i, worker=None) for i in range(6)]
    plain = Workload((WorkerSpec(WorkerId("w1"), 1.0), WorkerSpec(WorkerId("w2"), 2.0)), tuple(jobs))
    with_gpus = Workload(tuple(replace(w, gpus=2, gpu_memory=GIB) for w in plain.workers), tuple(jobs))
    for name in ("ds", "specon", "fsp"):
        a, b = simulate(plain, make_policy(name)), simulate(with_gpus, make_policy(name))
        assert [(j.id, j.finish, j.worker_history) for j in a.jobs] == [
            (j.id, j.finish, j.worker_history) for j in b.jobs
        ]
        assert "gpu" not in a.meta and "gpu" not in b.meta


def test_a_mixed_worker_shares_its_cpu_among_the_cpu_jobs_only() -> None:
    tr = trace([1.0 / (i + 1) for i in range(40)], cost=0.5)
    cpu_job = job_plan("c", tr, steps=40, cost=0.5, worker="g1")
    wl = Workload((replace(_gpu_worker(), cpu=1.0),), (cpu_job, _gpu_job("g", 1000)))
    jct = _jct(simulate(wl, make_policy("ds")))
    assert jct["c"] == pytest.approx(20.0)  # the whole core
    assert jct["g"] == pytest.approx(10.0)  # the whole GPU
    assert not math.isnan(jct["c"])
