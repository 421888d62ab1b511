"""Rate limits on the parameter server host's link, both directions, with ``tc``.

The paper's bottleneck is the PS's network interface: its egress carries every worker's
parameters (the downlink station) and its ingress every gradient (the uplink station), full
duplex. On a ``specon.testing.net_hosts`` host that is the veth pair joining its namespace to
the bridge, and both directions are shaped as egress, where a token bucket (``tbf``) acts:

- downlink: ``eth0`` inside the PS's namespace (what the PS sends);
- uplink: the pair's other end on the bridge (what the bridge sends into the PS's namespace);
  shaping that end's egress is shaping the PS's ingress, without an ``ifb`` device or an
  ingress policer (which drops instead of queueing and so rations TCP badly).

The hosts' TCP is set as a parameter server's long-lived connections run it (``tune_tcp``, and
the processes' per-socket congestion control ``CONGESTION``; reasons below).

Nothing to undo on close: deleting the namespace deletes the pair and its qdiscs with it, and
the namespace's sysctls.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
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
    def run(self, argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]: ...


class LinkError(RuntimeError):
    """``tc`` or ``ip`` refused; the message has their words."""


@dataclass(frozen=True, slots=True)
class Shaping:
    """A token bucket per direction: ``rate_mbit`` megabits per second each way."""

    rate_mbit: float
    burst_kb: int = 64  # bytes in kilobytes: above rate / HZ so the bucket never starves
    # Queue the bucket holds before dropping: a switch port's few milliseconds at the link's
    # rate. Each direction's ACKs wait behind the other direction's data in this queue, and
    # a deep one (tens of ms) stretches every flow's round trip by as much.
    latency_ms: int = 5
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


# TCP as a parameter server's long-lived connections run it, set per host: sysctls of each
# host's own network namespace (never this one's), gone with the namespace. Slow start after
# idle off: once several workers share the link, a PS connection idles between its transfers
# longer than its RTO, and restarting each from a small window leaves the link idle while a
# transfer is pending (deployments with long-lived connections turn it off).
TCP_SETTINGS: dict[str, str] = {"net.ipv4.tcp_slow_start_after_idle": "0"}
# The congestion control the processes ask for on their sockets (a namespace may only default
# to those this machine allows: the choice is per socket). Cubic, Linux's default and what a
# PS cluster runs unless told otherwise, not the BBR a namespace inherits here: cubic keeps the
# bottleneck's queue filled (the link stays busy while a transfer is pending, the model's
# work-conserving station); BBR paces at its estimate of the bottleneck's rate and ignores loss,
# and with several workers' flows through a shallow queue it dropped about a fifth of the PS's
# packets (4 workers, 5 ms queue: about 20,000 drops in 6 s against about 130 with cubic).
CONGESTION = "cubic"


def tune_tcp(host: NetHost, settings: Mapping[str, str] = TCP_SETTINGS) -> None:
    """Set ``settings`` (sysctl name: value) in the host's network namespace."""
    for name, value in settings.items():
        proc = host.run(["sysctl", "-q", "-w", f"{name}={value}"], timeout=10)
        if proc.returncode != 0:
            raise LinkError(f"{host.name}: sysctl {name}={value}: {proc.stderr.strip() or proc.returncode}")


def sysctl(host: NetHost, name: str) -> str:
    """A sysctl's value in the host's network namespace: for logs and tests."""
    proc = host.run(["sysctl", "-n", name], timeout=10)
    if proc.returncode != 0:
        raise LinkError(f"{host.name}: sysctl {name}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip()
