"""GPU constraints are hard for Algorithm 2 and for rebalancing: the count, the product (a
selector pair on ``GPU_PRODUCT_LABEL``) and the memory per device (``GPU_MEMORY_LABEL``)."""

from __future__ import annotations

from dataclasses import replace

from specon.config import PlacementConfig, RebalanceConfig
from specon.model import GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL, ContainerId, Resources, WorkerSnapshot
from specon.policy.decisions import Move, Refuse
from specon.policy.placement import fits, gpu_memory_of, select_target
from specon.policy.rebalance import plan_rebalance
from specon.testing.builders import container, snapshot, worker

H100 = "NVIDIA-H100-80GB-HBM3"
A10 = "NVIDIA-A10"
GIB = 2**30


def gpu_worker(
    wid: str, *, gpus: int = 1, product: str = H100, mib: int = 81_559, usage: float = 0.0
) -> WorkerSnapshot:
    labels = ((GPU_PRODUCT_LABEL, product), (GPU_MEMORY_LABEL, str(mib)))
    return worker(wid, gpu=gpus, usage=usage, labels=labels)


def test_a_worker_without_free_gpus_cannot_take_a_gpu_job() -> None:
    job = container("j", "src", gpu=1)
    assert fits(job, gpu_worker("w", gpus=1), Resources())
    assert not fits(job, gpu_worker("w", gpus=1), Resources(gpu=1))
    assert not fits(job, worker("cpu-only", gpu=0), Resources())


def test_the_product_is_a_selector_pair() -> None:
    job = container("j", "src", gpu=1, selector=((GPU_PRODUCT_LABEL, H100),))
    assert fits(job, gpu_worker("h", product=H100), Resources())
    assert not fits(job, gpu_worker("a", product=A10, mib=24_564), Resources())


def test_memory_per_device_is_checked_against_the_label() -> None:
    job = replace(container("j", "src", gpu=1), gpu_memory=40 * GIB)
    assert fits(job, gpu_worker("big", mib=81_559), Resources())
    assert not fits(job, gpu_worker("small", mib=24_564), Resources())
    # A worker that does not say how much memory its GPUs have cannot promise any.
    assert not fits(job, worker("unlabelled", gpu=1), Resources())
    assert fits(replace(job, gpu_memory=0), worker("unlabelled", gpu=1), Resources())


def test_a_malformed_memory_label_counts_as_none() -> None:
    assert gpu_memory_of(worker("w", labels=((GPU_MEMORY_LABEL, "lots"),))) == 0
    assert gpu_memory_of(worker("w", labels=((GPU_MEMORY_LABEL, "-5"),))) == 0
    assert gpu_memory_of(gpu_worker("w", mib=1024)) == GIB


def test_algorithm_2_moves_a_gpu_job_only_to_a_worker_that_can_host_it() -> None:
    # The lowest-scored, idlest worker has the wrong product; the next one fits.
    job = replace(container("req", "src", gpu=1, selector=((GPU_PRODUCT_LABEL, H100),)), gpu_memory=40 * GIB)
    s = snapshot(
        [
            gpu_worker("src", usage=0.9),
            gpu_worker("a10", product=A10, mib=24_564, usage=0.0),
            gpu_worker("h100", usage=0.5),
        ],
        [job, container("busy", "src", "progressing"), container("bg", "h100", "progressing")],
    )
    d = select_target(s, ContainerId("req"), cfg=PlacementConfig(), worker_timeout=20.0)
    assert isinstance(d, Move) and d.target == "h100"


def test_algorithm_2_refuses_when_no_worker_has_a_free_gpu() -> None:
    s = snapshot(
        [gpu_worker("src", usage=0.9), gpu_worker("full")],
        [
            container("req", "src", gpu=1),
            container("busy", "src", "progressing"),
            container("holder", "full", "progressing", gpu=1),
        ],
    )
    d = select_target(s, ContainerId("req"), cfg=PlacementConfig(tolerance=0.0), worker_timeout=20.0)
    assert not isinstance(d, Move)
    if isinstance(d, Refuse):
        assert d.container == "req"


def test_rebalancing_never_puts_a_gpu_job_where_it_cannot_run() -> None:
    # Three converged GPU jobs on one worker and an empty worker beside it: balancing by counts
    # moves one there when it has a free GPU, and none when it has no GPU.
    jobs = [container(f"g{i}", "src", t_cc=float(i), migrated=True, gpu=1) for i in range(3)]
    cfg = RebalanceConfig(mode="balanced")
    with_gpu = snapshot([gpu_worker("src", gpus=4), gpu_worker("spare")], jobs)
    assert [m.target for m in plan_rebalance(with_gpu, cfg=cfg, worker_timeout=20.0)] == ["spare"]
    cpu_only = snapshot([gpu_worker("src", gpus=4), worker("spare", gpu=0)], jobs)
    assert plan_rebalance(cpu_only, cfg=cfg, worker_timeout=20.0) == []
