"""The agent's own HTTP endpoints: /healthz and /metrics (the protocol needs no inbound port);
the GPU metrics are ``specon_agent.gpu_metrics``'s."""

from __future__ import annotations

import time
from collections.abc import Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specon_agent.daemon import AgentDaemon
from specon_agent.gpu_metrics import GpuCollector

DAEMON = web.AppKey("daemon", AgentDaemon)
REGISTRY = web.AppKey("registry", CollectorRegistry)


class AgentCollector(Collector):
    """Reads the agent's counters at scrape time: nothing to keep in sync."""

    def __init__(self, daemon: AgentDaemon) -> None:
        self.d = daemon

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        a, link = self.d.agent, self.d.link
        w = a.worker
        yield CounterMetricFamily("specon_agent_ticks", "Algorithm 1 ticks", value=a.counters.ticks)
        yield CounterMetricFamily("specon_agent_samples", "Progress samples read", value=a.counters.samples)
        skipped = CounterMetricFamily(
            "specon_agent_skipped_lines", "Log lines skipped, by reason", labels=["reason"]
        )
        for name, n in sorted(a.counters.skipped.items()):
            skipped.add_metric([name], n)
        yield skipped
        cats = GaugeMetricFamily(
            "specon_agent_containers", "Watched containers by category", labels=["category"]
        )
        tally: dict[str, int] = {}
        for watched in a.watched.values():
            name = watched.state.display.value
            tally[name] = tally.get(name, 0) + 1
        for name, n in sorted(tally.items()):
            cats.add_metric([name], n)
        yield cats
        # A log that cannot be read (or is refused: a FIFO, device or symlink in its place)
        # leaves its container unclassified: worth an alert, so it is a gauge of its own.
        yield GaugeMetricFamily(
            "specon_agent_unreadable_logs",
            "Watched containers whose progress log the last poll could not read or refused",
            value=sum(1 for watched in a.watched.values() if watched.tailer.error is not None),
        )
        yield CounterMetricFamily(
            "specon_agent_requests", "Reallocation requests sent", value=a.counters.requests_sent
        )
        cmds = CounterMetricFamily("specon_agent_commands", "Manager commands executed", labels=["action"])
        for action, n in sorted(a.counters.commands.items()):
            cmds.add_metric([action], n)
        yield cmds
        yield CounterMetricFamily(
            "specon_agent_command_failures", "Commands that failed", value=a.counters.command_failures
        )
        yield CounterMetricFamily(
            "specon_agent_heartbeats", "Heartbeats answered", value=link.heartbeats_sent
        )
        yield CounterMetricFamily(
            "specon_agent_heartbeats_unlisted",
            "Heartbeats sent with the containers as last listed: the runtime was still listing",
            value=link.heartbeats_unlisted,
        )
        yield CounterMetricFamily("specon_agent_manager_failures", "Failed exchanges", value=link.failures)
        yield GaugeMetricFamily(
            "specon_agent_manager_up", "1 while the manager answers", value=int(link.connected)
        )
        yield GaugeMetricFamily("specon_agent_worker_usage", f"R(w,t) of worker {w}", value=a.usage)
        # Only the containers watched now: one that left has no series to prune.
        weights = GaugeMetricFamily(
            "specon_agent_container_cpu_weight",
            "CPU weight in effect (cgroup-v2 units, 1-10000) per running container",
            labels=["container"],
        )
        for cid in sorted(a.watched):
            weight = a.cpu_weights.weight_of(cid)
            if weight is not None:
                weights.add_metric([cid], weight)
        yield weights
        yield CounterMetricFamily(
            "specon_agent_cpu_weight_failures",
            "CPU weights the runtime could not apply",
            value=a.cpu_weights.failures,
        )
        points = GaugeMetricFamily(
            "specon_agent_quality_point",
            "Each model's quality point on the cluster as the manager last sent it (share of the steps)",
            labels=["model"],
        )
        for model, share in sorted(a.cpu_weights.shares.items()):
            points.add_metric([model], share)
        yield points


async def healthz(request: web.Request) -> web.Response:
    d = request.app[DAEMON]
    now = d.agent.runtime.now()
    return web.json_response(
        {
            "ok": True,
            "worker": d.agent.worker,
            "manager_connected": d.link.connected,
            "last_manager_contact_age": None if d.link.last_ok is None else round(now - d.link.last_ok, 3),
            "containers": len(d.agent.watched),
            "gpus": len(d.agent.gpu_sample.devices) if d.agent.gpu_sample else 0,
            "time": time.time(),
        }
    )


async def metrics(request: web.Request) -> web.Response:
    return web.Response(
        body=generate_latest(request.app[REGISTRY]), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )


def create_app(daemon: AgentDaemon, *, gpu_device_metrics: bool = False) -> web.Application:
    """``gpu_device_metrics``: per-device GPU series under the DCGM exporter's names too."""
    app = web.Application()
    app[DAEMON] = daemon
    reg = CollectorRegistry()
    reg.register(AgentCollector(daemon))
    reg.register(GpuCollector(daemon.agent, devices=gpu_device_metrics))
    app[REGISTRY] = reg
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app
