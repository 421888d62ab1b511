"""The GPU standby's pure parts: which job may use which GPU's standby, the environment that
names the GPU, the pool's arguments, and priming (on the CPU: there is no GPU here)."""

from __future__ import annotations

import sys

import pytest

from specon.model import ContainerId, Resources
from specon.runtime.base import JobSpec
from specon.runtime.local.standby import prime
from specon.runtime.local.standby_pool import DEVICE_ENV, StandbyPool, choose, gpu_env

PY = sys.executable


def job(gpus: int = 1, env: tuple[tuple[str, str], ...] = ()) -> JobSpec:
    return JobSpec(
        id=ContainerId("j"), command=(PY, "-m", "specon.workloads"), requests=Resources(gpu=gpus), env=env
    )


@pytest.mark.parametrize(
    ("spec", "ready", "expected"),
    [
        (job(), {0, 1}, 0),  # the first ready one, in the order given
        (job(), {1}, 1),
        (job(), set(), None),  # none ready: it starts as before
        (job(gpus=0), {0, 1}, None),  # not a GPU job
        (job(gpus=2), {0, 1}, None),  # a standby's CUDA sees one GPU only
        (job(env=((DEVICE_ENV, "1"),)), {0, 1}, 1),  # the GPU the job names
        (job(env=((DEVICE_ENV, " 1 "),)), {0, 1}, 1),
        (job(env=((DEVICE_ENV, "1"),)), {0}, None),  # ... or none: never another one
        (job(env=((DEVICE_ENV, "3"),)), {0, 1}, None),
        (job(env=((DEVICE_ENV, "0,1"),)), {0, 1}, None),
        (job(env=((DEVICE_ENV, "GPU-1234"),)), {0, 1}, None),
    ],
)
def test_which_gpus_standby_a_job_may_use(spec: JobSpec, ready: set[int], expected: int | None) -> None:
    assert choose(spec, (0, 1), ready.__contains__) == expected


def test_the_job_sees_its_gpu_numbered_as_nvml_numbers_it() -> None:
    assert gpu_env(3) == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@pytest.mark.parametrize("gpus", [(0, 0), (-1,), (True,)])
def test_the_pool_refuses_bad_gpu_indexes_before_starting_anything(gpus: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="distinct integers >= 0"):
        StandbyPool("w0", gpus)


def test_priming_without_torch_ops_only_imports() -> None:
    sys.modules.pop("json.tool", None)
    assert prime(["json.tool"], torch_ops=False) == "none"
    assert "json.tool" in sys.modules


@pytest.mark.slow
def test_priming_on_the_cpu_leaves_torch_as_a_fresh_interpreter_finds_it() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the standby primes on the GPU (bench_gpu measures that)")
    torch.manual_seed(123)
    expected = torch.randn(4)
    torch.manual_seed(123)
    grad_before = torch.is_grad_enabled()
    assert prime([], torch_ops=True) == "cpu"
    assert "torch._dynamo" in sys.modules, "what every optimizer would import on creation"
    assert torch.initial_seed() == 123
    assert torch.equal(torch.randn(4), expected), "the generator as seeded, not advanced by priming"
    assert torch.is_grad_enabled() == grad_before
