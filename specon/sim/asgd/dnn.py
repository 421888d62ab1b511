"""The workload of MB-ASGD's scheduling evaluation (Section V-B, Table III).

Table III (the paper's, from [35]): examples per epoch, model size, forward+backward TFLOPs
per mini-batch of 1024 examples, and the mean number of epochs, for NiN, GoogLeNet, AlexNet
and VGG19. The paper's cluster: one NVIDIA Grid K520 per node at 1229 GFLOPS, 1 Gbps links,
mini-batches of 1024. A job's epochs are Gaussian with the table's mean and variance 2.

Service times of one mini-batch, and the choices the paper leaves open:

- ``worker``: TFLOPs per batch / 1229 GFLOPS (the paper's rule).
- ``uplink``, ``downlink``: the model's bytes over 1 Gbps, MB read as 10^6 bytes, no protocol
  overhead (the paper: "the model size ... is used to estimate uplink and downlink times").
- ``server``: the paper computes it from the GPU too but gives no FLOP count. We count an SGD
  update as 2 FLOPs per float32 parameter (a multiply and an add), parameters = bytes / 4:
  well under a millisecond, so the network, not the server, bounds every model.
- A job's size in steps is ``ceil(epochs * examples / 1024)``; epochs are redrawn below 1.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from specon.sim.asgd.mva import ServiceTimes

BATCH = 1024
GPU_GFLOPS = 1229.0  # NVIDIA Grid K520 [36]
LINK_GBPS = 1.0
EPOCH_VARIANCE = 2.0
UPDATE_FLOPS_PER_PARAM = 2.0
BYTES_PER_PARAM = 4.0


@dataclass(frozen=True, slots=True)
class DnnModel:
    """One row of Table III."""

    name: str
    examples: int  # per epoch, |D|
    size_mb: float  # parameters exchanged, 10^6 bytes
    tflops_per_batch: float  # forward + backward, batch of 1024
    epochs: float  # mean

    def service_times(self, gflops: float = GPU_GFLOPS, link_gbps: float = LINK_GBPS) -> ServiceTimes:
        """Seconds per mini-batch at each station of the queueing model."""
        if not (gflops > 0 and link_gbps > 0 and math.isfinite(gflops) and math.isfinite(link_gbps)):
            raise ValueError(f"gflops and link_gbps must be positive, got {gflops}, {link_gbps}")
        transfer = self.size_mb * 1e6 * 8 / (link_gbps * 1e9)
        params = self.size_mb * 1e6 / BYTES_PER_PARAM
        return ServiceTimes(
            worker=self.tflops_per_batch * 1e3 / gflops,
            uplink=transfer,
            server=params * UPDATE_FLOPS_PER_PARAM / (gflops * 1e9),
            downlink=transfer,
        )

    @property
    def steps_per_epoch(self) -> float:
        return self.examples / BATCH

    @property
    def mean_steps(self) -> float:
        """Mean job size in mini-batches (the mean epochs times the steps of one)."""
        return self.epochs * self.steps_per_epoch

    def draw_steps(self, rng: random.Random) -> int:
        """One job's size: epochs ~ Gaussian(mean, variance 2), at least one epoch."""
        epochs = rng.gauss(self.epochs, math.sqrt(EPOCH_VARIANCE))
        while epochs < 1.0:
            epochs = rng.gauss(self.epochs, math.sqrt(EPOCH_VARIANCE))
        return max(1, math.ceil(epochs * self.steps_per_epoch))


# Table III of the paper (from [35]).
NIN = DnnModel("NiN", 50_000, 30.0, 6.7, 200.0)
GOOGLENET = DnnModel("GoogLeNet", 1_200_000, 54.0, 9.7, 200.0)
ALEXNET = DnnModel("AlexNet", 1_200_000, 249.0, 7.0, 90.0)
VGG19 = DnnModel("VGG19", 1_200_000, 575.0, 120.0, 74.0)

TABLE_III: tuple[DnnModel, ...] = (NIN, GOOGLENET, ALEXNET, VGG19)
# Fig. 12b / 13b: "jobs only from larger DNNs".
LARGE: tuple[DnnModel, ...] = (ALEXNET, VGG19)
WORKLOADS: dict[str, tuple[DnnModel, ...]] = {"all": TABLE_III, "large": LARGE}


def workload(name: str) -> tuple[DnnModel, ...]:
    """The models of a named workload (``all`` or ``large``), or ValueError."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"models must be one of {', '.join(WORKLOADS)}, got {name!r}") from None
