"""``specon-manager`` / ``python -m specon_manager``: run the specon manager daemon."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import structlog
from aiohttp import web

from specon.argtypes import non_negative_int
from specon.config import Policy, PolicyError, default_policy, load_policy
from specon.daemon import logs
from specon.daemon.cli_args import (
    add_managed_pod_options,
    check_token_strength,
    load_settings,
    missing_extra,
    read_token,
    split_listen,
)
from specon.daemon.manager_url import is_loopback
from specon.daemon.settings import ManagerSettings
from specon.daemon.tls import ReloadCollector, ServerCertificate, TLSConfigError
from specon.runtime.kubernetes.admission import MAX_PREFERRED
from specon_manager import standby
from specon_manager.app import METRICS, Extension, NodeRequests, create_app
from specon_manager.app import PodBroker as PodBrokerLike
from specon_manager.auth import Authenticator, Chain, StaticTokens, load_agent_tokens
from specon_manager.fronts import CONFIG_ENV, Listening, become_front, config_digest, serve_fronts, socket_dir
from specon_manager.journal import Journal, JournalStore
from specon_manager.lease import Timing
from specon_manager.shell import ManagerShell

log = structlog.get_logger()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specon-manager",
        description="The specon manager: collects agent heartbeats, decides migrations (Algorithm 2) and "
        "rebalancing (Algorithm 3), journals them, and serves /v1/status, /, /metrics and /healthz.",
        epilog="Operational settings (ticker period, poll hold, status cache and page sizes) come from "
        "SPECON_MANAGER_* environment variables; see docs/reference.md (specon config reference).",
    )
    p.add_argument(
        "--listen",
        type=split_listen,
        default=("127.0.0.1", 7700),
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:7700)",
    )
    p.add_argument(
        "--policy", type=Path, help="policy YAML (apiVersion specon/v1alpha1); default: SPEC defaults"
    )
    p.add_argument(
        "--agent-tokens",
        type=Path,
        metavar="FILE",
        help="YAML mapping 'worker id: token', one token per agent: a token speaks only for its own "
        "worker (403 otherwise). Recommended; see docs/safety.md, Security model",
    )
    p.add_argument(
        "--agent-auth",
        choices=("tokens", "kubernetes"),
        default="tokens",
        help="how agents prove who they are: tokens = --agent-tokens/--token-file (default); kubernetes = "
        "each agent pod's projected ServiceAccount token, checked by TokenReview and bound to the node "
        "its pod runs on (its worker id)",
    )
    p.add_argument(
        "--agent-auth-audience",
        default="specon-manager",
        help="with --agent-auth kubernetes: the audience the agents' tokens are minted for "
        "(default specon-manager)",
    )
    p.add_argument(
        "--agent-service-account",
        default=f"{os.environ.get('POD_NAMESPACE', 'specon')}/specon-agent",
        metavar="NS/NAME",
        help="with --agent-auth kubernetes: the agents' ServiceAccount (default $POD_NAMESPACE/specon-agent)",
    )
    p.add_argument(
        "--token-file",
        help="file holding a shared bearer token that speaks for every worker (single-tenant setups; "
        "default: $SPECON_TOKEN). At least 32 bytes",
    )
    p.add_argument(
        "--read-token-file",
        help="file holding a read-only token: with it, GET /v1/status and / need this token (or the "
        "shared one); without it they are open",
    )
    p.add_argument(
        "--operator-token-file",
        help="file holding the operator token: it may drain and uncordon workers (specon drain) and "
        "read the status; without it nobody may drain. At least 32 bytes",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=Path("specon-state"),
        help="directory for the migration journal (default ./specon-state)",
    )
    p.add_argument(
        "--journal",
        choices=("sqlite", "kubernetes"),
        default="sqlite",
        help="where migrations and marks are journaled: sqlite = <state-dir>/journal.db (default); "
        "kubernetes = ConfigMaps in --journal-namespace, so a manager restarted on any node recovers",
    )
    p.add_argument(
        "--journal-namespace",
        default=os.environ.get("POD_NAMESPACE", "specon"),
        help="namespace of the kubernetes journal (default $POD_NAMESPACE, else specon)",
    )
    p.add_argument(
        "--kubeconfig",
        help="kubeconfig for the kubernetes journal and --agent-auth kubernetes (default: in-cluster)",
    )
    p.add_argument("--dry-run", action="store_true", help="decide and record, but never touch a container")
    _pod_options(p)
    _election_options(p)
    tls = p.add_argument_group("TLS (docs/tls.md)")
    tls.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate chain (the manager's certificate first; its "
        "subjectAltName must hold the host name or address agents use in --manager). With --tls-key; "
        "both are re-read when they change (SPECON_MANAGER_TLS_RELOAD_INTERVAL)",
    )
    tls.add_argument(
        "--tls-key",
        type=Path,
        metavar="FILE",
        help="the certificate's private key (PEM, unencrypted, readable by the manager only)",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning, error (default info)")
    p.add_argument(
        "--log-format", choices=("json", "console"), default="json", help="log rendering (default json)"
    )
    p.add_argument(
        "--fronts",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="serve --listen from N front processes (SO_REUSEPORT) that do TLS, HTTP, authentication, "
        "decoding and the checks of heartbeats, and pass them to this process, which decides "
        "(default 0: this process alone; see docs/architecture.md, Past one core)",
    )
    # Internal (set by --fronts): run as a front of the decider whose sockets are in DIR,
    # serving the listening sockets it handed over as file descriptors FD (one per address).
    p.add_argument("--front-of", type=Path, metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument(
        "--front-socket", type=non_negative_int, action="append", metavar="FD", help=argparse.SUPPRESS
    )
    return p


def _config_digest(args: argparse.Namespace, policy: Policy) -> str:
    token_files = (args.agent_tokens, args.token_file, args.read_token_file, args.operator_token_file)
    return config_digest(policy, token_files)


def _serve_front(
    args: argparse.Namespace,
    policy: Policy,
    settings: ManagerSettings,
    auth: Authenticator,
    tls: ServerCertificate | None,
) -> int:
    """Run this process as a front of the decider (``specon_manager.front``)."""
    from specon_manager.front import front_app  # noqa: PLC0415  (only a front needs it)

    if (gone := become_front()) is not None:
        print(f"specon-manager front: {gone}", file=sys.stderr)
        return 1
    if args.front_socket is None:
        print("specon-manager: --front-of needs --front-socket (both are set by --fronts)", file=sys.stderr)
        return 2
    if os.environ.get(CONFIG_ENV) != _config_digest(args, policy):
        print(
            "specon-manager front: the policy or a token file changed since the manager started; "
            "restart the manager to serve them",
            file=sys.stderr,
        )
        return 2

    extra = _reloading(tls, settings.tls_reload_interval) if tls is not None else None
    app = front_app(auth, args.front_of, policy.messaging.max_body_bytes, extra=extra)
    host, port = args.listen
    try:
        web.run_app(
            app,
            sock=[socket.socket(fileno=fd) for fd in args.front_socket],
            print=None,
            handle_signals=False,  # the front's own (``front._stop_once``)
            access_log=None,
            shutdown_timeout=settings.shutdown_timeout,
            ssl_context=tls.context if tls is not None else None,
        )
    except OSError as exc:
        print(f"specon-manager front: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _authenticator(args: argparse.Namespace) -> tuple[Authenticator, bool]:
    """Who may call, from the token options; ValueError/OSError saying what is wrong."""
    kube = args.agent_auth == "kubernetes"
    try:
        agents = load_agent_tokens(args.agent_tokens) if args.agent_tokens else None
        wants_shared = args.token_file or not (agents or kube)
        shared = read_token(args.token_file) if wants_shared else ""
        read = read_token(args.read_token_file) if args.read_token_file else ""
        operator = read_token(args.operator_token_file) if args.operator_token_file else ""
    except OSError as exc:
        raise ValueError(f"cannot read the token file: {exc}") from exc
    if shared:
        check_token_strength(shared, what="shared token")
    if args.read_token_file:
        check_token_strength(read, what="read token")
    if args.operator_token_file:
        check_token_strength(operator, what="operator token")
    if not (agents or shared or kube):
        raise ValueError("no token: pass --agent-tokens FILE, --token-file FILE or set SPECON_TOKEN")
    static = StaticTokens(agents=agents, shared=shared or None, read=read or None, operator=operator or None)
    if not kube:
        return static, bool(read)
    if missing := missing_extra("kubernetes", "kubernetes", "--agent-auth kubernetes"):
        raise ValueError(missing)
    # Imported here only: the client is heavy and only this mode needs it.
    from specon.runtime.kubernetes.backend import load_api_client  # noqa: PLC0415
    from specon_manager.auth_kubernetes import TokenReviewAuthenticator  # noqa: PLC0415

    try:
        review = TokenReviewAuthenticator(
            load_api_client(args.kubeconfig),
            audience=args.agent_auth_audience,
            service_account=args.agent_service_account,
        )
    except ValueError:
        raise
    except Exception as exc:  # the client raises several unrelated types for a bad config
        raise ValueError(f"no Kubernetes configuration for --agent-auth kubernetes: {exc}") from exc
    return Chain(static, review), bool(read)


def _pod_options(p: argparse.ArgumentParser) -> None:
    pods = p.add_argument_group("Kubernetes pod writes (docs/kubernetes.md, Who may do what)")
    pods.add_argument(
        "--manage-pods",
        action="store_true",
        help="make the writes on managed pods that Kubernetes agents ask for (POST /v1/kubernetes/pods): "
        "restore records, evictions, copies, deletions, specon's annotations, each only as this "
        "manager's decisions and the pod's node allow; take what each node's other pods request off "
        "its capacity (a watch of every pod); and record each move's end as an Event on its job's "
        "pod. The agents' own credentials then only read their namespaces' pods. Also serves the pod "
        "admission webhook (POST /v1/kubernetes/admission/pods, components/webhook)",
    )
    pods.add_argument(
        "--preferred-nodes",
        type=non_negative_int,
        default=MAX_PREFERRED,
        metavar="N",
        help=f"the admission webhook gives a new managed pod a preferred node affinity for the N nodes "
        f"Algorithm 2 ranks first (default {MAX_PREFERRED}, at most {MAX_PREFERRED}; 0: none, pods of "
        "jobs being moved are still steered)",
    )
    add_managed_pod_options(pods)


def _pod_broker(
    args: argparse.Namespace, shell: ManagerShell
) -> tuple[PodBrokerLike, NodeRequests, Extension] | None:
    """The pod broker ``--manage-pods`` asks for, the watch of every pod that says what other
    pods take of each node, and the admission webhook (``ValueError`` saying why they cannot be)."""
    if not args.manage_pods:
        return None
    if missing := missing_extra("kubernetes", "kubernetes", "--manage-pods"):
        raise ValueError(missing)
    from specon.runtime.kubernetes.api import KubeApi, load_api_client  # noqa: PLC0415
    from specon.runtime.kubernetes.others import ClusterRequests  # noqa: PLC0415
    from specon.runtime.kubernetes.pods import SharedVolume  # noqa: PLC0415
    from specon.runtime.kubernetes.writes import PodWrites  # noqa: PLC0415
    from specon_manager.admission import PodAdmission  # noqa: PLC0415
    from specon_manager.k8s_events import MigrationEvents  # noqa: PLC0415
    from specon_manager.pod_broker import PodBroker  # noqa: PLC0415

    try:
        api = KubeApi(load_api_client(args.kubeconfig))
    except Exception as exc:  # the client raises several unrelated types for a bad config
        raise ValueError(f"no Kubernetes configuration for --manage-pods: {exc}") from exc
    volume = SharedVolume(claim=args.claim, host_path=args.host_path)
    writes = PodWrites(api, selector=args.selector, volume=volume, include_owned=args.include_owned)
    requests = ClusterRequests(api, args.selector)
    requests.start()
    shell.on_migration_end = MigrationEvents(api, selector=args.selector).on_migration
    return (
        PodBroker(shell, writes),
        requests,
        PodAdmission(shell, args.selector, preferred=args.preferred_nodes),
    )


def _election_options(p: argparse.ArgumentParser) -> None:
    ha = p.add_argument_group("leader election (docs/kubernetes.md, High availability)")
    ha.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: lead only while holding a coordination.k8s.io Lease "
        "(needs --journal kubernetes); a standby serves /healthz and the status, answers /readyz 503 "
        "and refuses protocol messages with 503",
    )
    ha.add_argument(
        "--leader-elect-lease-name",
        default="specon-manager",
        help="the Lease's name (default specon-manager; the HA component's Role names it)",
    )
    ha.add_argument(
        "--leader-elect-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="the Lease's namespace (default $POD_NAMESPACE, else --journal-namespace)",
    )
    ha.add_argument(
        "--leader-elect-identity",
        help="this replica's holderIdentity, unique per process (default $POD_NAME, else the host "
        "name, plus _ and a random suffix)",
    )
    ha.add_argument(
        "--leader-elect-label-pod",
        metavar="POD",
        help="label this pod (in the Lease's namespace) specon.io/leader=true while leading, for a "
        "Service that selects the leader by it while every replica is Ready (the HA component "
        "passes $(POD_NAME))",
    )
    timing = Timing()
    for flag, field, what in (
        ("lease-duration", "lease_duration", "how long a lease lasts unrenewed before a standby takes it, "
         "whole seconds"),
        ("renew-deadline", "renew_deadline", "the leader stops leading (and exits) when it could not "
         "renew for this long; less than the lease duration"),
        ("retry-period", "retry_period", "between a standby's tries and the leader's renewals"),
    ):  # fmt: skip
        ha.add_argument(
            f"--leader-elect-{flag}",
            type=float,
            default=getattr(timing, field),
            metavar="SECONDS",
            help=f"{what} (default {getattr(timing, field):g})",
        )


def _server_tls(args: argparse.Namespace) -> ServerCertificate | None:
    """The certificate to serve HTTPS with (None: plain HTTP); ``TLSConfigError`` saying why not."""
    if (args.tls_cert is None) != (args.tls_key is None):
        raise TLSConfigError("--tls-cert and --tls-key go together: give both (HTTPS) or neither (HTTP)")
    if args.tls_cert is None:
        return None
    return ServerCertificate(args.tls_cert, args.tls_key)


def _reloading(cert: ServerCertificate, interval: float) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context that re-reads the certificate files while the app serves."""

    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(cert.watch(interval), name="specon-manager-tls-reload")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    logs.configure(level=args.log_level, fmt=args.log_format)
    try:
        policy = load_policy(args.policy) if args.policy else default_policy()
    except (PolicyError, OSError) as exc:
        print(f"specon-manager: {exc}", file=sys.stderr)
        return 2
    settings = load_settings(ManagerSettings, "specon-manager")
    if settings is None:
        return 2
    if args.dry_run:
        policy = dataclasses.replace(policy, migration=dataclasses.replace(policy.migration, dry_run=True))
    try:
        auth, guard_reads = _authenticator(args)
    except (OSError, ValueError) as exc:  # missing, unreadable, not text, weak, reused
        print(f"specon-manager: {exc}", file=sys.stderr)
        return 2
    try:
        tls = _server_tls(args)
    except TLSConfigError as exc:  # one of the pair missing, unreadable, not PEM, mismatched
        print(f"specon-manager: {exc}", file=sys.stderr)
        return 2
    if args.front_of is not None:
        return _serve_front(args, policy, settings, auth, tls)
    timing = Timing(
        args.leader_elect_lease_duration, args.leader_elect_renew_deadline, args.leader_elect_retry_period
    )
    if args.leader_elect and (problems := timing.problems()):
        print(f"specon-manager: --leader-elect: {'; '.join(problems)}", file=sys.stderr)
        return 2
    if args.leader_elect and args.journal != "kubernetes":
        print(
            "specon-manager: --leader-elect needs --journal kubernetes (the replicas share the journal "
            "in the API)",
            file=sys.stderr,
        )
        return 2
    journal: JournalStore
    if args.journal == "kubernetes":
        if missing := missing_extra("kubernetes", "kubernetes", "--journal kubernetes"):
            print(f"specon-manager: {missing}", file=sys.stderr)
            return 2
        # Imported here only: the client is heavy and only this journal needs it.
        from specon.runtime.kubernetes.backend import load_api_client  # noqa: PLC0415
        from specon_manager.k8s_crd_journal import CrdJournal  # noqa: PLC0415

        try:
            # No pod mirror: the manager may not write pods (least privilege; docs/kubernetes.md).
            journal = CrdJournal(load_api_client(args.kubeconfig), args.journal_namespace, mirror_pods=False)
            journal.marks()  # fail fast: the API is reachable and the role allows it
            journal.all()  # and the Migration resource is installed
        except Exception as exc:  # JournalError, or what the client raises for a bad config
            print(f"specon-manager: cannot use the kubernetes journal: {exc}", file=sys.stderr)
            return 2
    else:
        try:
            journal = Journal(args.state_dir / "journal.db")
        except (OSError, sqlite3.Error) as exc:  # state dir not creatable, file not a journal
            print(f"specon-manager: cannot open the journal in {args.state_dir}: {exc}", file=sys.stderr)
            return 2
    elector = leader_pod = None
    if args.leader_elect:
        from specon_manager.leader import elector_for  # noqa: PLC0415  (the kubernetes client)

        try:
            elector, journal, leader_pod = elector_for(
                journal,
                kubeconfig=args.kubeconfig,
                namespace=args.leader_elect_namespace or args.journal_namespace,
                name=args.leader_elect_lease_name,
                identity=args.leader_elect_identity,
                timing=timing,
                label_pod=args.leader_elect_label_pod,
            )
        except ValueError as exc:  # the Lease cannot be read: no API, or the Role does not allow it
            print(f"specon-manager: --leader-elect: {exc}", file=sys.stderr)
            journal.close()
            return 2
    try:
        shell = ManagerShell(
            policy=policy,
            journal=journal,
            standby=elector is not None,
            journal_retention=settings.journal_retention,
        )
    except Exception as exc:  # the journal could not be read back (a corrupt file, an API error)
        print(f"specon-manager: cannot read the journal: {exc}", file=sys.stderr)
        journal.close()
        return 2
    try:
        kube_pods = _pod_broker(args, shell)
    except ValueError as exc:
        print(f"specon-manager: {exc}", file=sys.stderr)
        journal.close()
        return 2
    broker, requests, admission = kube_pods or (None, None, None)
    app = create_app(
        shell,
        auth=auth,
        guard_reads=guard_reads,
        settings=settings,
        pod_broker=broker,
        node_requests=requests,
        extensions=[admission] if admission is not None else [],
    )
    if elector is None:
        standby.install(app, shell)  # /readyz: always ready
    else:
        from specon_manager.leader import attach  # noqa: PLC0415

        attach(app, shell, elector, registry=app[METRICS].registry, pod=leader_pod)
    host, port = args.listen
    if tls is not None:
        app[METRICS].registry.register(ReloadCollector(tls))
        app.cleanup_ctx.append(_reloading(tls, settings.tls_reload_interval))
    elif not is_loopback(host):
        # Allowed (a trusted network, or TLS ended by a proxy in front), but worth a line.
        log.warning("specon.manager.plain_http", host=host, hint="agents' tokens cross the network in clear")
    log.info(
        "specon.manager.starting",
        host=host,
        port=port,
        tls=tls is not None,
        fronts=args.fronts,
        mode=policy.mode,
        dry_run=policy.migration.dry_run,
        journal=str(journal.path),
    )
    # With fronts, they serve the address and this process a Unix socket only they reach.
    served = {"host": host, "port": port, "ssl_context": tls.context if tls is not None else None}
    fronts = None
    if args.fronts:
        try:
            listening = Listening(host, port, args.fronts)
        except OSError as exc:
            print(f"specon-manager: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
            journal.close()
            return 1
        path, fronts = serve_fronts(
            app,
            listening,
            argv,
            socket_dir(),
            config=_config_digest(args, policy),
            grace=settings.shutdown_timeout,
        )
        served = {"path": path}
    try:
        web.run_app(
            app,
            print=None,
            handle_signals=True,
            access_log=None,
            shutdown_timeout=settings.shutdown_timeout,
            **served,
        )
    except OSError as exc:  # e.g. the address is in use
        print(f"specon-manager: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    finally:
        journal.close()
        log.info("specon.manager.stopped")
    # Leadership lost, or fronts that would not stay up: a non-zero exit, so Kubernetes or
    # systemd restarts it.
    return 1 if (elector is not None and elector.lost) or (fronts is not None and fronts.failed) else 0


if __name__ == "__main__":
    sys.exit(main())
