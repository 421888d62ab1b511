"""Rate limits on the parameter server host's link, both directions, with ``tc``.

The paper's bottleneck is the PS's network interface: its egress carries every worker's
parameters (the downlink station) and its ingress every gradient (the uplink station), full
duplex. On a ``specon.testing.net_hosts`` host that is the veth pair joining its namespace to
the bridge, and both directions are shaped as egress, where a token bucket (``tbf``) acts:

- downlink: ``eth0`` inside the PS's namespace (what the PS sends);
- uplink: the pair's other end on the bridge (what the bridge sends into the PS's namespace);
  shaping that end's egress is shaping the PS's ingress, without an ``ifb`` device or an
  ingress policer (which drops instead of queueing and so rations TCP badly).

Nothing to undo on close: deleting the namespace deletes the pair and its qdiscs with it.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class NetHost(Protocol):
    """A host of ``specon.testing.net_hosts`` (its ``NetHost``): this package runs on any such
    harness, and ``specon.testing`` stays out of the shipped package (import-linter)."""

    @property
    def name(self) -> str: ...
    @property
    def ns(self) -> str: ...
    @property
    def address(self) -> str: ...
    def popen(self, argv: Sequence[str], **kwargs: Any) -> Any: ...


class LinkError(RuntimeError):
    """``tc`` or ``ip`` refused; the message has their words."""


@dataclass(frozen=True, slots=True)
class Shaping:
    """A token bucket per direction: ``rate_mbit`` megabits per second each way."""

    rate_mbit: float
    burst_kb: int = 64  # bytes in kilobytes: above rate / HZ so the bucket never starves
    latency_ms: int = 50  # queue the bucket holds before dropping
    fair: bool = False  # fq_codel under the bucket

    def __post_init__(self) -> None:
        if not self.rate_mbit > 0:
            raise ValueError(f"rate must be positive megabits/s, got {self.rate_mbit}")

    def tbf(self) -> list[str]:
        return [
            "tbf",
            "rate",
            f"{self.rate_mbit:g}mbit",
            "burst",
            f"{self.burst_kb}kb",
            "latency",
            f"{self.latency_ms}ms",
        ]

    @property
    def bytes_per_s(self) -> float:
        return self.rate_mbit * 1e6 / 8


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LinkError(f"{' '.join(argv)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def outer_end(host: NetHost) -> str:
    """The name, in this namespace, of the veth end paired with the host's ``eth0``."""
    inner = _run(["ip", "-n", host.ns, "-o", "link", "show", "eth0"])
    m = re.search(r"eth0@if(\d+)", inner)
    if not m:
        raise LinkError(f"{host.name}: eth0 is not one end of a veth pair: {inner.strip()}")
    for line in _run(["ip", "-o", "link", "show"]).splitlines():
        index, _, rest = line.partition(":")
        if index.strip() == m.group(1):
            return rest.strip().split("@")[0].split(":")[0]
    raise LinkError(f"{host.name}: no link with index {m.group(1)} here (its pair's other end)")


def shape(host: NetHost, shaping: Shaping) -> None:
    """Limit what ``host`` sends and receives to ``shaping`` (replacing any earlier limit)."""
    for pre, dev in ((["tc", "-n", host.ns], "eth0"), (["tc"], outer_end(host))):
        _run([*pre, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *shaping.tbf()])
        if shaping.fair:
            _run([*pre, "qdisc", "replace", "dev", dev, "parent", "1:1", "fq_codel"])


def limits(host: NetHost) -> tuple[str, str]:
    """``tc qdisc show`` of (the host's eth0, its pair's other end): for logs and tests."""
    down = _run(["tc", "-n", host.ns, "qdisc", "show", "dev", "eth0"]).strip()
    up = _run(["tc", "qdisc", "show", "dev", outer_end(host)]).strip()
    return down, up
