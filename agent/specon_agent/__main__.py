"""``specon-agent`` / ``python -m specon_agent``: run the specon node agent for one worker."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import ssl
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import structlog
from aiohttp import web
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from specon.argtypes import positive_float
from specon.config import PolicyError, default_policy, load_policy
from specon.daemon import logs
from specon.daemon.cli_args import (
    WeakTokenError,
    add_managed_pod_options,
    check_token_strength,
    ip_address,
    load_settings,
    missing_extra,
    read_token,
    split_listen,
)
from specon.daemon.manager_url import InsecureURLError, check_manager_url
from specon.daemon.settings import AgentSettings
from specon.daemon.tls import TLSConfigError, client_context
from specon.model import WorkerId
from specon.runtime.base import Runtime
from specon.runtime.gpu.nvml import NvmlReader
from specon.runtime.kubernetes.steering import PLACEMENT_DEADLINE_S
from specon.runtime.local.backend import LocalRuntime
from specon_agent.app import REGISTRY, create_app
from specon_agent.client import FileToken, ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon

log = structlog.get_logger()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specon-agent",
        description="The specon node agent: finds its worker's training containers, tails their progress "
        "logs, classifies them every interval (Algorithm 1), heartbeats the manager and executes its "
        "save/start "
        "commands. Serves /healthz and /metrics.",
        epilog="Operational settings (poll wait, backoff, timeouts) come from SPECON_AGENT_* environment "
        "variables; see docs/reference.md (specon config reference).",
    )
    p.add_argument(
        "--manager",
        default="http://127.0.0.1:7700",
        metavar="URL",
        help="the manager's base URL (default http://127.0.0.1:7700): https://HOST:PORT for a manager "
        "on another host; http:// only on loopback (127.0.0.0/8, ::1, localhost) unless --insecure-http",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="PEM file of the CA certificate(s) an https:// manager's certificate must chain to "
        "(default: the system trust store); its host name is checked too",
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="allow an http:// manager that is not on loopback: the bearer token then crosses the "
        "network in clear text. Only on a network you trust; prefer https (docs/tls.md)",
    )
    p.add_argument(
        "--source-address",
        type=ip_address,
        metavar="ADDR",
        help="bind requests to the manager to this local IP address (default: none, the kernel "
        "picks the route's own)",
    )
    p.add_argument(
        "--worker", help="this worker's id (required with --runtime local; kubernetes: the node name)"
    )
    p.add_argument(
        "--listen",
        type=split_listen,
        default=("127.0.0.1", 7701),
        metavar="HOST:PORT",
        help="address for /healthz and /metrics (default 127.0.0.1:7701); it does not bind requests "
        "to the manager (see --source-address)",
    )
    p.add_argument(
        "--runtime",
        choices=("local", "docker", "kubernetes"),
        default="local",
        help="container backend: local = processes in a CPU-budgeted cgroup (default); docker = the "
        "containers labelled specon.io/managed=true on one Docker engine (--docker-host); kubernetes = "
        "the managed pods bound to --node",
    )
    p.add_argument(
        "--volume",
        type=Path,
        required=True,
        help="the persistent volume: job specs, progress logs and checkpoints",
    )
    p.add_argument(
        "--cpus", type=float, default=1.0, help="this worker's CPU budget in cores (local runtime)"
    )
    p.add_argument("--cluster", default="default", help="cgroup namespace for this cluster's workers")
    p.add_argument(
        "--warm",
        action="store_true",
        help="local runtime: fork jobs of the built-in workloads (python -m specon.workloads) from an "
        "interpreter that imported torch once, instead of paying the imports on every start and restore",
    )
    p.add_argument(
        "--gpu-standby",
        choices=("auto", "off"),
        default="off",
        help="local runtime: keep one primed interpreter per GPU NVML finds (torch imported, CUDA "
        "initialised, one step of each kind taken) that becomes the next one-GPU job of the built-in "
        "workloads started here, a restore in a fraction of a second instead of 10-15 s (default off)",
    )
    dock = p.add_argument_group("docker runtime")
    dock.add_argument(
        "--docker-host",
        default=os.environ.get("DOCKER_HOST"),
        metavar="URL",
        help="the engine's API, e.g. unix:///var/run/docker.sock (default $DOCKER_HOST, else the local one)",
    )
    dock.add_argument(
        "--allow-bind",
        action="append",
        default=[],
        metavar="PREFIX",
        help="host path prefix a job's container may bind read-only (repeatable; default: none). Only the "
        "job's own directory on --volume is ever writable",
    )
    dock.add_argument(
        "--allow-host-network", action="store_true", help="let jobs use network_mode host (default: none)"
    )
    dock.add_argument(
        "--allow-image",
        action="append",
        default=[],
        metavar="IMAGE",
        help="an image jobs may run (repeatable; default: any image present on the engine)",
    )
    dock.add_argument(
        "--docker-allow-gpus",
        type=int,
        default=0,
        metavar="N",
        help="GPUs one job's container may request here (docker run --gpus N, N at most this; the NVIDIA "
        "container toolkit needed), and what this host offers placement. Default 0: every GPU device "
        "request is refused",
    )
    dock.add_argument(
        "--docker-standby-image",
        action="append",
        default=[],
        metavar="IMAGE[=PYTHON]",
        help="keep a primed standby container of IMAGE per GPU NVML finds (--gpu auto, --docker-allow-gpus "
        ">= 1; IMAGE subject to --allow-image) that becomes the next one-GPU job of the built-in workloads "
        "run as 'PYTHON -m specon.workloads' (default PYTHON python3): a restore in a fraction of a second "
        "instead of 10-15 s. Repeatable; one PYTHON for all",
    )
    k8s = p.add_argument_group("kubernetes runtime")
    k8s.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node's name (default $NODE_NAME)"
    )
    k8s.add_argument(
        "--namespace",
        action="append",
        help="manage the pods of this namespace (repeat for each training namespace); default: every "
        "namespace, which needs a credential that may list every pod of the cluster",
    )
    add_managed_pod_options(k8s)
    k8s.add_argument(
        "--pod-writes",
        choices=("manager", "self"),
        default="manager",
        help="who writes the managed pods and their restore records (records, evictions, copies, "
        "deletions, annotations): manager = the manager's pod broker (its --manage-pods), so this "
        "agent's credential only reads the pods of its --namespace(s) and gets its node, and the "
        "manager counts the node's other pods (default); self = this agent's own credential, which "
        "then also lists the node's other pods and watches its node (one identity for everything: a "
        "test cluster)",
    )
    k8s.add_argument(
        "--placement-deadline",
        type=positive_float,
        default=PLACEMENT_DEADLINE_S,
        metavar="SECONDS",
        help="how long a restored copy may wait for kube-scheduler to place it on this node before "
        "it is withdrawn and the move rolls back, with the scheduler's reason (default "
        f"{PLACEMENT_DEADLINE_S:g}; keep it below the policy's migration.restore_timeout)",
    )
    k8s.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, then ~/.kube/config)")
    p.add_argument(
        "--policy", type=Path, help="policy YAML (apiVersion specon/v1alpha1); default: SPEC defaults"
    )
    p.add_argument(
        "--gpu",
        choices=("auto", "off"),
        default="auto",
        help="read this worker's NVIDIA GPUs through NVML (the specon[gpu] extra) and report them: auto "
        "(default: where NVML answers; without the extra, a driver or a GPU the agent runs as without "
        "GPUs) or off",
    )
    p.add_argument(
        "--gpu-device-metrics",
        action="store_true",
        help="also export each GPU's utilisation and memory under the DCGM exporter's names "
        "(DCGM_FI_DEV_*), for nodes without dcgm-exporter; off by default, where it runs they "
        "would be counted twice. Per-job GPU series are always exported",
    )
    p.add_argument(
        "--token-file",
        help="file holding this agent's bearer token (its own, from the manager's --agent-tokens; or the "
        "shared token; default: $SPECON_TOKEN). Re-read when it changes (a projected ServiceAccount "
        "token rotates). At least 32 bytes",
    )
    p.add_argument(
        "--state-dir", type=Path, help="where monitor states persist (default <volume>/agents/<worker>)"
    )
    p.add_argument(
        "--taints-file",
        type=Path,
        help="taints this host announces, one key[=value]:Effect a line, re-read when it changes: a "
        "reclaim-notice hook writes e.g. specon.io/evacuate:NoSchedule and the manager drains the "
        "worker (recovery.evacuate_taints)",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default info)")
    p.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log rendering (default json)"
    )
    return p


class TLSErrorCollector(Collector):
    """``specon_agent_tls_errors_total``: failed handshakes with the manager."""

    def __init__(self, client: ManagerClient) -> None:
        self.client = client

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(
            "specon_agent_tls_errors",
            "Exchanges with the manager that failed in the TLS handshake (see specon.agent.tls_error)",
            value=self.client.tls_errors,
        )


def manager_link(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The TLS context for ``--manager`` (None for http://), or ``InsecureURLError`` /
    ``TLSConfigError`` saying why the agent must not start: checked before anything
    connects, so a refused URL is never sent a byte."""
    scheme = check_manager_url(args.manager, insecure_http=args.insecure_http)
    if scheme != "https":
        if args.ca_file is not None:
            raise TLSConfigError(f"--ca-file is for an https:// manager, and --manager is {args.manager}")
        return None
    try:
        return client_context(args.ca_file)
    except TLSConfigError as exc:
        raise TLSConfigError(f"--ca-file: {exc}") from exc


