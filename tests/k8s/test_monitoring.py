"""``manifests/components/monitoring``: the Prometheus Operator objects render with the rest
and point at the daemons' real ports and labels; every series the alerts read is one a
daemon serves; the rules pass ``promtool check rules`` and fire exactly when they should
(``promtool test rules``). promtool comes from this machine's Debian release
(scripts/install-promtool.sh); the promtool tests skip where it cannot be had."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from specon_agent.app import create_app as agent_app
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon
from specon_manager.app import create_app as manager_app
from specon_manager.leader import ElectionMetrics

from specon.model import Resources
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume
from tests.k8s.test_manifests import MANIFESTS, ROOT, by_kind, render
from tests.unit.manager_fakes import FakeClock as ManagerClock
from tests.unit.manager_fakes import policy, shell


@pytest.fixture(scope="module")
def promtool() -> str:
    got = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-promtool.sh")], capture_output=True, text=True, check=False
    )
    if got.returncode == 3:
        pytest.skip(f"no promtool here: {got.stderr.strip()}")
    assert got.returncode == 0, got.stderr
    return got.stdout.strip()


def with_monitoring(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    rel = os.path.relpath(MANIFESTS, tmp_path)  # kustomize takes relative paths only
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{rel}]\ncomponents: [{rel}/components/monitoring]\n"
    )
    return by_kind(render(tmp_path))


def alert_rules(tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The PrometheusRule's alerts by name; its groups written to ``rules.yaml`` for promtool."""
    (rule,) = with_monitoring(tmp_path)["PrometheusRule"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_the_monitors_scrape_the_daemons_ports_by_their_labels(tmp_path: Path) -> None:
    docs = with_monitoring(tmp_path)
    (svc_monitor,) = docs["ServiceMonitor"]
    (pod_monitor,) = docs["PodMonitor"]
    (service,) = [s for s in docs["Service"] if s["metadata"]["name"] == "specon-manager"]
    (agent,) = docs["DaemonSet"]
    assert svc_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in svc_monitor["spec"]["endpoints"]] == [
        p["name"] for p in service["spec"]["ports"]
    ]
    # The manager serves TLS (manifests/ has components/tls): scraped over https, verified
    # against the CA in the Secret the manager's pod mounts its certificate from.
    (endpoint,) = svc_monitor["spec"]["endpoints"]
    (manager,) = docs["Deployment"]
    secrets = {
        v["secret"]["secretName"] for v in manager["spec"]["template"]["spec"]["volumes"] if "secret" in v
    }
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["ca"]["secret"]["name"] in secrets
    assert endpoint["tlsConfig"]["serverName"] == f"{service['metadata']['name']}.specon.svc"
    pod_labels = agent["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for c in agent["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]} <= ports
    for d in (svc_monitor, pod_monitor, *docs["PrometheusRule"]):
        assert d["metadata"]["namespace"] == "specon"
    # The base alone has none of it (the CRDs may not exist on a cluster).
    assert not {"ServiceMonitor", "PodMonitor", "PrometheusRule"} & by_kind(render(MANIFESTS)).keys()


async def served_names(tmp_path: Path) -> set[str]:
    """Every metric family name the manager (its HA gauges too) and an agent serve."""
    names: set[str] = set()
    sh = shell(tmp_path, ManagerClock())
    async with TestClient(TestServer(manager_app(sh, token="t" * 32, tick=False))) as client:
        names |= {f.name for f in text_string_to_metric_families(await (await client.get("/metrics")).text())}
    ElectionMetrics(registry := CollectorRegistry())
    names |= {m.name for m in registry.collect()}
    volume = FakeVolume(FakeClock(1000.0), root=tmp_path / "volume")
    agent = Agent(runtime=FakeRuntime("w0", volume, capacity=Resources(cpu=2.0)), policy=policy())
    daemon = AgentDaemon(agent, ManagerClient("http://127.0.0.1:9", "unused"))
    async with TestClient(TestServer(agent_app(daemon))) as client:
        names |= {f.name for f in text_string_to_metric_families(await (await client.get("/metrics")).text())}
    return names


async def test_every_series_an_alert_reads_is_served(tmp_path: Path) -> None:
    served = await served_names(tmp_path)
    for name, rule in alert_rules(tmp_path).items():
        used = set(re.findall(r"\bspecon_[a-z_]+", rule["expr"]))
        assert used, name
        # A counter's samples end in _total; its family is named without.
        missing = {u for u in used if u not in served and u.removesuffix("_total") not in served}
        assert not missing, (name, missing)


def test_the_rules_pass_promtool_check(tmp_path: Path, promtool: str) -> None:
    alert_rules(tmp_path)
    got = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr


