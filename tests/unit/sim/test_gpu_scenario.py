"""GPU workers and GPU jobs in a scenario file: reading them, and every problem with its path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from specon.policy.loss_curve import CurveParams
from specon.sim.curves import synthetic_trace
from specon.sim.gpu import GIB
from specon.sim.policies import make_policy
from specon.sim.runner import simulate
from specon.sim.scenario_file import FileWorkload, ScenarioFileError, load_scenario, parse_scenario
from specon.sim.trace import Trace, load_traces

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
HEAD = "apiVersion: specon/v1alpha1\nkind: Scenario\nname: mine\n"
Traces = dict[str, list[Trace]]
J = "\njobs: [{submit: 0, model: vae, steps: 1}]"  # a CPU job


@pytest.fixture
def traces() -> Traces:
    params = CurveParams(beta0=2e-4, beta1=1.0, beta2=0.2)
    return {
        "vae": [synthetic_trace(model="vae", steps=200, step_cost=0.01, params=params, noise=0.01, seed=0)]
    }


def _errors(body: str, traces: Traces) -> list[str]:
    with pytest.raises(ScenarioFileError) as info:
        parse_scenario(HEAD + textwrap.dedent(body), traces, base_dir=Path())
    return list(info.value.errors)


def test_gpu_workers_and_jobs_are_read_in_bytes_and_label_values(traces: Traces) -> None:
    body = """\
        workers:
          - {name: g1, cpu: 16, gpus: 2, gpu_memory: 80, gpu_product: NVIDIA H100 80GB HBM3, gpu_share: 4}
          - {name: c1, cpu: 2}
        jobs:
          - {submit: 0, model: vae, steps: 500, gpu: 1, gpu_step: 0.02, gpu_memory: 4.5, checkpoint: 1.2}
          - {submit: 1, model: vae, steps: 300, gpu: 1, gpu_step: 0.01, gpu_product: NVIDIA H100 80GB HBM3}
          - {submit: 2, model: vae, steps: 100}
        """
    sc = parse_scenario(HEAD + textwrap.dedent(body), traces, base_dir=Path())
    assert isinstance(sc.plan, FileWorkload)
    g1, c1 = sc.plan.workers
    assert (g1.gpus, g1.gpu_memory, g1.gpu_product, g1.gpu_share) == (2, 80 * GIB, "NVIDIA-H100-80GB-HBM3", 4)
    assert (c1.gpus, c1.gpu_memory, c1.gpu_product, c1.gpu_share) == (0, 0, None, 1)
    wl = sc.workload(0, traces)
    a, b, cpu = wl.jobs
    assert (a.gpu, a.step_cost, a.gpu_memory, a.checkpoint) == (1, 0.02, round(4.5 * GIB), round(1.2 * GIB))
    assert (b.gpu, b.step_cost, b.gpu_product) == (1, 0.01, "NVIDIA-H100-80GB-HBM3")
    assert (cpu.gpu, cpu.step_cost) == (0, traces["vae"][0].step_cost)
    placement = wl.placement()
    assert placement["job-1"] == "g1" and placement["job-2"] == "g1"  # only g1 has GPUs
    run = simulate(wl, make_policy("ds"))
    assert all(j.steps_done == j.steps for j in run.jobs)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("workers: [{name: g, gpus: 1}]" + J,
         "workers[0].gpu_memory: missing: the GiB of memory of each GPU, with gpus"),
        ("workers: [{name: g, gpus: -1, gpu_memory: 8}]" + J,
         "workers[0].gpus: must be an integer >= 0, got -1"),
        ("workers: [{name: g, gpu_memory: 8}]" + J,
         "workers[0].gpus: a worker with gpu_memory, gpu_product or gpu_share needs gpus >= 1"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 0}]" + J,
         "workers[0].gpu_memory: must be > 0, got 0"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8, gpu_share: 0}]" + J,
         "workers[0].gpu_share: must be an integer >= 1, got 0"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8}]\njobs: [{submit: 0, model: vae, steps: 1, gpu: 2}]",
         "jobs[0].gpu: must be 1 (the simulator models one-GPU jobs), got 2"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8}]\njobs: [{submit: 0, model: vae, steps: 1, gpu: 1}]",
         "jobs[0].gpu_step: missing: seconds per step alone on one GPU"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8}]\n"
         "jobs: [{submit: 0, model: vae, steps: 1, gpu_step: 1}]",
         "jobs[0].gpu_step: only a GPU job (gpu: 1) has it"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8}]\n"
         "jobs: [{submit: 0, model: vae, steps: 1, gpu: 1, gpu_step: 0.1, gpu_memory: -2}]",
         "jobs[0].gpu_memory: must be >= 0, got -2"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8}]\n"
         "jobs: [{submit: 0, model: vae, steps: 1, gpu: 1, gpu_step: 0.1, gpu_memory: 9}]",
         "jobs[0]: no worker has a GPU with 9 GiB"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8, gpu_product: L4}, {name: c}]\n"
         "jobs: [{submit: 0, model: vae, steps: 1, gpu: 1, gpu_step: 0.1, worker: c}]",
         "jobs[0].worker: worker c has no GPU"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8, gpu_product: L4}]\n"
         "jobs: [{submit: 0, model: vae, steps: 1, gpu: 1, gpu_step: 0.1, gpu_product: NVIDIA A100}]",
         "jobs[0]: no worker has a GPU of product NVIDIA-A100"),
        ("workers: [{name: g, gpus: 1, gpu_memory: 8, gpu_products: L4}]" + J,
         "workers[0].gpu_products: unknown key; did you mean 'gpu_product'?"),
    ],
)  # fmt: skip
def test_each_gpu_problem_names_its_path(traces: Traces, body: str, message: str) -> None:
    assert message in _errors(body, traces)


def test_the_gpu_example_reads_and_runs(traces: Traces) -> None:
    sc = load_scenario(EXAMPLES / "scenario-gpu.yaml", load_traces())
    wl = sc.workload(0, load_traces())
    assert len(wl.jobs) == 8 and all(j.gpu for j in wl.jobs)
    assert max(j.submit for j in wl.jobs) <= 60  # arriving over a minute
    (worker,) = wl.workers
    assert worker.gpus == 1 and worker.gpu_share >= len(wl.jobs)
