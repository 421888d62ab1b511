"""Network hosts for tests: the ``net_hosts`` fixture over ``specon.testing.net_hosts``.

``net_hosts(3)`` gives three hosts with their own network namespace and address on a test
bridge (198.51.100.0/27 slots of TEST-NET-2), removed at the end of the test whatever
happened; it skips, saying why, only where namespaces cannot be made (not root, no ``ip``).
``tls_for(tmp_path, host)`` makes a throwaway CA and a certificate for ``host``'s address.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specon.embedded.cluster import TlsFiles
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
    from specon.testing.certs import TestCA  # noqa: PLC0415 - cryptography: a dev extra

    ca = TestCA.create(root / "ca")
    cert, key = ca.issue(root / "manager-tls", names=[host.address])
    return TlsFiles(ca=ca.cert_path, cert=cert, key=key)
