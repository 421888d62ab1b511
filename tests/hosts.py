"""Network hosts for tests: the ``net_hosts`` fixture over ``specon.testing.net_hosts``.

``net_hosts(3)`` gives three hosts with their own network namespace and address on a test
bridge (198.51.100.0/27 slots of TEST-NET-2), removed at the end of the test whatever
happened; it skips, saying why, only where namespaces cannot be made (not root, no ``ip``).
``tls_for(tmp_path, host)`` makes a throwaway CA and a certificate for ``host``'s address;
``cluster_on(hosts, tmp_path)`` is the end-to-end tests' embedded cluster on those hosts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specon.embedded.cluster import EmbeddedCluster, TlsFiles
from specon.testing.net_hosts import NetHost, NetHosts, available, leftovers


@pytest.fixture
def net_hosts() -> Iterator[Callable[[int], NetHosts]]:
    made: list[NetHosts] = []

    def make(count: int) -> NetHosts:
        if why := available():
            pytest.skip(f"separate network hosts need namespaces: {why}")
        hosts = NetHosts(count)
        made.append(hosts)
        hosts.open()
        return hosts

    yield make
    for hosts in made:
        hosts.close()
        assert not leftovers(hosts.tag), f"the harness left {leftovers(hosts.tag)} behind"


def tls_for(root: Path, host: NetHost) -> TlsFiles:
    """A CA of this test only, and the manager's certificate for ``host``'s address."""
    from specon.testing.certs import manager_tls  # noqa: PLC0415 - cryptography: a dev extra

    return manager_tls(root, host.address)


def certs_available() -> bool:
    """Whether certificates can be made here (``specon.testing.certs`` needs ``cryptography``,
    a dev extra): looked up, not imported."""
    return importlib.util.find_spec("cryptography") is not None


def tls_if_available(root: Path, host: NetHost) -> TlsFiles | None:
    """``tls_for``, or None (plain HTTP) without ``cryptography``."""
    return tls_for(root, host) if certs_available() else None


def cluster_on(hosts: NetHosts, root: Path, **options: Any) -> EmbeddedCluster:
    """The end-to-end tests' cluster on ``hosts``: the manager on the first over TLS, an agent
    of 0.5 CPU on each other one, the end-to-end policy (``test_e2e_local.POLICY``)."""
    from tests.integration.test_e2e_local import POLICY  # noqa: PLC0415 - a test module

    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    return EmbeddedCluster(
        root / "c",
        workers=len(hosts) - 1,
        cpus_per_worker=0.5,
        policy=policy,
        hosts=list(hosts),
        tls=tls_for(root, hosts[0]),
        **options,
    )
