"""What a heartbeat says of each container: a running one as its agent watches it, an ended one
as it last was. Pure: the agent (``specon_agent.core``) hands in what it keeps."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from specon.model import Category, ContainerId
from specon.policy.monitor import MonitorState
from specon.runtime.base import ContainerInfo, JobSpec
from specon.wire.gpu import GpuUse
from specon.wire.protocol import ContainerReport
from specon.wire.status import LossWindow, Phase
from specon_agent.gpu_share import Tracked
from specon_agent.labels import job_labels
from specon_agent.watched import Watched


def running_report(
    w: Watched,
    *,
    cpu_weight: int | None,
    remaining_work: float | None,
    window: LossWindow | None,
    gpu: GpuUse | None,
) -> ContainerReport:
    """A watched container: its category, Algorithm 1's figures, its step and placement facts."""
    st, spec = w.state, w.info.spec
    return ContainerReport(
        id=w.info.id,
        category=st.display,
        phase="running",
        last_g=st.last_g if st.last_g is not None and math.isfinite(st.last_g) else None,
        t_cc=st.t_cc,
        migrated=st.migrated,
        stalled=st.stalled,
        pending_request=st.pending_request,
        step=w.step,
        requests=spec.requests,
        job=job_labels(spec),
        selector=dict(spec.selector),
        tolerations=spec.tolerations,
        cpu_weight=cpu_weight,
        remaining_work=remaining_work,
        window=window,
        gpu_memory=spec.gpu_memory,
        gpu=gpu,
    )


def ended_report(
    info: ContainerInfo,
    phase: Phase,
    state: MonitorState | None,
    initial: Category,
    gpu: GpuUse | None,
    *,
    quality_share: float | None = None,
) -> ContainerReport:
    """A container that ended here (finished, stopped or failed), in its last category; a
    finished one with its quality point as measured here (``quality_share``), if it was."""
    out = stopped_report(info.id, info.spec, phase, state, initial=initial, gpu=gpu)
    if phase == "finished" and quality_share is not None:
        out = replace(out, quality_share=quality_share)
    return out


def stopped_report(
    cid: ContainerId,
    spec: JobSpec | None,
    phase: Phase,
    state: MonitorState | None,
    *,
    initial: Category,
    gpu: GpuUse | None,
) -> ContainerReport:
    """A job not running here, in its last category: one that ended, or one the GPU sharing
    suspended (it comes back here when due); with its spec's placement facts where known."""
    category = state.display if state else initial
    if spec is None:
        return ContainerReport(id=cid, category=category, phase=phase, gpu=gpu)
    return ContainerReport(
        id=cid,
        category=category,
        phase=phase,
        migrated=bool(state and state.migrated),
        requests=spec.requests,
        job=job_labels(spec),
        selector=dict(spec.selector),
        tolerations=spec.tolerations,
        gpu_memory=spec.gpu_memory,
        gpu=gpu,
    )


def suspended_reports(
    jobs: Mapping[ContainerId, Tracked], states: Mapping[ContainerId, MonitorState], initial: Category
) -> list[ContainerReport]:
    """Jobs the GPU sharing holds suspended (``GpuShare.suspended``), stopped and saying so."""
    return [
        stopped_report(
            cid,
            t.spec,
            "stopped",
            states.get(cid),
            initial=initial,
            gpu=GpuUse(devices=(t.device,), memory=t.memory, state="suspended"),
        )
        for cid, t in sorted(jobs.items())
    ]
