"""Docker hosts in network hosts: one host per worker (no engine started here;
tests/docker/test_e2e_docker_hosts.py runs real ones)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from specon.embedded.docker_workers import DockerWorkers
from specon.model import WorkerId


class Host:
    address = "198.51.100.9"

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", "ns1", *argv]


def test_one_host_per_worker_or_nothing_is_started(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 workers need 2 hosts, got 1"):
        DockerWorkers.start(
            tmp_path / "e", tmp_path / "v", [WorkerId("w0"), WorkerId("w1")], 0.5, "n", hosts=[Host()]
        )
    assert not (tmp_path / "e").exists()
