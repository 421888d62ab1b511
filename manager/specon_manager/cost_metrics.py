"""The learned cost of a move (``specon.policy.move_costs``) as Prometheus gauges, read from the
coordinator's estimator at scrape time: one series per backend and job size learned so far."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from specon.coordinator.machine import Coordinator
from specon.policy.move_costs import bucket_name


class MoveCostCollector(Collector):
    def __init__(self, get: Callable[[], Coordinator]) -> None:
        self._get = get

    def collect(self) -> Iterator[GaugeMetricFamily]:
        costs = self._get().move_costs
        labels = ["backend", "size"]
        down = GaugeMetricFamily(
            "specon_manager_move_downtime_seconds",
            "Learned downtime of a move (the policy's migration.move_downtime as the prior)",
            labels=labels,
        )
        cpu = GaugeMetricFamily(
            "specon_manager_move_restore_cpu_seconds",
            "Learned CPU-seconds a restore takes from the target's jobs (migration.restore_cpu as the prior)",
            labels=labels,
        )
        moves = GaugeMetricFamily(
            "specon_manager_move_cost_observations",
            "Measured moves behind each learned figure",
            labels=labels,
        )
        for (backend, bucket), est in costs.cells().items():
            key = [backend, bucket_name(bucket)]
            down.add_metric(key, est.downtime)
            cpu.add_metric(key, est.restore_cpu)
            moves.add_metric(key, est.moves)
        yield down
        yield cpu
        yield moves
