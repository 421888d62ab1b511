"""Where the chaos run's cluster lives: the manager and each agent on a network host of its own
(``specon.testing.net_hosts``), over TLS, some agents with a wall clock minutes off.

``placement(root, skews)`` gives the hosts ``EmbeddedCluster`` runs on (the manager's first),
the TLS files, and the hosts whose links the partition fault cuts. Where something cannot be
had here it says so in ``notes`` and the run goes on without it: no network namespaces (not
root, no ``ip``): loopback addresses, no partitions; no ``specon.testing.certs``: plain HTTP
(``--insecure-http``); no libfaketime: every clock right. Everything is removed on exit.

Each agent's host also has a boot id of its own (``OwnBootHost``: ``/proc/sys/kernel/random/
boot_id`` bind-mounted over in a mount namespace of its own), as separate machines do: a run
recorded by one host cannot be verified from another, so a job restored away from a host the
manager took for lost supersedes the copy still running there (which fencing then stops),
where one kernel's boot id would let the target see that copy alive and refuse the start.
Without ``unshare`` or the right to mount, the one boot id is kept and ``notes`` says so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import subprocess
import uuid
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
    boot_ids: dict[str, str] = field(default_factory=dict)  # worker -> its host's boot id


BOOT_ID = "/proc/sys/kernel/random/boot_id"
# Bind-mounts the file "$0" over the boot id, then execs the command (its pid stays the same).
_MOUNT_BOOT_ID = f'mount --bind "$0" {BOOT_ID} && exec "$@"'


@dataclass(frozen=True)
class OwnBootHost:
    """``host``, but what runs there reads the boot id in ``boot_file``."""

    host: Host
    boot_file: Path

    @property
    def address(self) -> str:
        return self.host.address

    def wrap(self, argv: Sequence[str]) -> list[str]:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_BOOT_ID]
        return self.host.wrap([*cmd, str(self.boot_file), *argv])


def _own_boot_ids_work(root: Path) -> str | None:
    """None if a command can be given a boot id of its own here, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare"
    probe = root / "boot-id-probe"
    probe.write_text(str(uuid.uuid4()) + "\n")
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_BOOT_ID]
    done = subprocess.run([*cmd, str(probe), "cat", BOOT_ID], capture_output=True, text=True, check=False)
    if done.stdout != probe.read_text():
        return f"cannot mount over {BOOT_ID}: {done.stderr.strip()[:200]}"
    return None


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
        if importlib.util.find_spec("cryptography") is not None:  # specon.testing.certs needs it
            out.tls = tls_issued_earlier(root / "tls", hosts[0].address, ISSUED_BEFORE, preload)
        else:
            out.notes.append("no cryptography (a dev extra): plain HTTP between the hosts (--insecure-http)")
        out.links, out.tag = list(hosts), hosts.tag
        out.cluster_hosts = [hosts[0]]
        if why := _own_boot_ids_work(root):
            out.notes.append(f"one boot id for every host ({why}): a restore never supersedes a live copy")
        for worker, host, skew in zip(workers, hosts.hosts[1:], skews, strict=True):
            placed: Host = host
            if skew and preload:
                placed = SkewedHost(host, skew, tuple(preload))
                out.skews[worker] = skew
            if not why:
                boot = str(uuid.uuid4())
                (root / f"boot-id-{worker}").write_text(boot + "\n")
                placed = OwnBootHost(placed, root / f"boot-id-{worker}")
                out.boot_ids[worker] = boot
            out.cluster_hosts.append(placed)
        yield out
