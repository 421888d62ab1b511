"""Where the chaos run's cluster lives: the manager and each agent on a network host of its own
(``specon.testing.net_hosts``), over TLS, some agents with a wall clock minutes off.

``placement(root, skews)`` gives the hosts ``EmbeddedCluster`` runs on (the manager's first),
the TLS files, and the hosts whose links the partition fault cuts. Where something cannot be
had here it says so in ``notes`` and the run goes on without it: no network namespaces (not
root, no ``ip``): loopback addresses, no partitions; no ``specon.testing.certs``: plain HTTP
(``--insecure-http``); no libfaketime: every clock right. Everything is removed on exit.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clockskew import FaketimeUnavailableError, SkewedHost, prepare, tls_issued_earlier

from specon.embedded.cluster import Host, TlsFiles
from specon.testing.net_hosts import NetHost, NetHosts, available

# The CA issued the manager's certificate this long before the run: valid on every skewed clock.
ISSUED_BEFORE = 3600.0


@dataclass
class Placement:
    cluster_hosts: list[Host] | None = None  # for EmbeddedCluster(hosts=...): None = loopback
    links: list[NetHost] = field(default_factory=list)  # the same hosts, to cut: the manager's first
    tls: TlsFiles | None = None
    skews: dict[str, float] = field(default_factory=dict)  # worker -> seconds its clock is off
    notes: list[str] = field(default_factory=list)
    tag: str = ""  # the names of the namespaces and links made for the run start with it


@contextlib.contextmanager
def placement(root: Path, skews: Sequence[float]) -> Iterator[Placement]:
    """Hosts for a manager and ``len(skews)`` agents, agent ``i``'s clock ``skews[i]`` s off."""
    out = Placement()
    if why := available():
        out.notes.append(f"no network hosts ({why}): loopback addresses, no partitions")
        yield out
        return
    workers = [f"w{i}" for i in range(len(skews))]
    with NetHosts(len(skews) + 1, names=["manager", *workers]) as hosts:
        preload: list[str] | None = None
        if any(skews):
            try:
                preload = prepare()
            except FaketimeUnavailableError as exc:
                out.notes.append(f"no skewed clocks ({exc})")
        if importlib.util.find_spec("specon.testing.certs") is not None:
            out.tls = tls_issued_earlier(root / "tls", hosts[0].address, ISSUED_BEFORE, preload)
        else:
            out.notes.append("no specon.testing.certs: plain HTTP between the hosts (--insecure-http)")
        out.links, out.tag = list(hosts), hosts.tag
        out.cluster_hosts = [hosts[0]]
        for worker, host, skew in zip(workers, hosts.hosts[1:], skews, strict=True):
            if skew and preload:
                out.cluster_hosts.append(SkewedHost(host, skew, tuple(preload)))
                out.skews[worker] = skew
            else:
                out.cluster_hosts.append(host)
        yield out
