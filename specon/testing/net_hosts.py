"""Separate network hosts on one machine, for tests and benchmarks: a Linux network
namespace per host, each with its own address on a test bridge.

``NetHosts(count)`` makes a bridge in this (the "operator's") namespace holding the
first address of a /27 of TEST-NET-2 (198.51.100.0/24), and ``count`` namespaces, each
joined to the bridge by a veth pair whose inner end is ``eth0`` with the next address.
A namespace has only its link-local route to the /27 and loopback: no default route, so
nothing it sends can leave the bridge (this machine's own network, 192.0.2.0/24, is never
used). Run what a host runs with ``host.run(argv)`` / ``host.popen(argv)`` (``ip netns
exec`` without its ``/sys`` remount), cut and restore its link with ``host.cut()`` / ``host.mend()``.

Everything is removed on ``close()`` (and on ``with`` exit, also after a failure):
every process still in a namespace is killed, the namespaces, veths and the bridge
deleted. Names carry the creating process's pid (``sp<pid36><n>...``): a later harness
sweeps what a killed run left behind. Concurrent harnesses (two test sessions) take
different /27 slots under a lock, so their routes never overlap.

The filesystem is not namespaced: the shared volume is a directory every host sees at
the same path, as NFS or CephFS would give a real lab (docs/docker-hosts.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

NETWORK = ipaddress.IPv4Network("198.51.100.0/24")
SLOT_PREFIX = 27  # 8 slots of 30 addresses: one per concurrent harness
LOCK = Path("/run/lock/specon-net-hosts.lock")
# sp + the creating pid in base 36 + "x" + a per-process counter; then the part's role.
_NAME = re.compile(r"^sp([0-9a-z]+)x([0-9a-z]+)(?:br|v\d+|h\d+)$")
_serial = itertools.count(1)  # several harnesses in one process get distinct names


class NetHostsUnavailableError(RuntimeError):
    """This machine cannot make network namespaces (not root, no ``ip``)."""


def _b36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def available() -> str | None:
    """None when namespaces can be made here, else why not (a reason to skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    try:
        subprocess.run(["ip", "-V"], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "no `ip` binary (iproute2)"
    return None


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def links() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    # "7: spabcx1v1@if6: <...>": the name before any "@peer".
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def leftovers(tag: str) -> list[str]:
    """The namespaces and links still named for the harness ``tag``: empty after close()."""
    return [n for n in [*namespaces(), *links()] if n.startswith(tag)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(ns: str) -> None:
    """SIGKILL every process left in namespace ``ns`` and wait until none is."""
    for _ in range(50):
        pids = [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def sweep() -> list[str]:
    """Remove the namespaces and links of harnesses whose process is gone (a killed run)."""
    removed = []
    for name in namespaces():
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1), 36)):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for name in links():
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1), 36)):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


def _slots_in_use() -> set[int]:
    """Which /27 slots of TEST-NET-2 some interface of this namespace already holds."""
    used: set[int] = set()
    for line in _ip("-o", "-4", "addr", "show", check=False).stdout.splitlines():
        m = re.search(r"inet (\d+\.\d+\.\d+\.\d+)/", line)
        if m and ipaddress.IPv4Address(m.group(1)) in NETWORK:
            used.add((int(ipaddress.IPv4Address(m.group(1))) - int(NETWORK.network_address)) >> 5)
    return used


@dataclass(slots=True)
class NetHost:
    """One host: namespace ``ns``, reachable at ``address`` from the bridge and the others."""

    name: str
    ns: str
    address: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host's network namespace, and nothing else's: ``nsenter``
        execs it (the pid, and its signals, are its own) and, unlike ``ip netns exec``, does
        not remount ``/sys``, so the cgroup tree (CPU budgets, engines) stays in view."""
        return ["nsenter", f"--net=/run/netns/{self.ns}", "--", *argv]

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` runs in this host's network namespace (by inode)."""
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{self.ns}").st_ino

    def popen(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.wrap(argv), **kwargs)  # type: ignore[call-overload]
        self.processes.append(proc)
        return proc

    def run(self, argv: Sequence[str], *, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.wrap(argv), capture_output=True, text=True, timeout=timeout, check=False)

    def cut(self) -> None:
        """Take the host's link down: a partition between it and every other host."""
        _ip("-n", self.ns, "link", "set", "eth0", "down")

    def mend(self) -> None:
        """Bring the link back up."""
        _ip("-n", self.ns, "link", "set", "eth0", "up")

    def is_cut(self) -> bool:
        return "state DOWN" in _ip("-n", self.ns, "-o", "link", "show", "eth0").stdout


class NetHosts:
    """``with NetHosts(3) as hosts: hosts[0].address`` ... everything removed on exit."""

    def __init__(self, count: int, *, names: Sequence[str] | None = None) -> None:
        if count < 1 or count > 29:
            raise ValueError("between 1 and 29 hosts per harness")
        if names is not None and len(names) != count:
            raise ValueError("one name per host")
        self.tag = f"sp{_b36(os.getpid())}x{_b36(next(_serial))}"
        self.bridge = f"{self.tag}br"
        self._count = count
        self._names = list(names) if names is not None else [f"h{i}" for i in range(count)]
        self.hosts: list[NetHost] = []
        self.gateway = ""
        self._made = False

    def __enter__(self) -> NetHosts:
        self.open()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __getitem__(self, i: int) -> NetHost:
        return self.hosts[i]

    def __iter__(self) -> Iterator[NetHost]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def open(self) -> None:
        if why := available():
            raise NetHostsUnavailableError(why)
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits for a concurrent harness's allocation
            sweep()
            free = sorted(set(range(2 ** (SLOT_PREFIX - NETWORK.prefixlen))) - _slots_in_use())
            if not free:
                raise NetHostsUnavailableError("every 198.51.100.0/27 slot is taken by another harness")
            subnet = list(NETWORK.subnets(new_prefix=SLOT_PREFIX))[free[0]]
            addrs = [str(a) for a in subnet.hosts()]
            self._made = True
            try:
                self._build(addrs, subnet.prefixlen)
            except BaseException:
                self.close()
                raise

    def _build(self, addrs: list[str], plen: int) -> None:
        self.gateway = addrs[0]
        # Bridged frames skip iptables: a FORWARD policy of DROP (set by some engine) must not
        # cut the hosts apart.
        _ip("link", "add", self.bridge, "type", "bridge", "nf_call_iptables", "0", "nf_call_ip6tables", "0")
        _ip("addr", "add", f"{self.gateway}/{plen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self._names, start=1):
            ns, outer, inner = f"{self.tag}h{i}", f"{self.tag}v{i}", f"{self.tag}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("-n", ns, "link", "set", inner, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{addrs[i]}/{plen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            self.hosts.append(NetHost(name, ns, addrs[i]))

    def close(self) -> None:
        """Kill what runs in the hosts, delete namespaces, veths and the bridge. Idempotent."""
        if not self._made:
            return
        for host in self.hosts:
            for proc in host.processes:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        for name in namespaces():
            if name.startswith(self.tag):
                _kill_inside(name)
                _ip("netns", "del", name, check=False)
        for name in links():  # veth ends die with their namespace; the bridge and strays here
            if name.startswith(self.tag):
                _ip("link", "del", name, check=False)
        self.hosts.clear()
        self._made = False