def fired(rule: dict[str, Any], labels: dict[str, str], pod: str = "") -> dict[str, Any]:
    """What promtool should see of ``rule`` firing with ``labels`` (besides its own)."""
    notes = {k: v.replace("{{ $labels.pod }}", pod) for k, v in rule["annotations"].items()}
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": notes}


def test_the_alerts_fire_when_they_should_and_only_then(tmp_path: Path, promtool: str) -> None:
    rules = alert_rules(tmp_path)
    no_leader, agents = rules["SpeconNoLeader"], rules["SpeconAgentsNotReporting"]
    failing, journal = rules["SpeconMigrationsFailing"], rules["SpeconJournalWriteErrors"]
    manager, agent = 'job="specon-manager"', "job='specon/specon-agent'"

    def case(series: dict[str, str], checks: list[tuple[str, str, list[dict[str, Any]]]]) -> dict[str, Any]:
        return {
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [{"eval_time": t, "alertname": a, "exp_alerts": e} for t, a, e in checks],
        }

    tests = [
        # One manager, up, no election: no alert. Down for 2 minutes: one.
        case({f"up{{{manager}, pod='m'}}": "1x10"}, [("10m", "SpeconNoLeader", [])]),
        case({f"up{{{manager}, pod='m'}}": "0x10"}, [("1m", "SpeconNoLeader", []),
                                                     ("4m", "SpeconNoLeader", [fired(no_leader, {})])]),
        # Two replicas up, one leads: none; neither leads: one.
        case({f"up{{{manager}, pod='a'}}": "1x10", f"up{{{manager}, pod='b'}}": "1x10",
              f"specon_manager_leader{{{manager}, pod='a'}}": "1x10",
              f"specon_manager_leader{{{manager}, pod='b'}}": "0x10"}, [("10m", "SpeconNoLeader", [])]),
        case({f"up{{{manager}, pod='a'}}": "1x10", f"up{{{manager}, pod='b'}}": "1x10",
              f"specon_manager_leader{{{manager}, pod='a'}}": "0x10",
              f"specon_manager_leader{{{manager}, pod='b'}}": "0x10"},
             [("4m", "SpeconNoLeader", [fired(no_leader, {})])]),
        # No manager scraped at all.
        case({"up{job='other'}": "1x10"},
             [("5m", "SpeconNoLeader", [fired(no_leader, {"job": "specon-manager"})])]),
        # An agent that lost the manager for 5 minutes, one that does not answer scrapes.
        case({f"specon_agent_manager_up{{{agent}, pod='a1', instance='10.0.0.1:7701'}}": "1 0x12",
              f"specon_agent_manager_up{{{agent}, pod='a2', instance='10.0.0.2:7701'}}": "1x12",
              f"up{{{agent}, pod='a3', instance='10.0.0.3:7701'}}": "0x12"},
             [("3m", "SpeconAgentsNotReporting", []),
              ("7m", "SpeconAgentsNotReporting", [
                  fired(agents, {"pod": "a1", "instance": "10.0.0.1:7701"}, "a1"),
                  fired(agents, {"job": "specon/specon-agent", "pod": "a3",
                                 "instance": "10.0.0.3:7701"}, "a3"),
              ])]),
        # Migrations: one a minute, all rolled back -> alert; all done -> none; too few -> none.
        case({"specon_manager_migrations_total{result='rolled_back', reason='converged'}": "0+1x90",
              "specon_manager_migrations_total{result='done', reason='converged'}": "0x90"},
             [("80m", "SpeconMigrationsFailing", [fired(failing, {})])]),
        case({"specon_manager_migrations_total{result='rolled_back', reason='converged'}": "0x90",
              "specon_manager_migrations_total{result='done', reason='converged'}": "0+1x90"},
             [("80m", "SpeconMigrationsFailing", [])]),
        case({"specon_manager_migrations_total{result='rolled_back', reason='converged'}": "0x30 1x30 2x30",
              "specon_manager_migrations_total{result='done', reason='converged'}": "0x90"},
             [("80m", "SpeconMigrationsFailing", [])]),
        # Journal writes failing for a while, then a manager that writes again.
        case({f"specon_manager_journal_failures_total{{{manager}, pod='m'}}": "0 0 1+1x20 21x30"},
             [("10m", "SpeconJournalWriteErrors", [fired(journal, {"job": "specon-manager", "pod": "m"})]),
              ("45m", "SpeconJournalWriteErrors", [])]),
    ]  # fmt: skip
    spec = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(spec))
    got = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert got.returncode == 0, got.stdout + got.stderr
