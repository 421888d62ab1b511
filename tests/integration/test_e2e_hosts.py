"""Across network hosts: the manager and two agents each in a network namespace of their
own (198.51.100.0/24 on a test bridge), over TLS, moving a real converged job between them.
And the harness itself: it leaves no namespace, link or process behind, also after a failure
or when the process that made it was killed."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from specon.model import WorkerId
from specon.testing.net_hosts import LOCK, NetHosts, available, leftovers, sweep
from tests.hosts import cluster_on
from tests.integration.test_e2e_local import converged_job_moves_once_and_finishes_exactly

pytestmark = [pytest.mark.slow]

Hosts = Callable[[int], NetHosts]


async def test_a_converged_job_moves_between_two_agent_hosts_over_tls(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    hosts = net_hosts(3)
    async with cluster_on(hosts, tmp_path) as c:
        assert c.manager is not None and c.manager.url == f"https://{hosts[0].address}:7700"
        # Each daemon runs in its own host's namespace, listening on that host's address.
        for d, host in [
            (c.manager, hosts[0]),
            (c.agents[WorkerId("w0")], hosts[1]),
            (c.agents[WorkerId("w1")], hosts[2]),
        ]:
            assert host.holds(d.proc.pid), d.name
        # A host changes the network only: each agent budgets its jobs as on this machine.
        for w in c.workers:
            started = next(
                json.loads(line)
                for line in c.agents[w].log_path.read_text().splitlines()
                if "specon.agent.started" in line
            )
            assert started["enforcement"] == c.runtime(w).enforcement, started
        await converged_job_moves_once_and_finishes_exactly(c)
        st = await c.status()
        # The manager saw each agent at its own host's address.
        assert {w.id: w.address.split(":")[0] for w in st.workers} == {
            "w0": hosts[1].address,
            "w1": hosts[2].address,
        }


def test_hosts_reach_each_other_and_nothing_else(net_hosts: Hosts) -> None:
    hosts = net_hosts(2)
    server = hosts[0].popen(
        [sys.executable, "-m", "http.server", "--bind", hosts[0].address, "8000"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    fetch = textwrap.dedent(
        """
        import sys, time, urllib.request
        for _ in range(100):
            try:
                print(urllib.request.urlopen(sys.argv[1], timeout=3).status); break
            except OSError as exc:
                err = exc; time.sleep(0.1)
        else:
            print(type(err).__name__, err)
        """
    )
    url = f"http://{hosts[0].address}:8000/"
    assert hosts[1].run([sys.executable, "-c", fetch, url]).stdout.strip() == "200"
    # No route out of the bridge: this machine's own network is unreachable from a host.
    out = hosts[1].run([sys.executable, "-c", fetch.replace("range(100)", "range(1)"), "http://192.0.2.1:9/"])
    assert "unreachable" in out.stdout.lower(), out.stdout
    # A cut link partitions the host; mending it heals the partition.
    hosts[0].cut()
    assert hosts[0].is_cut()
    out = hosts[1].run([sys.executable, "-c", fetch.replace("range(100)", "range(1)"), url])
    assert out.stdout.strip() != "200"
    hosts[0].mend()
    assert hosts[1].run([sys.executable, "-c", fetch, url]).stdout.strip() == "200"
    assert server.poll() is None


def test_the_harness_removes_everything_also_after_a_failure() -> None:
    if why := available():
        pytest.skip(why)
    hosts = NetHosts(2)
    with pytest.raises(RuntimeError, match="a failing test"), hosts:
        sleeper = hosts[1].popen(["sleep", "600"])
        assert leftovers(hosts.tag)
        raise RuntimeError("a failing test")
    assert leftovers(hosts.tag) == []
    assert sleeper.poll() is not None  # the process it ran is gone too


def test_what_a_killed_run_left_behind_is_swept() -> None:
    if why := available():
        pytest.skip(why)
    # A process makes hosts, then dies by SIGKILL before it could clean up: once this test
    # holds the harnesses' lock, so no other harness (another xdist worker) sweeps it first.
    code = textwrap.dedent(
        """
        import os, signal, sys
        from specon.testing.net_hosts import NetHosts
        hosts = NetHosts(2)
        hosts.open()
        print(hosts.tag, flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    tag = proc.stdout.readline().strip()
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc.stdin.write("die\n")
        proc.stdin.flush()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == -9 and tag, err
        assert leftovers(tag), "the killed run should have left its namespaces"
        removed = sweep()
    assert leftovers(tag) == []
    assert any(name.startswith(tag) for name in removed)
