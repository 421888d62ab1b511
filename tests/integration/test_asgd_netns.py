"""Real async SGD across network hosts: a parameter server and workers, each in a network
namespace of its own, exchanging tensors over TCP through the PS's ``tc``-limited link."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from specon.testing.net_hosts import NetHosts, links
from specon.workloads.asgd import link
from specon.workloads.asgd.measure import Case, run_job
from specon.workloads.asgd.mlp import Shape
from specon.workloads.asgd.profile import measured_throughput, service_times

pytestmark = [pytest.mark.slow]

Hosts = Callable[[int], NetHosts]
SHAPE = Shape(inputs=64, hidden=256, layers=2, outputs=10)  # 0.34 MB each way
CASE = Case("it", SHAPE, 32, link.Shaping(50))  # 50 Mbit/s: about 55 ms per transfer


def test_a_ps_and_two_workers_train_across_hosts_through_a_limited_link(
    net_hosts: Hosts, tmp_path: Path
) -> None:
    hosts = net_hosts(3)
    link.shape(hosts[0], CASE.shaping)
    down, up = link.limits(hosts[0])
    assert "tbf" in down and "rate 50Mbit" in down and "tbf" in up and "rate 50Mbit" in up
    assert "lat 5ms" in down and "lat 5ms" in up
    outer = link.outer_end(hosts[0])
    assert outer in links()

    run = run_job(list(hosts), CASE, 2, duration=3.0, logdir=tmp_path / "two")
    done = run.summary
    # Both workers' gradients were applied, the parameters moved, nobody failed.
    assert set(done["by_worker"]) == {"0", "1"} and min(done["by_worker"].values()) >= 5, done
    assert done["moved"] > 0 and not done["errors"], done
    updates = [r for r in run.ps if r.get("event") == "update"]
    assert {r["worker"] for r in updates} == {0, 1}
    assert max(r["staleness"] for r in updates) >= 1  # asynchronous: no barrier between workers
    assert all(len(rs) >= 5 for rs in run.per_worker)
    # Each process ran in its own host's namespace, and every one has exited.
    assert [len(h.processes) for h in hosts] == [1, 1, 1]
    assert all(p.returncode == 0 for h in hosts for p in h.processes)
    # The link is the bottleneck the limit makes it: 50 Mbit/s caps the PS at rate / size.
    cap = CASE.shaping.bytes_per_s / SHAPE.nbytes
    assert measured_throughput(run.ps, warmup=0.5).throughput < 1.1 * cap


def test_a_one_worker_profile_gives_four_positive_service_times(net_hosts: Hosts, tmp_path: Path) -> None:
    hosts = net_hosts(2)
    link.shape(hosts[0], CASE.shaping)
    run = run_job(list(hosts), CASE, 1, duration=2.5, logdir=tmp_path / "one")
    prof = service_times(run.ps, run.per_worker[0])
    t = prof.times
    assert min(t.worker, t.uplink, t.server, t.downlink) > 0
    # Each transfer takes at least what the limit allows for its bytes (the limit acts both ways).
    floor = 0.8 * SHAPE.nbytes / CASE.shaping.bytes_per_s
    assert t.uplink > floor and t.downlink > floor, t
    assert prof.samples >= 5


def _own_sysctl(name: str) -> str:
    return Path("/proc/sys", *name.split(".")).read_text().strip()


def test_the_harness_removes_the_limited_link_and_the_tcp_settings_with_its_hosts(tmp_path: Path) -> None:
    from specon.testing.net_hosts import available, namespaces  # noqa: PLC0415

    if why := available():
        pytest.skip(f"separate network hosts need namespaces: {why}")
    ours = {k: _own_sysctl(k) for k in link.TCP_SETTINGS}
    with NetHosts(2) as hosts:
        link.shape(hosts[0], CASE.shaping)
        outer = link.outer_end(hosts[0])
        for host in hosts:
            link.tune_tcp(host)
            link.tune_tcp(host, {"net.ipv4.tcp_slow_start_after_idle": "1"})  # a value that differs
            link.tune_tcp(host)
            assert all(link.sysctl(host, k) == v for k, v in link.TCP_SETTINGS.items())
        # Set in the hosts' namespaces only: this one's stay as they were.
        assert {k: _own_sysctl(k) for k in link.TCP_SETTINGS} == ours
        with pytest.raises(link.LinkError, match="no_such_sysctl"):
            link.tune_tcp(hosts[0], {"net.ipv4.no_such_sysctl": "1"})
        ns = [h.ns for h in hosts]
        ps = hosts[0].popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert ps.poll() is not None  # killed on close
    assert outer not in links()
    assert not set(ns) & set(namespaces())  # and the namespaces, their sysctls with them
    assert (
        subprocess.run(["tc", "qdisc", "show", "dev", outer], check=False, capture_output=True).returncode
        != 0
    )