def standby_gpus(gpus: NvmlReader | None) -> tuple[int, ...]:
    """The GPUs to keep a standby interpreter for: every one NVML finds (their indexes are CUDA's
    in PCI bus order, which the standby sets); none without NVML (logged)."""
    reading = gpus.read() if gpus is not None else None
    if reading is None or not reading.devices:
        log.info("specon.agent.gpu_standby_off", reason="no GPU found through NVML")
        return ()
    return tuple(sorted(d.index for d in reading.devices))


async def run(args: argparse.Namespace) -> int:
    try:
        link = manager_link(args)
    except (InsecureURLError, TLSConfigError) as exc:
        print(f"specon-agent: {exc}", file=sys.stderr)
        return 2
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
    except (PolicyError, OSError) as exc:
        print(f"specon-agent: {exc}", file=sys.stderr)
        return 2
    settings = load_settings(AgentSettings, "specon-agent")
    if settings is None:
        return 2
    # From a file, re-read when it changes (a projected ServiceAccount token rotates).
    token: str | FileToken = FileToken(args.token_file, check=check_token_strength) if args.token_file else ""
    try:
        first = token() if isinstance(token, FileToken) else read_token(None)
        if not first:
            print("specon-agent: no token: pass --token-file or set SPECON_TOKEN", file=sys.stderr)
            return 2
        check_token_strength(first)
    except WeakTokenError as exc:
        print(f"specon-agent: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"specon-agent: cannot read the token file: {exc}", file=sys.stderr)
        return 2
    token = token or first
    host, port = args.listen
    gpus = NvmlReader() if args.gpu == "auto" else None
    client = ManagerClient(
        args.manager,
        token,
        source_address=args.source_address,
        ssl_context=link,
        insecure_http=args.insecure_http,
    )
    runtime: Runtime
    if args.runtime == "kubernetes":
        if not args.node:
            print("specon-agent: --runtime kubernetes needs --node or $NODE_NAME", file=sys.stderr)
            return 2
        if missing := missing_extra("kubernetes", "kubernetes", "--runtime kubernetes"):
            print(f"specon-agent: {missing}", file=sys.stderr)
            return 2
        # Imported here only: the client is heavy and only this backend needs it.
        from specon.runtime.kubernetes.backend import KubernetesRuntime, load_api_client  # noqa: PLC0415
        from specon.runtime.kubernetes.broker import BrokerWriter  # noqa: PLC0415
        from specon_agent.k8s_pod_writes import manager_sender  # noqa: PLC0415

        try:
            api = load_api_client(args.kubeconfig)
        except Exception as exc:  # the client raises several unrelated types for a bad config
            print(f"specon-agent: no Kubernetes configuration: {exc}", file=sys.stderr)
            return 2
        by_manager = args.pod_writes == "manager"
        runtime = KubernetesRuntime(
            api,
            args.node,
            volume_root=args.volume,
            namespaces=tuple(args.namespace or ()),
            selector=args.selector,
            claim=args.claim,
            host_path=args.host_path,
            include_owned=args.include_owned,
            placement_deadline=args.placement_deadline,
            writer=BrokerWriter(manager_sender(client), WorkerId(args.node)) if by_manager else None,
            # With the manager writing, the agent's credential only reads its namespaces' pods
            # and gets its node: the manager counts the node's other pods.
            watch_node=not by_manager,
            count_others=not by_manager,
        )
    elif args.runtime == "docker":
        if not args.worker:
            print("specon-agent: --runtime docker needs --worker", file=sys.stderr)
            return 2
        if missing := missing_extra("docker", "docker", "--runtime docker"):
            print(f"specon-agent: {missing}", file=sys.stderr)
            return 2
        from specon.runtime.docker.backend import DockerRuntime, connect  # noqa: PLC0415
        from specon.runtime.docker.recipe import HostRules  # noqa: PLC0415
        from specon.runtime.docker.standby import StandbyConfig  # noqa: PLC0415

        standby = None
        if args.docker_standby_image:
            images = tuple(i.partition("=")[0] for i in args.docker_standby_image)
            pythons = {i.partition("=")[2] or "python3" for i in args.docker_standby_image}
            if len(pythons) != 1 or not all(images):
                print(
                    "specon-agent: --docker-standby-image: IMAGE[=PYTHON], one PYTHON for all",
                    file=sys.stderr,
                )
                return 2
            gpu_indexes = standby_gpus(gpus) if args.docker_allow_gpus >= 1 else ()
            standby = StandbyConfig(images=images, gpus=gpu_indexes, python=pythons.pop())

        # The product a GPU job first started here keeps to (unless it allows any): NVML's.
        seen = gpus.read() if gpus is not None else None
        try:
            runtime = DockerRuntime(
                args.volume,
                WorkerId(args.worker),
                connect(args.docker_host),
                rules=HostRules(
                    volume=str(args.volume.resolve()),
                    ro_bind_prefixes=tuple(args.allow_bind),
                    host_network=args.allow_host_network,
                    images=tuple(args.allow_image),
                    gpus=args.docker_allow_gpus,
                ),
                migration_mode=policy.migration.mode,
                gpu_product=seen.devices[0].name if seen and seen.devices else None,
                standby=standby,
            )
        except Exception as exc:  # the SDK raises several types for an engine it cannot reach
            print(f"specon-agent: cannot use the Docker engine: {exc}", file=sys.stderr)
            return 2
    elif args.worker:
        runtime = LocalRuntime(
            args.volume,
            WorkerId(args.worker),
            args.cpus,
            cluster=args.cluster,
            per_container_usage=False,
            warm=args.warm,
            standby_gpus=standby_gpus(gpus) if args.gpu_standby == "auto" else (),
        )
    else:
        print("specon-agent: --runtime local needs --worker", file=sys.stderr)
        return 2
    worker = runtime.worker
    state_dir = args.state_dir or args.volume / "agents" / worker
    state_dir.mkdir(parents=True, exist_ok=True)
    agent = Agent(
        runtime=runtime,
        policy=policy,
        address=f"{host}:{port}",
        state_file=state_dir / "monitor.json",
        settings=settings,
        gpus=gpus,
        taints_file=args.taints_file,
    )
    daemon = AgentDaemon(agent, client)
    app = create_app(daemon, gpu_device_metrics=args.gpu_device_metrics)
    app[REGISTRY].register(TLSErrorCollector(client))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "specon.agent.started",
        worker=worker,
        listen=f"{host}:{port}",
        manager=args.manager,
        tls=link is not None,
        source_address=args.source_address,
        runtime=args.runtime,
        enforcement=getattr(runtime, "enforcement", args.runtime),
        cpus=args.cpus,
    )
    daemon.start()
    await stop.wait()
    log.info("specon.agent.stopping", worker=worker)
    await daemon.stop()
    await runner.cleanup()
    agent.gpus.close()  # nvmlShutdown
    # Jobs keep running: an agent restart must not cost them anything.
    with contextlib.suppress(Exception):
        runtime.close()
    log.info("specon.agent.stopped", worker=worker)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
