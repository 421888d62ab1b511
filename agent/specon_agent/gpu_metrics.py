"""The agent's GPU metrics, read from its newest GPU sample at scrape time.

Per container, specon's own: its GPU memory in bytes and its SM utilisation (%; no series
while NVML has no sample of it). Per device, only with ``--gpu-device-metrics`` (off by
default: where the DCGM exporter runs, as on a GPU operator's nodes, a second copy of its
series double-counts in every sum), the DCGM exporter's names and labels (``gpu``, ``UUID``,
``modelName``, ``Hostname``: here the worker's id), so dashboards built for it read these
too: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` (MiB).
Only the devices and containers of the newest sample have series: one that went has none to
remove. The GPU sharing's counters (``specon_agent.gpu_share``): switches, freezes, thaws,
suspends, resumes and refusals, and its jobs by state.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specon_agent.core import Agent

MIB = 2**20
DCGM_LABELS = ["gpu", "UUID", "modelName", "Hostname"]


class GpuCollector(Collector):
    def __init__(self, agent: Agent, *, devices: bool = False) -> None:
        self.agent = agent
        self.devices = devices  # the per-device series under the DCGM exporter's names

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        a = self.agent
        sample, reader = a.gpu_sample, a.gpus.reader
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=DCGM_LABELS)
        used = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=DCGM_LABELS
        )
        free = GaugeMetricFamily(
            "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=DCGM_LABELS
        )
        memory = GaugeMetricFamily(
            "specon_agent_container_gpu_memory_bytes",
            "GPU memory held by each container's processes (bytes, all its devices)",
            labels=["container"],
        )
        busy = GaugeMetricFamily(
            "specon_agent_container_gpu_utilisation",
            "SM utilisation of each container's processes (%, mean over its devices) where NVML sampled it",
            labels=["container"],
        )
        for d in sample.devices if sample and self.devices else ():
            labels = [str(d.index), d.uuid, d.name, a.worker]
            if d.utilisation is not None:
                util.add_metric(labels, d.utilisation)
            used.add_metric(labels, d.memory_used // MIB)
            free.add_metric(labels, max(0, d.memory_total - d.memory_used) // MIB)
        for cid, use in sorted(sample.containers.items()) if sample else ():
            memory.add_metric([cid], use.memory)
            if use.utilisation is not None:
                busy.add_metric([cid], use.utilisation)
        yield from (util, used, free) if self.devices else ()
        yield from (memory, busy)
        yield GaugeMetricFamily(
            "specon_agent_gpu_available",
            "1 while NVML answers this agent",
            value=int(reader is not None and reader.available),
        )
        yield GaugeMetricFamily(
            "specon_agent_gpu_unmapped_processes",
            "GPU processes in no container of this worker (another tenant's, an MPS server, or no host PIDs)",
            value=sample.unmapped if sample else 0,
        )
        share = a.gpu_share.counters
        for name, value, doc in (
            ("switches", share.switches, "GPU-sharing plans that changed which jobs run"),
            ("freezes", share.freezes, "jobs frozen on their GPU (specon.agent.gpu_freeze)"),
            ("thaws", share.thaws, "frozen jobs thawed"),
            ("suspends", share.suspends, "jobs suspended to their checkpoint to free GPU memory"),
            ("resumes", share.resumes, "suspended jobs restored on this worker"),
            ("share_failures", share.failures, "freezes, thaws, suspends and resumes the runtime refused"),
        ):
            yield CounterMetricFamily(f"specon_agent_gpu_{name}", doc, value=value)
        states = GaugeMetricFamily(
            "specon_agent_gpu_jobs", "Jobs the GPU sharing holds, by state", labels=["state"]
        )
        for state in ("running", "frozen", "suspended"):
            states.add_metric([state], sum(1 for s in a.gpu_states.values() if s == state))
        yield states
        yield CounterMetricFamily(
            "specon_agent_gpu_read_failures",
            "NVML calls that failed, and runtime PID lookups that failed (see specon.agent.gpu_read_failed)",
            value=(reader.failures if reader is not None else 0) + a.gpus.pid_failures,
        )
