"""Workers' GPUs and jobs' GPU use in the manager: the status API, the page and /metrics."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from specon_manager.metrics import ManagerMetrics
from specon_manager.page import render_status_page
from specon_manager.status import build_status

from specon.wire import protocol
from specon.wire.gpu import GpuDevice, GpuUse
from specon.wire.protocol import Heartbeat
from specon.wire.status import Status
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, policy, report

GIB = 2**30
H100 = GpuDevice(0, "GPU-0", "NVIDIA H100 80GB HBM3", 80 * GIB, int(4.5 * GIB), 97.0)
SPARE = GpuDevice(1, "GPU-1", "NVIDIA H100 80GB HBM3", 80 * GIB, 0, None)


def gpu_heartbeat(agent: FakeAgent, *reports: protocol.ContainerReport) -> Heartbeat:
    return dataclasses.replace(agent.heartbeat(*reports), gpus=(H100, SPARE))


def samples(metrics: ManagerMetrics, name: str) -> dict[tuple[str, ...], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        tuple(s.labels[k] for k in ("worker", "gpu") if k in s.labels): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def test_gpus_and_gpu_use_show_in_status_and_page(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    agent = FakeAgent("gpu-box-1", clock)
    trainer = dataclasses.replace(
        report("trainer"), gpu=GpuUse(devices=(0,), memory=int(4.5 * GIB), utilisation=80.0), gpu_memory=GIB
    )
    waiting = dataclasses.replace(report("waiting"), gpu=GpuUse(devices=(0,), memory=GIB, state="frozen"))
    coord.on_heartbeat(gpu_heartbeat(agent, trainer, waiting, report("cpu-only")))
    st = build_status(coord.core, clock())
    (worker,) = st.workers
    assert worker.gpus == (H100, SPARE)
    gpu = {c.id: c.gpu for c in st.containers}
    assert gpu == {"trainer": trainer.gpu, "waiting": waiting.gpu, "cpu-only": None}
    # The status travels: encoded and decoded on both of the decoder's paths.
    data = protocol.encode(st)
    assert protocol.decode(data, Status) == st
    assert protocol.decode(data) == st

    page = render_status_page(st)
    assert "0: NVIDIA H100 80GB HBM3 · 4.5 / 80 GiB · 97 %" in page
    assert "1: NVIDIA H100 80GB HBM3 · 0.0 / 80 GiB</div>" in page  # no utilisation sampled
    assert "GPU 4.5 GiB on 0 · 80 %" in page
    assert "GPU 1.0 GiB on 0 · <b>frozen</b>" in page


def test_a_stopped_job_shows_no_gpu_unless_the_sharing_suspended_it(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    agent = FakeAgent("gpu-box-1", clock)
    used = GpuUse(devices=(0,), memory=GIB, utilisation=50.0)
    coord.on_heartbeat(
        gpu_heartbeat(
            agent, dataclasses.replace(report("gone"), gpu=used), dataclasses.replace(report("s"), gpu=used)
        )
    )
    suspended = dataclasses.replace(report("s", phase="stopped"), gpu=GpuUse(state="suspended"))
    coord.on_heartbeat(gpu_heartbeat(agent, suspended))  # "gone" is no longer listed
    st = build_status(coord.core, clock())
    assert {c.id: (c.phase, c.gpu) for c in st.containers} == {
        "gone": ("stopped", None),
        "s": ("stopped", GpuUse(state="suspended")),
    }
    assert "<b>suspended</b>" in render_status_page(st)


def test_a_worker_without_gpus_says_none(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    coord.on_heartbeat(FakeAgent("cpu-box", clock).heartbeat(report("a")))
    st = build_status(coord.core, clock())
    assert st.workers[0].gpus == ()
    assert '<td><span class="muted">-</span></td>' in render_status_page(st)


def test_metrics_per_worker_gpu_and_no_series_after_the_worker_is_forgotten(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    metrics = ManagerMetrics()
    metrics.watch(coord.core)
    gpu_box, cpu_box = FakeAgent("gpu-box-1", clock), FakeAgent("cpu-box", clock)
    coord.on_heartbeat(gpu_heartbeat(gpu_box, report("a")))
    coord.on_heartbeat(cpu_box.heartbeat(report("b")))
    assert samples(metrics, "specon_manager_worker_gpus") == {("gpu-box-1",): 2.0}
    assert samples(metrics, "specon_manager_worker_gpu_utilisation") == {("gpu-box-1", "0"): 97.0}
    assert samples(metrics, "specon_manager_worker_gpu_memory_used_bytes") == {
        ("gpu-box-1", "0"): float(int(4.5 * GIB)),
        ("gpu-box-1", "1"): 0.0,
    }
    assert samples(metrics, "specon_manager_worker_gpu_memory_total_bytes") == {
        ("gpu-box-1", "0"): float(80 * GIB),
        ("gpu-box-1", "1"): float(80 * GIB),
    }
    # The GPU box's job finishes and the box goes silent until it is pruned (a box with an
    # unfinished job stays until the job runs elsewhere); the CPU box keeps beating.
    coord.on_heartbeat(gpu_heartbeat(gpu_box, report("a", phase="finished")))
    msg = coord.policy.messaging
    for _ in range(3):
        clock.advance(msg.prune_after * msg.worker_timeout / 2 + 1)
        coord.on_heartbeat(cpu_box.heartbeat(report("b")))
        coord.step(rebalance=True)
    assert set(coord.state.workers) == {"cpu-box"}
    assert samples(metrics, "specon_manager_worker_gpus") == {}
    assert samples(metrics, "specon_manager_worker_gpu_memory_total_bytes") == {}
